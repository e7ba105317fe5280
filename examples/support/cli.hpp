#pragma once
// Command lines of the examples and the benchmark, with CLI11 (Debian's libcli11-dev): every option
// declares its type, range or choices, and every refusal says what was wrong and what to do.
//
//   CLI::App app{"train LeNet on Fashion-MNIST"};
//   std::size_t epochs = 8;
//   examples::count_option(app, "--epochs", epochs, "passes over the training images", 1, 100000);
//   examples::DeviceFlags dev;  dev.add(app);
//   if (int code = examples::parse(app, argc, argv)) return code - 1;   // --help: 0, an error: 2
//
// The flags shared by several programs (devices, dispatch, scaling, reproducible mode) are added by
// the functions below, so that they read and check the same everywhere.
//
// Device lists: "all", or comma-separated cpu:N and cuda:N, each once, no empty items. A CPU index
// must be below this machine's hardware threads (each CPU replica is meant to own a core; more
// replicas than threads only share them); a CUDA index must name a visible GPU.

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "replica/backend/backend.hpp"
#include "replica/core/checked.hpp"
#include "replica/core/device.hpp"
#include "replica/core/error.hpp"
#include "replica/parallel/auto_parallel.hpp"
#include "replica/parallel/scaling.hpp"

namespace replica::examples {

// CLI11 gives an option its value even when the next argument is another option ("--checkpoint
// --resume" would make "--resume" the path). Every validator here refuses such a value by this message.
inline std::string option_as_value(const std::string& text)
{
    if (text.size() > 2 && text[0] == '-' && text[1] == '-')
        return "got the option " + text + " where a value was expected: give this option a value";
    return {};
}

// A validator for whole numbers in [min, max], written in decimal digits only: "-1", "", "1e3",
// "0x10" and "010" are refused (CLI11 alone would wrap "-1" around and read "010" as octal).
inline CLI::Validator whole_number(std::uint64_t min, std::uint64_t max)
{
    const std::string range = std::to_string(min) + " to " + std::to_string(max);
    return CLI::Validator(
        [min, max, range](std::string& text) -> std::string {
            if (std::string option = option_as_value(text); !option.empty()) return option;
            const bool digits = !text.empty() && text.size() <= 20 &&
                                std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
                                (text.size() == 1 || text[0] != '0');
            std::uint64_t value = 0;
            bool fits = digits;
            for (char c : text) {
                if (!fits) break;
                fits = !__builtin_mul_overflow(value, std::uint64_t{10}, &value) &&
                       !__builtin_add_overflow(value, std::uint64_t(c - '0'), &value);
            }
            if (!fits || value < min || value > max)
                return "'" + text + "' is not a whole number from " + range + "; give one in that range";
            return {};
        },
        "UINT in [" + range + "]", "whole_number");
}

// A real number in [min, max] (finite).
inline CLI::Validator real_number(double min, double max)
{
    return CLI::Validator(
        [min, max](std::string& text) -> std::string {
            if (std::string option = option_as_value(text); !option.empty()) return option;
            double value = 0.0;
            if (text.empty() || !CLI::detail::lexical_cast(text, value) || !(value >= min && value <= max))
                return "'" + text + "' is not a number from " + std::to_string(min) + " to " + std::to_string(max) +
                       "; give one in that range";
            return {};
        },
        "FLOAT in [" + std::to_string(min) + ", " + std::to_string(max) + "]", "real_number");
}

// Refuses an empty value ("--checkpoint=" or "--checkpoint ''") and an option taken for a value.
inline const CLI::Validator not_empty(
    [](std::string& text) -> std::string {
        return text.empty() ? "an empty value is not allowed; give one" : option_as_value(text);
    },
    "TEXT", "not_empty");

template <class T>
CLI::Option* count_option(CLI::App& app, const std::string& name, T& value, const std::string& help,
                          std::uint64_t min, std::uint64_t max)
{
    return app.add_option(name, value, help)->check(whole_number(min, max))->capture_default_str();
}

inline CLI::Option* real_option(CLI::App& app, const std::string& name, float& value, const std::string& help,
                                double min, double max)
{
    return app.add_option(name, value, help)->check(real_number(min, max))->capture_default_str();
}

// The devices a list names, checked against this machine (see the file comment). Throws Error.
inline std::vector<Device> checked_devices(const std::string& list)
{
    core::require(!list.empty(), "--devices is empty: give all, or a list such as cpu:0,cpu:1 or cuda:0");
    std::vector<Device> out;
    std::size_t begin = 0;
    for (;;) {
        const std::size_t comma = std::min(list.find(',', begin), list.size());
        const std::string item = list.substr(begin, comma - begin);
        core::require(!item.empty(), "--devices '" + list + "' has an empty item (two commas, or one at an end): "
                                     "write the devices separated by single commas, as in cpu:0,cpu:1");
        const Device d = Device::parse(item);
        if (d.is_cpu()) {
            const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
            core::require(unsigned(d.index()) < threads,
                          "--devices: " + item + " is beyond this machine's " + std::to_string(threads) +
                              " hardware threads: use cpu:0 to cpu:" + std::to_string(threads - 1) +
                              " (one CPU replica per thread)");
        } else {
            const std::size_t gpus = cuda_devices().size();
            core::require(std::size_t(d.index()) < gpus,
                          "--devices: " + item + (gpus == 0 ? " names a GPU, but none is visible to this program "
                                                              "(or it was built without CUDA: use the _cuda build); "
                                                              "use cpu:N"
                                                            : " is beyond the " + std::to_string(gpus) +
                                                                  " visible GPUs: use cuda:0 to cuda:" +
                                                                  std::to_string(gpus - 1)));
        }
        core::require(std::find(out.begin(), out.end(), d) == out.end(),
                      "--devices names " + item + " twice: name each device once");
        out.push_back(d);
        if (comma == list.size()) break;
        begin = comma + 1;
    }
    return out;
}

// Checks a --devices value as checked_devices does; "all" passes when `allow_all`.
inline CLI::Validator devices_validator(bool allow_all)
{
    return CLI::Validator(
        [allow_all](std::string& text) -> std::string {
            if (allow_all && text == "all") return {};
            if (std::string option = option_as_value(text); !option.empty()) return option;
            try {
                checked_devices(text);
            } catch (const Error& e) {
                return e.what();
            }
            return {};
        },
        allow_all ? "all|LIST" : "LIST", "devices");
}

// --devices, --dispatch, --scaling, --gradient-reduction: the flags every program that trains shares.
struct DeviceFlags {
    std::string devices = "all";
    std::string dispatch = "auto";
    std::string scaling = "strong";
    std::string gradient_reduction = "fp32";

    // `all_help` says what "all" means for this program.
    void add(CLI::App& app, const std::string& all_help, std::vector<std::string> dispatch_choices)
    {
        app.add_option("--devices", devices, all_help + ", or a list such as cpu:0,cpu:1 or cuda:0,cuda:1 "
                                             "(under mpirun each process takes its share)")
            ->check(devices_validator(true))
            ->capture_default_str();
        app.add_option("--dispatch", dispatch, "how replicas' work is issued: single (one thread), threaded (a "
                                               "thread per replica) or auto (time each choice, keep the fastest)")
            ->check(CLI::IsMember(std::move(dispatch_choices)))
            ->capture_default_str();
        app.add_option("--scaling", scaling, "strong: the batch size is global; weak: it is per device")
            ->check(CLI::IsMember({"strong", "weak"}))
            ->capture_default_str();
        app.add_option("--gradient-reduction", gradient_reduction,
                       "how the all-reduce carries gradients between replicas: fp32, or bf16 (half the bytes, "
                       "rounded to 8 significant bits; not with --reproducible)")
            ->check(CLI::IsMember({"fp32", "bf16"}))
            ->capture_default_str();
    }

    // `fallback` is what "all" means.
    std::vector<Device> device_list(const std::vector<Device>& fallback) const
    {
        return devices == "all" ? fallback : checked_devices(devices);
    }
    parallel::Scaling scaling_choice() const { return parallel::parse_scaling(scaling); }
    parallel::DispatchChoice dispatch_choice() const { return parallel::parse_dispatch(dispatch); }
    parallel::GradientReduction gradient_reduction_choice() const
    {
        return gradient_reduction == "bf16" ? parallel::GradientReduction::bf16 : parallel::GradientReduction::fp32;
    }
};

// --memory-budget: the bytes each device may hold for the model (AutoOptions::memory_budget), written
// as a whole number of bytes or with a binary suffix K, M, G or T (512M, 8G); 0, the default: no limit.
struct MemoryFlag {
    std::string budget = "0";

    void add(CLI::App& app)
    {
        app.add_option("--memory-budget", budget,
                       "bytes each device may hold for the model, as 512M or 8G (0: no limit); auto_parallel then "
                       "takes the first of data, ZeRO-1, tensor and pipeline parallelism that fits")
            ->check(CLI::Validator(
                [](std::string& text) -> std::string {
                    if (std::string option = option_as_value(text); !option.empty()) return option;
                    std::size_t bytes = 0;
                    return parse(text, bytes) ? std::string{}
                                              : "'" + text + "' is not a size: write a whole number of bytes, or one "
                                                "with K, M, G or T (binary: 512M is 512 x 2^20), or 0 for no limit";
                },
                "SIZE", "size"))
            ->capture_default_str();
    }
    std::size_t bytes() const
    {
        std::size_t b = 0;
        parse(budget, b);
        return b;
    }

private:
    static bool parse(const std::string& text, std::size_t& bytes)
    {
        std::size_t digits = 0;
        while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
        if (digits == 0 || digits > 19 || (digits > 1 && text[0] == '0')) return false;
        const std::string suffix = text.substr(digits);
        int shift = 0;
        if (suffix == "K") shift = 10;
        else if (suffix == "M") shift = 20;
        else if (suffix == "G") shift = 30;
        else if (suffix == "T") shift = 40;
        else if (!suffix.empty()) return false;
        const std::uint64_t value = std::stoull(text.substr(0, digits));
        if (shift > 0 && value > (std::numeric_limits<std::uint64_t>::max() >> shift)) return false;
        bytes = std::size_t(value << shift);
        return true;
    }
};

// --reproducible and --micro-shard.
struct ReproducibleFlags {
    bool reproducible = false;
    std::size_t micro_shard = 0;   // not given: StepOptions' default micro-shard

    void add(CLI::App& app)
    {
        app.add_flag("--reproducible", reproducible, "bit-identical results on any number of devices and across runs");
        app.add_option("--micro-shard", micro_shard,
                       "samples per micro-shard with --reproducible (default: the batch cut into 8 shards)")
            ->check(whole_number(1, 1u << 20));
    }
};

// The global batch (batch size, times the devices under weak scaling), refused (Error) when it
// overflows or exceeds the `samples` of the data set.
inline std::size_t checked_global_batch(std::size_t batch_size, std::size_t devices, parallel::Scaling scaling,
                                        std::size_t samples)
{
    const bool weak = scaling == parallel::Scaling::weak;
    const std::size_t global =
        weak ? core::checked_mul(batch_size, devices, "--batch-size x devices (weak scaling)") : batch_size;
    core::require(global <= samples,
                  "--batch-size " + std::to_string(batch_size) + (weak ? " per device (global " + std::to_string(global) + ")" : "") +
                      " is larger than the " + std::to_string(samples) + " training samples: use --batch-size " +
                      std::to_string(weak ? samples / std::max<std::size_t>(devices, 1) : samples) + " or less");
    return global;
}

// Parses the command line. Returns 0 to go on, 1 after --help (exit 0), 3 after an error, which it
// has printed with what to do (exit 2): `if (int code = parse(...)) return code - 1;`.
inline int parse(CLI::App& app, int argc, char** argv)
{
    try {
        app.parse(argc, argv);
        return 0;
    } catch (const CLI::CallForHelp& e) {
        app.exit(e);
        return 1;
    } catch (const CLI::ParseError& e) {
        std::fprintf(stderr, "error: %s\nrun %s --help for the options and the values they accept\n", e.what(),
                     app.get_name().c_str());
        return 3;
    }
}

} // namespace replica::examples
