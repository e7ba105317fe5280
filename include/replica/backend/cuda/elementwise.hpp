#pragma once
// Elementwise and layout kernels on the GPU: activations, dropout, copies, channel slices, conversions.
// Activations are of one type T (float, bf16, fp16: backend/cuda/packed.hpp), computed in float;
// biases stay float.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/launch.hpp"
#include "replica/backend/cuda/layout.hpp"
#include "replica/backend/cuda/packed.hpp"
#include "replica/core/config.hpp"
#include "replica/core/fixed_point.hpp"
#include "replica/core/rng.hpp"

namespace REPLICA_NAMESPACE::backend::cuda {

namespace kernels {
// Activations and sums read and write four floats at a time where the pointers allow it (the
// *4 kernels; one float4 per thread and step of the grid loop): these passes are bound by memory.
// bf16 and fp16 go through packed.hpp's maps, eight values a move.
__device__ inline float relu(float v) { return v > 0.0f ? v : 0.0f; }
__device__ inline float relu_grad(float y, float dy) { return y > 0.0f ? dy : 0.0f; }
// A ReLU's backward inside a pass that reads its output gradient: V values d of dy become
// relu_grad(y, dy), y the ReLU's output as load_raw read it, and are written to dz (V values).
template <int V, core::Storage T>
__device__ inline void relu_grad_store(const Raw<V, T>& y, float (&d)[8], T* dz)
{
    float r[8];
    widen_raw(y, r);
#pragma unroll
    for (int j = 0; j < V; ++j) d[j] = relu_grad(r[j], d[j]);
    store_v<V>(dz, d);
}
struct Relu {
    __device__ float operator()(float v) const { return relu(v); }
};
struct ReluGrad {
    __device__ float operator()(float y, float dy) const { return relu_grad(y, dy); }
};
struct Plus {
    __device__ float operator()(float a, float b) const { return a + b; }
};

template <int = 0>
__global__ void relu_forward(const float* x, float* y, std::size_t count)
{
    REPLICA_GRID_LOOP(i, count) y[i] = relu(x[i]);
}
template <int = 0>
__global__ void relu_forward4(const float4* x, float4* y, std::size_t quads)
{
    REPLICA_GRID_LOOP(i, quads)
    {
        const float4 v = x[i];
        y[i] = make_float4(relu(v.x), relu(v.y), relu(v.z), relu(v.w));
    }
}
template <int = 0>
__global__ void relu_backward(const float* y, const float* dy, float* dx, std::size_t count)
{
    REPLICA_GRID_LOOP(i, count) dx[i] = relu_grad(y[i], dy[i]);
}
template <int = 0>
__global__ void relu_backward4(const float4* y, const float4* dy, float4* dx, std::size_t quads)
{
    REPLICA_GRID_LOOP(i, quads)
    {
        const float4 a = y[i], d = dy[i];
        dx[i] = make_float4(relu_grad(a.x, d.x), relu_grad(a.y, d.y), relu_grad(a.z, d.z), relu_grad(a.w, d.w));
    }
}
template <int = 0>
__global__ void add4(const float4* src, float4* dst, std::size_t quads)
{
    REPLICA_GRID_LOOP(i, quads)
    {
        const float4 a = src[i];
        float4 b = dst[i];
        b.x += a.x;
        b.y += a.y;
        b.z += a.z;
        b.w += a.w;
        dst[i] = b;
    }
}
// y (n, channels, s) += b[channel], then the ReLU when Relu; the *4 (float) and *8 (16-bit) forms need
// s % 4 == 0, s % 8 == 0 (a move never spans two channels). 32-bit indices (the caller checks): cheaper
// divisions.
template <bool Relu>
__device__ inline float biased(float y, float b)
{
    const float v = y + b;
    return Relu ? relu(v) : v;
}
template <bool Relu, core::Storage T>
__global__ void add_channel_bias(const float* b, T* y, unsigned count, unsigned channels, unsigned s)
{
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += blockDim.x * gridDim.x)
        y[i] = narrow<T>(biased<Relu>(widen(y[i]), b[(i / s) % channels]));
}
template <bool Relu>
__global__ void add_channel_bias4(const float* b, float4* y, unsigned quads, unsigned channels, unsigned s4)
{
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < quads; i += blockDim.x * gridDim.x) {
        const float v = b[(i / s4) % channels];
        const float4 t = y[i];
        y[i] = make_float4(biased<Relu>(t.x, v), biased<Relu>(t.y, v), biased<Relu>(t.z, v), biased<Relu>(t.w, v));
    }
}
template <bool Relu, core::Storage T>
__global__ void add_channel_bias8(const float* b, T* y, unsigned octets, unsigned channels, unsigned s8)
{
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < octets; i += blockDim.x * gridDim.x) {
        const float v = b[(i / s8) % channels];
        float t[8];
        load8(y + 8 * std::size_t(i), t);
#pragma unroll
        for (int k = 0; k < 8; ++k) t[k] = biased<Relu>(t[k], v);
        store8(y + 8 * std::size_t(i), t);
    }
}
// y (n, s, channels) += b[channel] (channels-last), then the ReLU when Relu, in groups of V values of
// one pixel (V = 8 needs channels % 8 == 0 and y 16-byte aligned).
template <bool Relu, int V, core::Storage T>
__global__ void add_channel_bias_last(const float* b, T* y, unsigned groups, unsigned channels)
{
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < groups; i += blockDim.x * gridDim.x) {
        const unsigned ch = i * V % channels;
        float t[8];
        load_v<V>(y + std::size_t(i) * V, t);
#pragma unroll
        for (int k = 0; k < V; ++k) t[k] = biased<Relu>(t[k], b[ch + k]);
        store_v<V>(y + std::size_t(i) * V, t);
    }
}
// In a captured step (step != null) the seed and the first sample come from device memory, and
// first_sample is an offset from the step's first sample.
// A sample's `size` values are (channels, pixels), or (pixels, channels) where Last: an element's mask is keyed by its (channel, pixel) index either way, so that every layout
// drops the same elements.
template <bool Last, core::Storage T>
__global__ void dropout(float p, std::uint64_t seed, std::uint32_t layer, std::uint64_t first_sample, const T* x, T* y,
                        std::size_t size, std::size_t count, const StepParams* step, std::size_t channels, std::size_t pixels)
{
    if (step != nullptr) {
        seed = step->seed;
        first_sample += step->first_sample;
    }
    const float scale = 1.0f / (1.0f - p);
    REPLICA_GRID_LOOP(i, count)
    {
        const std::size_t s = i / size, at = i % size;
        const std::size_t e = Last ? at % channels * pixels + at / channels : at;
        const float u = core::random_uniform(seed, core::Stream::dropout, layer, first_sample + s, std::uint32_t(e));
        y[i] = narrow<T>(u >= p ? widen(x[i]) * scale : 0.0f);
    }
}
// count = rows * row elements of type T (a value, or a float4 of 16 bytes of them); 32-bit indices
// (the caller checks).
template <class T>
__global__ void copy_rows(const T* src, unsigned src_pitch, T* dst, unsigned dst_pitch, unsigned row, unsigned count)
{
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += blockDim.x * gridDim.x) {
        const unsigned r = i / row, j = i - r * row;
        dst[r * dst_pitch + j] = src[r * src_pitch + j];
    }
}
template <core::Storage T>
__global__ void fill(T* dst, T value, std::size_t count)
{
    REPLICA_GRID_LOOP(i, count) dst[i] = value;
}
template <int = 0>
__global__ void add(const float* src, float* dst, std::size_t count)
{
    REPLICA_GRID_LOOP(i, count) dst[i] += src[i];
}
template <int = 0>
__global__ void add_fixed(const float* g, std::int64_t* acc, std::size_t count, core::FixedStatus* status)
{
    REPLICA_GRID_LOOP(i, count)
    {
        std::int64_t v;
        if (core::to_fixed(g[i], v)) acc[i] += v;
        else {
            status->bad = 1;
            status->value = g[i];
        }
    }
}
template <int = 0>
__global__ void add_fixed_rows(const float* g, std::size_t rows, std::size_t stride, std::int64_t* acc, std::size_t count,
                               core::FixedStatus* status)
{
    REPLICA_GRID_LOOP(i, count)
    {
        std::int64_t sum = acc[i];
        for (std::size_t r = 0; r < rows; ++r) {
            std::int64_t v;
            if (core::to_fixed(g[r * stride + i], v)) sum += v;
            else {
                status->bad = 1;
                status->value = g[r * stride + i];
            }
        }
        acc[i] = sum;
    }
}
template <int = 0>
__global__ void fixed_to_float(const std::int64_t* acc, float* g, std::size_t count)
{
    REPLICA_GRID_LOOP(i, count) g[i] = core::from_fixed(acc[i]);
}
template <core::Storage S, core::Storage D>
__global__ void convert(const S* src, D* dst, std::size_t count)
{
    REPLICA_GRID_LOOP(i, count) dst[i] = narrow<D>(widen(src[i]));
}
template <core::Storage S, core::Storage D>
__global__ void convert8(const S* src, D* dst, std::size_t octets)
{
    REPLICA_GRID_LOOP(i, octets)
    {
        float v[8];
        load8(src + 8 * i, v);
        store8(dst + 8 * i, v);
    }
}
} // namespace kernels

namespace detail {
// kernel4 over the whole quads of x and y when both are 16-byte aligned, kernel over the rest.
inline void in_quads(const Context& ctx, const float* x, float* y, std::size_t count,
                     void (*kernel4)(const float4*, float4*, std::size_t), void (*kernel)(const float*, float*, std::size_t),
                     const char* what)
{
    const auto s = ctx.stream();
    in_moves(
        quad_aligned(x, y), count, 4,
        [&](std::size_t quads) {
            kernel4<<<blocks_for(quads), kThreads, 0, s>>>(reinterpret_cast<const float4*>(x), reinterpret_cast<float4*>(y),
                                                          quads);
        },
        [&](std::size_t done) { kernel<<<blocks_for(count - done), kThreads, 0, s>>>(x + done, y + done, count - done); });
    check_launch(what);
}
} // namespace detail

// Each runs the vector kernel over the whole moves when every pointer is 16-byte aligned, and the
// scalar kernel over the rest (or over everything).
template <core::Storage T>
void relu_forward(const Context& ctx, const T* x, T* y, std::size_t count)
{
    if constexpr (std::same_as<T, float>)
        detail::in_quads(ctx, x, y, count, kernels::relu_forward4, kernels::relu_forward, "relu_forward");
    else detail::map1<kernels::Relu>(ctx, x, y, count, "relu_forward");
}
template <core::Storage T>
void relu_backward(const Context& ctx, const T* y, const T* dy, T* dx, std::size_t count)
{
    if constexpr (std::same_as<T, float>) {
        const auto s = ctx.stream();
        detail::in_moves(
            detail::quad_aligned(y, dy, dx), count, 4,
            [&](std::size_t quads) {
                kernels::relu_backward4<<<detail::blocks_for(quads), detail::kThreads, 0, s>>>(
                    reinterpret_cast<const float4*>(y), reinterpret_cast<const float4*>(dy), reinterpret_cast<float4*>(dx),
                    quads);
            },
            [&](std::size_t done) {
                kernels::relu_backward<<<detail::blocks_for(count - done), detail::kThreads, 0, s>>>(
                    y + done, dy + done, dx + done, count - done);
            });
        detail::check_launch("relu_backward");
    } else {
        detail::map2<kernels::ReluGrad>(ctx, y, dy, dx, count, "relu_backward");
    }
}
namespace detail {
// add_channel_bias over channels-last y (count / channels pixels of `channels` values).
template <core::Storage T>
void add_channel_bias_last(const Context& ctx, const float* b, T* y, std::size_t count, std::size_t channels, bool relu)
{
    const auto launch = [&](auto r, auto v) {
        constexpr int V = decltype(v)::value;
        kernels::add_channel_bias_last<decltype(r)::value, V><<<blocks_for(count / V), kThreads, 0, ctx.stream()>>>(
            b, y, unsigned(count / V), unsigned(channels));
    };
    const auto width = [&](auto r) {
        if (channels % 8 == 0 && quad_aligned(y)) launch(r, std::integral_constant<int, 8>{});
        else launch(r, std::integral_constant<int, 1>{});
    };
    if (relu) width(std::true_type{});
    else width(std::false_type{});
}
} // namespace detail

// y (n, channels, s) += b (channels): a convolution's bias; then the ReLU when `relu` (a Conv fused
// with the ReLU after it: one pass instead of two, same bits). y is an activation (T) in ctx's layout,
// b stays float; each value is rounded once, after the bias and the ReLU.
template <core::Storage T>
void add_channel_bias(const Context& ctx, const float* b, T* y, std::size_t n, std::size_t channels, std::size_t s,
                      bool relu)
{
    const std::size_t count = n * channels * s;
    core::require(count < (std::size_t(1) << 31), "a convolution output of 2^31 values or more: use a smaller batch");
    const auto c = unsigned(channels);
    if (s == 1 || (!std::same_as<T, float> && channels_last<T>(ctx))) {   // (n, channels): a Linear's, or channels-last
        detail::add_channel_bias_last(ctx, b, y, count, channels, relu);
        detail::check_launch("add_channel_bias");
        return;
    }
    if constexpr (std::same_as<T, float>) {
        const bool quads = s % 4 == 0 && detail::quad_aligned(y);
        const unsigned blocks = detail::blocks_for(quads ? count / 4 : count);
        auto* y4 = reinterpret_cast<float4*>(y);
        if (quads && relu) kernels::add_channel_bias4<true><<<blocks, detail::kThreads, 0, ctx.stream()>>>(b, y4, unsigned(count / 4), c, unsigned(s / 4));
        else if (quads) kernels::add_channel_bias4<false><<<blocks, detail::kThreads, 0, ctx.stream()>>>(b, y4, unsigned(count / 4), c, unsigned(s / 4));
        else if (relu) kernels::add_channel_bias<true><<<blocks, detail::kThreads, 0, ctx.stream()>>>(b, y, unsigned(count), c, unsigned(s));
        else kernels::add_channel_bias<false><<<blocks, detail::kThreads, 0, ctx.stream()>>>(b, y, unsigned(count), c, unsigned(s));
    } else {
        const bool octets = s % 8 == 0 && detail::quad_aligned(y);
        const auto launch = [&](auto r) {
            constexpr bool R = decltype(r)::value;
            if (octets)
                kernels::add_channel_bias8<R><<<detail::blocks_for(count / 8), detail::kThreads, 0, ctx.stream()>>>(
                    b, y, unsigned(count / 8), c, unsigned(s / 8));
            else
                kernels::add_channel_bias<R><<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(
                    b, y, unsigned(count), c, unsigned(s));
        };
        if (relu) launch(std::true_type{});
        else launch(std::false_type{});
    }
    detail::check_launch("add_channel_bias");
}
// Same rule as the CPU kernel: the mask is a pure function of (seed, layer, global sample, element),
// the element numbered as in (channels, pixels) whatever the layout (a sample: size values, `channels`
// of them per pixel).
template <core::Storage T>
void dropout_apply(const Context& ctx, float p, std::uint64_t seed, std::uint32_t layer, std::uint64_t first_sample,
                   const T* x, T* y, std::size_t n, std::size_t size, std::size_t channels)
{
    const auto launch = [&](auto last) {
        kernels::dropout<decltype(last)::value><<<detail::blocks_for(n * size), detail::kThreads, 0, ctx.stream()>>>(
            p, seed, layer, first_sample, x, y, size, n * size, ctx.step_params(), channels, size / channels);
    };
    detail::by_layout<T>(ctx, [&](auto last) {
        if constexpr (decltype(last)::value) {
            if (channels > 1 && channels < size) return launch(std::true_type{});
        }
        launch(std::false_type{});
    });
    detail::check_launch("dropout");
}
template <core::Storage T>
void copy(const Context& ctx, const T* src, T* dst, std::size_t count)
{
    if (count != 0 && src != dst)
        REPLICA_CHECK(cudaMemcpyAsync(dst, src, count * sizeof(T), cudaMemcpyDeviceToDevice, ctx.stream()));
}
// dst[i] = value rounded to T.
template <core::Storage T>
void fill(const Context& ctx, T* dst, float value, std::size_t count)
{
    kernels::fill<<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(dst, core::from_float<T>(value), count);
    detail::check_launch("fill");
}
// dst += src
template <core::Storage T>
void add(const Context& ctx, const T* src, T* dst, std::size_t count)
{
    if constexpr (std::same_as<T, float>) detail::in_quads(ctx, src, dst, count, kernels::add4, kernels::add, "add");
    else detail::map2<kernels::Plus>(ctx, src, dst, dst, count, "add");
}
// dst[i] = src[i] converted to D: from_float<D>(to_float(src[i])), exact when D holds every S (bf16 or
// fp16 to float), rounded to nearest even otherwise. S == D copies.
template <core::Storage S, core::Storage D>
void convert(const Context& ctx, const S* src, D* dst, std::size_t count)
{
    if constexpr (std::same_as<S, D>) {
        copy(ctx, src, dst, count);
    } else {
        const auto s = ctx.stream();
        detail::in_moves(
            detail::quad_aligned(src, dst), count, 8,
            [&](std::size_t octets) {
                kernels::convert8<<<detail::blocks_for(octets), detail::kThreads, 0, s>>>(src, dst, octets);
            },
            [&](std::size_t done) {
                kernels::convert<<<detail::blocks_for(count - done), detail::kThreads, 0, s>>>(src + done, dst + done,
                                                                                             count - done);
            });
        detail::check_launch("convert");
    }
}
// The reproducible mode's exact sums (core/fixed_point.hpp), with the CPU's per-element rules. An
// out-of-range term is flagged in pinned memory; check_fixed reports it once the stream has finished.
inline void add_fixed(const Context& ctx, const float* g, std::int64_t* acc, std::size_t count)
{
    kernels::add_fixed<<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(g, acc, count,
                                                                                      ctx.reductions().fixed_status.data());
    detail::check_launch("add_fixed");
}
inline void add_fixed_rows(const Context& ctx, const float* g, std::size_t rows, std::size_t stride, std::int64_t* acc,
                           std::size_t count)
{
    if (rows == 0 || count == 0) return;
    kernels::add_fixed_rows<<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(
        g, rows, stride, acc, count, ctx.reductions().fixed_status.data());
    detail::check_launch("add_fixed_rows");
}
inline void fixed_to_float(const Context& ctx, const std::int64_t* acc, float* g, std::size_t count)
{
    kernels::fixed_to_float<<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(acc, g, count);
    detail::check_launch("fixed_to_float");
}
inline void zero_fixed(const Context& ctx, std::int64_t* acc, std::size_t count)
{
    if (count) REPLICA_CHECK(cudaMemsetAsync(acc, 0, count * sizeof(std::int64_t), ctx.stream()));
}
// Call after synchronising the stream.
inline void check_fixed(const Context& ctx)
{
    core::FixedStatus& s = ctx.reductions().fixed_status[0];
    if (!s.bad) return;
    s.bad = 0;
    throw core::fixed_range_error(std::to_string(s.value));
}

// dst (activations of type D in ctx's layout) = src (n samples of (c, pixels), NCHW) converted to D.
template <core::Storage S, core::Storage D>
void to_activation_layout(const Context& ctx, const S* src, D* dst, std::size_t n, std::size_t c, std::size_t pixels)
{
    if (channels_last<D>(ctx) && pixels > 1 && c > 1) detail::transpose_planes(ctx, src, dst, n, c, pixels);
    else convert(ctx, src, dst, n * c * pixels);
}

// dst (n samples of (c, pixels), NCHW, of type D) = src (activations of type S in ctx's layout) converted.
template <core::Storage S, core::Storage D>
void from_activation_layout(const Context& ctx, const S* src, D* dst, std::size_t n, std::size_t c, std::size_t pixels)
{
    if (channels_last<S>(ctx) && pixels > 1 && c > 1) detail::transpose_planes(ctx, src, dst, n, pixels, c);
    else convert(ctx, src, dst, n * c * pixels);
}


namespace detail {
// rows x `row` values from src (rows `src_pitch` apart) to dst (rows `dst_pitch` apart), in 16-byte
// moves (float4s: the bits are moved, not converted) where every row start is 16-byte aligned. A
// kernel, not cudaMemcpy2DAsync, which is slow for rows of a few kB (GoogLeNet's channel slices;
// docs/results/).
template <core::Storage T>
void copy_rows(const Context& ctx, const T* src, std::size_t src_pitch, T* dst, std::size_t dst_pitch, std::size_t row,
               std::size_t rows)
{
    const std::size_t count = row * rows;
    if (count == 0) return;
    core::require(rows * std::max(src_pitch, dst_pitch) < (std::size_t(1) << 32),
                  "a channel slice copy over 2^32 values or more: use a smaller batch");
    constexpr std::size_t k = per_move<T>;
    if (quad_aligned(src, dst) && src_pitch % k == 0 && dst_pitch % k == 0 && row % k == 0)
        kernels::copy_rows<<<blocks_for(count / k), kThreads, 0, ctx.stream()>>>(
            reinterpret_cast<const float4*>(src), unsigned(src_pitch / k), reinterpret_cast<float4*>(dst),
            unsigned(dst_pitch / k), unsigned(row / k), unsigned(count / k));
    else
        kernels::copy_rows<<<blocks_for(count), kThreads, 0, ctx.stream()>>>(src, unsigned(src_pitch), dst, unsigned(dst_pitch),
                                                                          unsigned(row), unsigned(count));
    check_launch("copy_rows");
}
} // namespace detail

// dst[:, offset:offset+c] = src (n, c, pixels): a concatenation's input on channels (both in ctx's
// layout: channels-last, a row of c values a pixel).
template <core::Storage T>
void copy_channels_in(const Context& ctx, const T* src, std::size_t n, std::size_t c, std::size_t pixels, T* dst,
                      std::size_t channels, std::size_t offset)
{
    if (channels_last<T>(ctx)) detail::copy_rows(ctx, src, c, dst + offset, channels, c, n * pixels);
    else detail::copy_rows(ctx, src, c * pixels, dst + offset * pixels, channels * pixels, c * pixels, n);
}
// dst (n, c, pixels) = src[:, offset:offset+c].
template <core::Storage T>
void copy_channels_out(const Context& ctx, const T* src, std::size_t channels, std::size_t offset, std::size_t n,
                       std::size_t c, std::size_t pixels, T* dst)
{
    if (channels_last<T>(ctx)) detail::copy_rows(ctx, src + offset, channels, dst, c, c, n * pixels);
    else detail::copy_rows(ctx, src + offset * pixels, channels * pixels, dst, c * pixels, c * pixels, n);
}

} // namespace replica::backend::cuda
