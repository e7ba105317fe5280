#pragma once
// Elementwise and layout kernels on the CPU: activations, dropout, copies, channel slices.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "replica/backend/cpu/context.hpp"
#include "replica/core/fixed_point.hpp"
#include "replica/core/rng.hpp"

namespace replica::backend::cpu {

inline void relu_forward(const Context&, const float* x, float* y, std::size_t count)
{
    for (std::size_t i = 0; i < count; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

inline void relu_backward(const Context&, const float* y, const float* dy, float* dx, std::size_t count)
{
    for (std::size_t i = 0; i < count; ++i) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

inline void sigmoid_forward(const Context&, const float* x, float* y, std::size_t count)
{
    for (std::size_t i = 0; i < count; ++i) y[i] = 1.0f / (1.0f + std::exp(-x[i]));
}

inline void sigmoid_backward(const Context&, const float* y, const float* dy, float* dx, std::size_t count)
{
    for (std::size_t i = 0; i < count; ++i) dx[i] = dy[i] * y[i] * (1.0f - y[i]);
}

inline void tanh_forward(const Context&, const float* x, float* y, std::size_t count)
{
    for (std::size_t i = 0; i < count; ++i) y[i] = std::tanh(x[i]);
}

inline void tanh_backward(const Context&, const float* y, const float* dy, float* dx, std::size_t count)
{
    for (std::size_t i = 0; i < count; ++i) dx[i] = dy[i] * (1.0f - y[i] * y[i]);
}

// GELU, the exact form: y = 0.5 x (1 + erf(x / sqrt 2)); dy/dx = Phi(x) + x phi(x).
inline void gelu_forward(const Context&, const float* x, float* y, std::size_t count)
{
    for (std::size_t i = 0; i < count; ++i) y[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * 0.70710678118654752f));
}

inline void gelu_backward(const Context&, const float* x, const float* dy, float* dx, std::size_t count)
{
    constexpr float inv_sqrt_2pi = 0.39894228040143268f;
    for (std::size_t i = 0; i < count; ++i) {
        const float v = x[i];
        const float cdf = 0.5f * (1.0f + std::erf(v * 0.70710678118654752f));
        dx[i] = dy[i] * (cdf + v * inv_sqrt_2pi * std::exp(-0.5f * v * v));
    }
}

// Inverted dropout over n samples of `size` elements: element e of global sample first_sample + s is
// kept when its random number (seed, dropout, layer, sample, e) is >= p, and scaled by 1 / (1 - p).
// `dx = mask * dy` uses the same rule, so nothing is stored between forward and backward.
inline void dropout_apply(const Context&, float p, std::uint64_t seed, std::uint32_t layer,
                          std::uint64_t first_sample, const float* x, float* y, std::size_t n, std::size_t size)
{
    const float scale = 1.0f / (1.0f - p);
    for (std::size_t s = 0; s < n; ++s)
        for (std::size_t e = 0; e < size; ++e) {
            const float u = core::random_uniform(seed, core::Stream::dropout, layer, first_sample + s,
                                                 std::uint32_t(e));
            y[s * size + e] = u >= p ? x[s * size + e] * scale : 0.0f;
        }
}

inline void copy(const Context&, const float* src, float* dst, std::size_t count)
{
    if (count != 0 && src != dst) std::memcpy(dst, src, count * sizeof(float));
}

inline void fill(const Context&, float* dst, float value, std::size_t count)
{
    for (std::size_t i = 0; i < count; ++i) dst[i] = value;
}

// dst += src
inline void add(const Context&, const float* src, float* dst, std::size_t count)
{
    for (std::size_t i = 0; i < count; ++i) dst[i] += src[i];
}

// y = a + b, then max(y, 0) when relu (a residual block's merge).
inline void add_into(const Context&, const float* a, const float* b, float* y, std::size_t count, bool relu)
{
    for (std::size_t i = 0; i < count; ++i) {
        const float v = a[i] + b[i];
        y[i] = relu && v < 0.0f ? 0.0f : v;
    }
}

// The reproducible mode's exact sums (core/fixed_point.hpp). Out-of-range terms throw at once, so
// there is nothing left for check_fixed to report.
inline void add_fixed(const Context&, const float* g, std::int64_t* acc, std::size_t count) { core::add_fixed(g, acc, count); }
inline void fixed_to_float(const Context&, const std::int64_t* acc, float* g, std::size_t count)
{
    core::fixed_to_float(acc, g, count);
}
inline void zero_fixed(const Context&, std::int64_t* acc, std::size_t count) { std::memset(acc, 0, count * sizeof(std::int64_t)); }
inline void check_fixed(const Context&) {}
// CPU kernels are deterministic already (BLAS thread counts are the caller's business).
inline void make_deterministic(const Context&) {}

// Channel slices of (n, channels, pixels) tensors, for Concat: dst[:, offset:offset+c] = src (n, c, pixels)
inline void copy_channels_in(const Context&, const float* src, std::size_t n, std::size_t c,
                             std::size_t pixels, float* dst, std::size_t channels, std::size_t offset)
{
    for (std::size_t s = 0; s < n; ++s)
        std::memcpy(dst + (s * channels + offset) * pixels, src + s * c * pixels, sizeof(float) * c * pixels);
}

// dst (n, c, pixels) = src[:, offset:offset+c]
inline void copy_channels_out(const Context&, const float* src, std::size_t channels, std::size_t offset,
                              std::size_t n, std::size_t c, std::size_t pixels, float* dst)
{
    for (std::size_t s = 0; s < n; ++s)
        std::memcpy(dst + s * c * pixels, src + (s * channels + offset) * pixels, sizeof(float) * c * pixels);
}

} // namespace replica::backend::cpu
