#pragma once
// Helpers shared by the CUDA test files (built by nvcc only): options set for a scope, the GPU check
// that skips a [cuda] case on a machine without one, and the error measure the backends are compared by.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <ostream>
#include <sstream>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "replica/backend/backend.hpp"
#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/options.hpp"

namespace replica::testing {

// Sets one of cuda::default_options() for the contexts made in its scope; restores it at the end.
template <class T>
class OptionScope {
public:
    OptionScope(T backend::cuda::Options::*field, T value)
        : field_(field), old_(std::exchange(backend::cuda::default_options().*field, value))
    {
    }
    ~OptionScope() { backend::cuda::default_options().*field_ = old_; }
    OptionScope(const OptionScope&) = delete;
    OptionScope& operator=(const OptionScope&) = delete;

private:
    T backend::cuda::Options::*field_;
    T old_;
};

// For the contexts made in its scope: algorithms timed (Options::benchmark), each pass of a
// convolution by the faster way (ConvPath::timed), and the choices logged to `out`.
struct LoggedTimedChoices {
    std::ostringstream out;
    OptionScope<bool> timed{&backend::cuda::Options::benchmark, true};
    OptionScope<backend::cuda::ConvPath> per_pass{&backend::cuda::Options::conv_path, backend::cuda::ConvPath::timed};
    OptionScope<std::ostream*> log{&backend::cuda::Options::log, &out};
};

// v (n planes of a x b values) with each plane transposed (b x a).
template <class V>
std::vector<V> transpose_planes(const std::vector<V>& v, std::size_t n, std::size_t a, std::size_t b)
{
    std::vector<V> out(v.size());
    for (std::size_t s = 0; s < n; ++s)
        for (std::size_t i = 0; i < a; ++i)
            for (std::size_t j = 0; j < b; ++j) out[(s * b + j) * a + i] = v[(s * a + i) * b + j];
    return out;
}
// v (n samples of (c, pixels)) as activations channels-last, (pixels, c) a sample
// (backend/cuda/layout.hpp); to_channels_first undoes it.
template <class V>
std::vector<V> to_channels_last(const std::vector<V>& v, std::size_t n, std::size_t c, std::size_t pixels)
{
    return transpose_planes(v, n, c, pixels);
}
template <class V>
std::vector<V> to_channels_first(const std::vector<V>& v, std::size_t n, std::size_t c, std::size_t pixels)
{
    return transpose_planes(v, n, pixels, c);
}

// A context on GPU 0 whose 16-bit activations are channels-last or not (Options::channels_last).
inline backend::cuda::Context gpu_context(bool channels_last)
{
    const OptionScope<bool> layout{&backend::cuda::Options::channels_last, channels_last};
    return backend::cuda::Context{Device::cuda(0)};
}

// Whether this machine has a GPU; the first call turns TF32 off for the contexts made after it (the
// backends are compared in FP32), and the tuning cache (each test times what it checks, and writes
// nothing to the user's cache folder; the tuning cache's own test turns it on).
inline bool have_gpu()
{
    static const bool yes = [] {
        backend::cuda::default_options().allow_tf32 = false;
        backend::cuda::default_options().tuning_cache = false;
        return !cuda_devices().empty();
    }();
    return yes;
}
#define REQUIRE_GPU()                                                                 \
    do {                                                                              \
        if (!::replica::testing::have_gpu())                                          \
            REPLICA_SKIP("no GPU on this machine: [cuda] test skipped");              \
    } while (0)

// max |a - b| / (max |a| + tiny): error relative to the result's magnitude.
inline double relative_error(const std::vector<float>& a, const std::vector<float>& b)
{
    double diff = 0.0, mag = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        diff = std::max(diff, std::abs(double(a[i]) - double(b[i])));
        mag = std::max(mag, std::abs(double(a[i])));
    }
    return diff / (mag + 1e-12);
}

} // namespace replica::testing
