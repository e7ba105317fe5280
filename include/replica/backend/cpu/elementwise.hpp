#pragma once
// Elementwise and layout kernels on the CPU: activations, dropout, copies, channel slices.
//
// Activations and their gradients are any core::Storage type T (float, bf16, fp16), deduced from the
// pointers. Each value is loaded with to_float, computed in float exactly as for float, and stored
// with from_float<T>: a bf16/fp16 result is round_through<T> of the float result on the same inputs.
// The reproducible mode's fixed-point sums take parameter gradients, which are always float.

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "replica/backend/cpu/context.hpp"
#include "replica/backend/cpu/ops.hpp"
#include "replica/backend/cpu/threads.hpp"
#include "replica/backend/cpu/vectorized.hpp"
#include "replica/core/config.hpp"
#include "replica/core/fixed_point.hpp"
#include "replica/core/number.hpp"
#include "replica/core/rng.hpp"

namespace REPLICA_NAMESPACE::backend::cpu {

namespace detail {
// y[i] = f(x[i]) and dx[i] = f(a[i], dy[i]), computed in float.
template <core::Storage T, class F>
void map1(const T* x, T* y, std::size_t count, F f)
{
    parallel_values(count, [&](std::size_t begin, std::size_t end) {
        vectorized([&] {
            for (std::size_t i = begin; i < end; ++i) y[i] = core::from_float<T>(f(core::to_float(x[i])));
        });
    });
}
template <core::Storage T, class F>
void map2(const T* a, const T* dy, T* dx, std::size_t count, F f)
{
    parallel_values(count, [&](std::size_t begin, std::size_t end) {
        vectorized([&] {
            for (std::size_t i = begin; i < end; ++i)
                dx[i] = core::from_float<T>(f(core::to_float(a[i]), core::to_float(dy[i])));
        });
    });
}
} // namespace detail

template <core::Storage T>
void relu_forward(const Context&, const T* x, T* y, std::size_t count)
{
    detail::map1(x, y, count, [](float v) { return v > 0.0f ? v : 0.0f; });
}

template <core::Storage T>
void relu_backward(const Context&, const T* y, const T* dy, T* dx, std::size_t count)
{
    detail::map2(y, dy, dx, count, [](float v, float d) { return v > 0.0f ? d : 0.0f; });
}

template <core::Storage T>
void sigmoid_forward(const Context&, const T* x, T* y, std::size_t count)
{
    detail::map1(x, y, count, [](float v) { return 1.0f / (1.0f + std::exp(-v)); });
}

template <core::Storage T>
void sigmoid_backward(const Context&, const T* y, const T* dy, T* dx, std::size_t count)
{
    detail::map2(y, dy, dx, count, [](float v, float d) { return d * v * (1.0f - v); });
}

template <core::Storage T>
void tanh_forward(const Context&, const T* x, T* y, std::size_t count)
{
    detail::map1(x, y, count, [](float v) { return std::tanh(v); });
}

template <core::Storage T>
void tanh_backward(const Context&, const T* y, const T* dy, T* dx, std::size_t count)
{
    detail::map2(y, dy, dx, count, [](float v, float d) { return d * (1.0f - v * v); });
}

// GELU, the exact form: y = 0.5 x (1 + erf(x / sqrt 2)); dy/dx = Phi(x) + x phi(x).
template <core::Storage T>
void gelu_forward(const Context&, const T* x, T* y, std::size_t count)
{
    detail::map1(x, y, count, [](float v) { return 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f)); });
}

template <core::Storage T>
void gelu_backward(const Context&, const T* x, const T* dy, T* dx, std::size_t count)
{
    detail::map2(x, dy, dx, count, [](float v, float d) {
        constexpr float inv_sqrt_2pi = 0.39894228040143268f;
        const float cdf = 0.5f * (1.0f + std::erf(v * 0.70710678118654752f));
        return d * (cdf + v * inv_sqrt_2pi * std::exp(-0.5f * v * v));
    });
}

// GELU, the tanh form: y = 0.5 x (1 + tanh(u)), u = sqrt(2 / pi) (x + 0.044715 x^3);
// dy/dx = 0.5 (1 + tanh(u)) + 0.5 x (1 - tanh(u)^2) sqrt(2 / pi) (1 + 3 * 0.044715 x^2). tanh is
// ops.hpp's tanh_approx, whose loops vectorise.
template <core::Storage T>
void gelu_tanh_forward(const Context&, const T* x, T* y, std::size_t count)
{
    detail::map1(x, y, count, [](float v) {
        return 0.5f * v * (1.0f + tanh_approx(0.79788456080286536f * (v + 0.044715f * v * v * v)));
    });
}

template <core::Storage T>
void gelu_tanh_backward(const Context&, const T* x, const T* dy, T* dx, std::size_t count)
{
    detail::map2(x, dy, dx, count, [](float v, float d) {
        const float t = tanh_approx(0.79788456080286536f * (v + 0.044715f * v * v * v));
        return d * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * 0.79788456080286536f * (1.0f + 0.134145f * v * v));
    });
}

// Inverted dropout over n samples of `size` elements: element e of global sample first_sample + s is
// kept when its random number (seed, dropout, layer, sample, e) is >= p, and scaled by 1 / (1 - p).
// `dx = mask * dy` uses the same rule, so nothing is stored between forward and backward. `channels`
// (of a sample's (channels, pixels)) matters only to a backend that keeps channels last.
template <core::Storage T>
void dropout_apply(const Context&, float p, std::uint64_t seed, std::uint32_t layer, std::uint64_t first_sample,
                   const T* x, T* y, std::size_t n, std::size_t size, std::size_t /*channels*/)
{
    const float scale = 1.0f / (1.0f - p);
    parallel_rows(n, n * size, [&](std::size_t s0, std::size_t s1) {   // samples [s0, s1)
        vectorized([&] {
            for (std::size_t s = s0; s < s1; ++s)
                for (std::size_t e = 0; e < size; ++e) {
                    const float u = core::random_uniform(seed, core::Stream::dropout, layer, first_sample + s,
                                                         std::uint32_t(e));
                    y[s * size + e] = core::from_float<T>(u >= p ? core::to_float(x[s * size + e]) * scale : 0.0f);
                }
        });
    });
}

template <core::Storage T>
void copy(const Context&, const T* src, T* dst, std::size_t count)
{
    if (count != 0 && src != dst) std::memcpy(dst, src, count * sizeof(T));
}

// dst[i] = from_float<D>(to_float(src[i])): between storage types (S == D: a copy).
template <core::Storage S, core::Storage D>
void convert(const Context& ctx, const S* src, D* dst, std::size_t count)
{
    if constexpr (std::same_as<S, D>) copy(ctx, src, dst, count);
    else
        vectorized([&] {
            for (std::size_t i = 0; i < count; ++i) dst[i] = core::from_float<D>(core::to_float(src[i]));
        });
}

// Activations in the context's layout from n samples of (c, pixels) and back (the CUDA backend may keep
// channels last, backend/cuda/layout.hpp); the CPU's layout is (c, pixels): a conversion.
template <core::Storage S, core::Storage D>
void to_activation_layout(const Context& ctx, const S* src, D* dst, std::size_t n, std::size_t c, std::size_t pixels)
{
    convert(ctx, src, dst, n * c * pixels);
}
template <core::Storage S, core::Storage D>
void from_activation_layout(const Context& ctx, const S* src, D* dst, std::size_t n, std::size_t c, std::size_t pixels)
{
    convert(ctx, src, dst, n * c * pixels);
}

// dst[i] = value, rounded to T.
template <core::Storage T>
void fill(const Context&, T* dst, float value, std::size_t count)
{
    vectorized([&] {
        const T v = core::from_float<T>(value);
        for (std::size_t i = 0; i < count; ++i) dst[i] = v;
    });
}

// dst += src
template <core::Storage T>
void add(const Context&, const T* src, T* dst, std::size_t count)
{
    parallel_values(count, [&](std::size_t begin, std::size_t end) {
        vectorized([&] {
            for (std::size_t i = begin; i < end; ++i)
                dst[i] = core::from_float<T>(core::to_float(dst[i]) + core::to_float(src[i]));
        });
    });
}

// y = a + b, then max(y, 0) when relu (a residual block's merge).
template <core::Storage T>
void add_into(const Context&, const T* a, const T* b, T* y, std::size_t count, bool relu)
{
    parallel_values(count, [&](std::size_t begin, std::size_t end) {
        vectorized([&] {
            for (std::size_t i = begin; i < end; ++i) {
                const float v = core::to_float(a[i]) + core::to_float(b[i]);
                y[i] = core::from_float<T>(relu && v < 0.0f ? 0.0f : v);
            }
        });
    });
}

// The reproducible mode's exact sums (core/fixed_point.hpp). Out-of-range terms throw at once, so
// there is nothing left for check_fixed to report.
inline void add_fixed(const Context&, const float* g, std::int64_t* acc, std::size_t count)
{
    vectorized([&] { core::add_fixed(g, acc, count); });
}
inline void add_fixed_rows(const Context&, const float* g, std::size_t rows, std::size_t stride, std::int64_t* acc,
                           std::size_t count)
{
    vectorized([&] { core::add_fixed_rows(g, rows, stride, acc, count); });
}
inline void fixed_to_float(const Context&, const std::int64_t* acc, float* g, std::size_t count)
{
    vectorized([&] { core::fixed_to_float(acc, g, count); });
}
inline void zero_fixed(const Context&, std::int64_t* acc, std::size_t count) { std::memset(acc, 0, count * sizeof(std::int64_t)); }
inline void check_fixed(const Context&) {}
// CPU kernels are deterministic already (BLAS thread counts are the caller's business).
inline void make_deterministic(const Context&) {}

// Channel slices of (n, channels, pixels) tensors, for Concat: dst[:, offset:offset+c] = src (n, c, pixels)
template <core::Storage T>
void copy_channels_in(const Context&, const T* src, std::size_t n, std::size_t c, std::size_t pixels, T* dst,
                      std::size_t channels, std::size_t offset)
{
    vectorized([&] {
        for (std::size_t s = 0; s < n; ++s)
            std::memcpy(dst + (s * channels + offset) * pixels, src + s * c * pixels, sizeof(T) * c * pixels);
    });
}

// dst (n, c, pixels) = src[:, offset:offset+c]
template <core::Storage T>
void copy_channels_out(const Context&, const T* src, std::size_t channels, std::size_t offset, std::size_t n,
                       std::size_t c, std::size_t pixels, T* dst)
{
    vectorized([&] {
        for (std::size_t s = 0; s < n; ++s)
            std::memcpy(dst + s * c * pixels, src + (s * channels + offset) * pixels, sizeof(T) * c * pixels);
    });
}

} // namespace replica::backend::cpu
