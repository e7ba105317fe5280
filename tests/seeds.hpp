#pragma once
// The seeds of the random tests. A test draws its random inputs from test_seed(): a fixed value made
// from the test case's name, so that every run of the suite draws the same inputs, or the value of
// REPLICA_TEST_SEED where it is set (the same seed then in every test). scripts/soak runs the random
// tests on many seeds that way. A test states its seed with the command that reruns it:
//   INFO(testing::rerun(seed));

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

#include "catch.hpp"

namespace replica::testing {

inline std::uint64_t test_seed()
{
    if (const char* s = std::getenv("REPLICA_TEST_SEED"); s != nullptr && *s != '\0') {
        char* end = nullptr;
        const std::uint64_t seed = std::strtoull(s, &end, 0);
        if (*end != '\0') throw std::invalid_argument(std::string("REPLICA_TEST_SEED='") + s + "' is not a number");
        return seed;
    }
    // FNV-1a of the test case's name.
    std::uint64_t h = 14695981039346656037ull;
    for (const unsigned char c : Catch::getResultCapture().getCurrentTestName()) h = (h ^ c) * 1099511628211ull;
    return h;
}

// "seed S: REPLICA_TEST_SEED=S <this program> '<this test case>' reruns it", the name escaped for
// Catch's test specs (a comma separates two) and quoted for the shell.
inline std::string rerun(std::uint64_t seed)
{
    std::error_code ec;
    std::string program = std::filesystem::read_symlink("/proc/self/exe", ec).string();
    if (ec) program = "<test program>";
    std::string name;
    for (const char c : Catch::getResultCapture().getCurrentTestName()) {
        if (c == '\'') name += "'\\''";
        else {
            if (c == ',' || c == '[' || c == ']' || c == '\\' || c == '*' || c == '~' || c == '"') name += '\\';
            name += c;
        }
    }
    return "seed " + std::to_string(seed) + ": REPLICA_TEST_SEED=" + std::to_string(seed) + " " + program + " '" + name +
           "' reruns it";
}

} // namespace replica::testing
