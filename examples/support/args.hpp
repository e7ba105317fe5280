#pragma once
// Command-line flags for the examples and benchmarks: --name value, --flag, --help.
// Unknown flags and malformed values are errors that list what is accepted.

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "replica/core/error.hpp"

namespace replica::examples {

class Args {
public:
    struct Flag {
        std::string value;   // default, as text
        std::string help;
        bool is_switch = false;
    };

    Args(std::string program, std::string about) : program_(std::move(program)), about_(std::move(about)) {}

    Args& option(const std::string& name, std::string default_value, std::string help)
    {
        order_.push_back(name);
        flags_[name] = {std::move(default_value), std::move(help), false};
        return *this;
    }
    Args& flag(const std::string& name, std::string help)
    {
        order_.push_back(name);
        flags_[name] = {"0", std::move(help), true};
        return *this;
    }

    // Exits with the usage on --help; throws Error on a bad flag.
    void parse(int argc, char** argv)
    {
        for (int i = 1; i < argc; ++i) {
            std::string a = argv[i];
            if (a == "--help" || a == "-h") {
                usage();
                std::exit(0);
            }
            core::require(a.rfind("--", 0) == 0, "unexpected argument '" + a + "': flags start with -- (see --help)");
            std::string name = a.substr(2), value;
            if (auto eq = name.find('='); eq != std::string::npos) {
                value = name.substr(eq + 1);
                name = name.substr(0, eq);
            }
            auto it = flags_.find(name);
            core::require(it != flags_.end(), "unknown flag --" + name + " (see --help)");
            if (it->second.is_switch) {
                it->second.value = "1";
                continue;
            }
            if (value.empty()) {
                core::require(i + 1 < argc, "--" + name + " needs a value (see --help)");
                value = argv[++i];
            }
            it->second.value = value;
        }
    }

    std::string str(const std::string& name) const { return flags_.at(name).value; }
    bool on(const std::string& name) const { return flags_.at(name).value == "1"; }
    long long integer(const std::string& name) const
    {
        const std::string& v = str(name);
        char* end = nullptr;
        long long x = std::strtoll(v.c_str(), &end, 10);
        core::require(!v.empty() && *end == '\0', "--" + name + " must be an integer, got '" + v + "'");
        return x;
    }
    std::size_t count(const std::string& name) const
    {
        long long x = integer(name);
        core::require(x >= 0, "--" + name + " must be >= 0, got " + str(name));
        return std::size_t(x);
    }
    double real(const std::string& name) const
    {
        const std::string& v = str(name);
        char* end = nullptr;
        double x = std::strtod(v.c_str(), &end);
        core::require(!v.empty() && *end == '\0', "--" + name + " must be a number, got '" + v + "'");
        return x;
    }

    void usage() const
    {
        std::printf("%s: %s\n\nflags:\n", program_.c_str(), about_.c_str());
        for (const auto& n : order_) {
            const Flag& f = flags_.at(n);
            if (f.is_switch) std::printf("  --%-18s %s\n", n.c_str(), f.help.c_str());
            else std::printf("  --%-18s %s (default: %s)\n", (n + " X").c_str(), f.help.c_str(), f.value.c_str());
        }
    }

private:
    std::string program_, about_;
    std::vector<std::string> order_;
    std::map<std::string, Flag> flags_;
};

} // namespace replica::examples
