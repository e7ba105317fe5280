#pragma once
// Helpers shared by the test files.

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "replica/backend/cpu/context.hpp"
#include "replica/core/error.hpp"

namespace replica::testing {

// A file's bytes as Byte (char or unsigned char); none where it cannot be read.
template <class Byte = unsigned char>
std::vector<Byte> file_bytes(const std::filesystem::path& file)
{
    std::ifstream in(file, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Writes `bytes` to `file` (its folder made where missing), replacing it; throws where the write
// fails (the test case then fails).
template <class Byte>
    requires(sizeof(Byte) == 1)
void write_bytes(const std::filesystem::path& file, const std::vector<Byte>& bytes)
{
    if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    if (!out.good()) throw std::runtime_error("could not write " + file.string());
}
// The same for a braced list of bytes ({0, 0, 8}, {'a', 'b'}).
inline void write_bytes(const std::filesystem::path& file, const std::vector<unsigned char>& bytes)
{
    write_bytes<unsigned char>(file, bytes);
}

// A fresh folder under the system's temporary directory, removed with everything in it at the end.
class TempDir {
public:
    TempDir()
    {
        static std::atomic<int> made{0};
        const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
        path_ = std::filesystem::temp_directory_path() /
                ("replica_test_" + std::to_string(::getpid()) + "_" + std::to_string(now) + "_" + std::to_string(made++));
        std::filesystem::create_directories(path_);
    }
    ~TempDir()
    {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;

    std::filesystem::path operator/(const std::string& name) const { return path_ / name; }
    const std::filesystem::path& path() const { return path_; }

private:
    std::filesystem::path path_;
};

// The message of the replica::Error that f() throws, or "no error".
template <class F>
std::string error_message(F&& f)
{
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "no error";
}

// "" when a and b hold the same floats bit for bit; otherwise how they differ, in one line (Catch
// would print every element of a parameter vector: megabytes, and minutes, for LeNet).
inline std::string differences(const std::vector<float>& a, const std::vector<float>& b)
{
    if (a.size() != b.size()) return "sizes " + std::to_string(a.size()) + " and " + std::to_string(b.size());
    std::size_t count = 0, first = 0;
    double largest = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        if (std::bit_cast<std::uint32_t>(a[i]) == std::bit_cast<std::uint32_t>(b[i])) continue;
        if (count++ == 0) first = i;
        largest = std::max(largest, std::abs(double(a[i]) - double(b[i])));
    }
    if (count == 0) return "";
    return std::to_string(count) + " of " + std::to_string(a.size()) + " differ, first at " + std::to_string(first) +
           " (" + std::to_string(a[first]) + " vs " + std::to_string(b[first]) + "), largest difference " +
           std::to_string(largest);
}

// ||a - b|| / ||a|| over whole vectors (parameters, outputs).
inline double norm_relative(const std::vector<float>& a, const std::vector<float>& b)
{
    double diff = 0.0, norm = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        diff += (double(a[i]) - double(b[i])) * (double(a[i]) - double(b[i]));
        norm += double(a[i]) * double(a[i]);
    }
    return std::sqrt(diff / norm);
}

// How far parameters w are from `expected`, as a fraction of expected's change from `initial`
// (2-norms): ||w - expected|| / ||expected - initial||.
inline double update_error(const std::vector<float>& w, const std::vector<float>& expected, const std::vector<float>& initial)
{
    double off = 0.0, moved = 0.0;
    for (std::size_t i = 0; i < w.size(); ++i) {
        off += (double(w[i]) - expected[i]) * (double(w[i]) - expected[i]);
        moved += (double(expected[i]) - initial[i]) * (double(expected[i]) - initial[i]);
    }
    return std::sqrt(off / moved);
}

// While it lives, the CPU's float convolutions take `path` (backend/cpu/context.hpp); the setting
// before comes back after.
class ConvPathScope {
public:
    explicit ConvPathScope(backend::cpu::ConvPath path) : before_(backend::cpu::conv_path())
    {
        backend::cpu::set_conv_path(path);
    }
    ~ConvPathScope() { backend::cpu::set_conv_path(before_); }
    ConvPathScope(const ConvPathScope&) = delete;
    ConvPathScope& operator=(const ConvPathScope&) = delete;

private:
    backend::cpu::ConvPath before_;
};

// Each code a CPU convolution can take in this build: im2col, and oneDNN where the build has it.
inline std::vector<backend::cpu::ConvPath> conv_paths()
{
    if (backend::cpu::has_onednn) return {backend::cpu::ConvPath::blas, backend::cpu::ConvPath::onednn};
    return {backend::cpu::ConvPath::blas};
}
inline const char* conv_path_name(backend::cpu::ConvPath path)
{
    using backend::cpu::ConvPath;
    return path == ConvPath::blas ? "im2col" : path == ConvPath::onednn ? "oneDNN" : path == ConvPath::timed ? "timed" : "auto";
}

} // namespace replica::testing
