#pragma once
// Elementwise and layout kernels on the GPU: activations, dropout, copies, channel slices.

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/launch.hpp"
#include "replica/core/fixed_point.hpp"
#include "replica/core/rng.hpp"

namespace replica::backend::cuda {

namespace kernels {
// Activations and sums read and write four floats at a time where the pointers allow it (the
// *4 kernels; one float4 per thread and step of the grid loop): these passes are bound by memory.
__device__ inline float relu(float v) { return v > 0.0f ? v : 0.0f; }
__device__ inline float relu_grad(float y, float dy) { return y > 0.0f ? dy : 0.0f; }

__global__ void relu_forward(const float* x, float* y, std::size_t count)
{
    REPLICA_GRID_LOOP(i, count) y[i] = relu(x[i]);
}
__global__ void relu_forward4(const float4* x, float4* y, std::size_t quads)
{
    REPLICA_GRID_LOOP(i, quads)
    {
        const float4 v = x[i];
        y[i] = make_float4(relu(v.x), relu(v.y), relu(v.z), relu(v.w));
    }
}
__global__ void relu_backward(const float* y, const float* dy, float* dx, std::size_t count)
{
    REPLICA_GRID_LOOP(i, count) dx[i] = relu_grad(y[i], dy[i]);
}
__global__ void relu_backward4(const float4* y, const float4* dy, float4* dx, std::size_t quads)
{
    REPLICA_GRID_LOOP(i, quads)
    {
        const float4 a = y[i], d = dy[i];
        dx[i] = make_float4(relu_grad(a.x, d.x), relu_grad(a.y, d.y), relu_grad(a.z, d.z), relu_grad(a.w, d.w));
    }
}
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
// y (n, channels, s) += b[channel], then the ReLU when Relu; the *4 form needs s % 4 == 0 (a quad
// never spans two channels). 32-bit indices (the caller checks): cheaper divisions.
template <bool Relu>
__device__ inline float biased(float y, float b)
{
    const float v = y + b;
    return Relu ? relu(v) : v;
}
template <bool Relu>
__global__ void add_channel_bias(const float* b, float* y, unsigned count, unsigned channels, unsigned s)
{
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += blockDim.x * gridDim.x)
        y[i] = biased<Relu>(y[i], b[(i / s) % channels]);
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
// In a captured step (step != null) the seed and the first sample come from device memory, and
// first_sample is an offset from the step's first sample.
__global__ void dropout(float p, std::uint64_t seed, std::uint32_t layer, std::uint64_t first_sample, const float* x,
                        float* y, std::size_t size, std::size_t count, const StepParams* step)
{
    if (step != nullptr) {
        seed = step->seed;
        first_sample += step->first_sample;
    }
    const float scale = 1.0f / (1.0f - p);
    REPLICA_GRID_LOOP(i, count)
    {
        const std::size_t s = i / size, e = i % size;
        const float u = core::random_uniform(seed, core::Stream::dropout, layer, first_sample + s, std::uint32_t(e));
        y[i] = u >= p ? x[i] * scale : 0.0f;
    }
}
// count = rows * row elements of type T (float or float4); 32-bit indices (the caller checks).
template <class T>
__global__ void copy_rows(const T* src, unsigned src_pitch, T* dst, unsigned dst_pitch, unsigned row, unsigned count)
{
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += blockDim.x * gridDim.x) {
        const unsigned r = i / row, j = i - r * row;
        dst[r * dst_pitch + j] = src[r * src_pitch + j];
    }
}
__global__ void fill(float* dst, float value, std::size_t count)
{
    REPLICA_GRID_LOOP(i, count) dst[i] = value;
}
__global__ void add(const float* src, float* dst, std::size_t count)
{
    REPLICA_GRID_LOOP(i, count) dst[i] += src[i];
}
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
__global__ void fixed_to_float(const std::int64_t* acc, float* g, std::size_t count)
{
    REPLICA_GRID_LOOP(i, count) g[i] = core::from_fixed(acc[i]);
}
} // namespace kernels

namespace detail {
template <class... P>
bool quad_aligned(const P*... p)
{
    return ((reinterpret_cast<std::uintptr_t>(p) % alignof(float4) == 0) && ...);
}
} // namespace detail

// Each runs the float4 kernel over the whole quads when every pointer is 16-byte aligned, and the
// scalar kernel over the rest (or over everything).
inline void relu_forward(const Context& ctx, const float* x, float* y, std::size_t count)
{
    std::size_t done = 0;
    if (detail::quad_aligned(x, y) && count >= 4) {
        done = count / 4 * 4;
        kernels::relu_forward4<<<detail::blocks_for(count / 4), detail::kThreads, 0, ctx.stream()>>>(
            reinterpret_cast<const float4*>(x), reinterpret_cast<float4*>(y), count / 4);
    }
    if (done < count)
        kernels::relu_forward<<<detail::blocks_for(count - done), detail::kThreads, 0, ctx.stream()>>>(x + done, y + done,
                                                                                                      count - done);
    detail::check_launch("relu_forward");
}
inline void relu_backward(const Context& ctx, const float* y, const float* dy, float* dx, std::size_t count)
{
    std::size_t done = 0;
    if (detail::quad_aligned(y, dy, dx) && count >= 4) {
        done = count / 4 * 4;
        kernels::relu_backward4<<<detail::blocks_for(count / 4), detail::kThreads, 0, ctx.stream()>>>(
            reinterpret_cast<const float4*>(y), reinterpret_cast<const float4*>(dy), reinterpret_cast<float4*>(dx), count / 4);
    }
    if (done < count)
        kernels::relu_backward<<<detail::blocks_for(count - done), detail::kThreads, 0, ctx.stream()>>>(
            y + done, dy + done, dx + done, count - done);
    detail::check_launch("relu_backward");
}
// y (n, channels, s) += b (channels): a convolution's bias; then the ReLU when `relu` (a Conv fused
// with the ReLU after it: one pass instead of two, same bits).
inline void add_channel_bias(const Context& ctx, const float* b, float* y, std::size_t n, std::size_t channels,
                             std::size_t s, bool relu)
{
    const std::size_t count = n * channels * s;
    core::require(count < (std::size_t(1) << 31), "a convolution output of 2^31 values or more: use a smaller batch");
    const bool quads = s % 4 == 0 && detail::quad_aligned(y);
    const unsigned blocks = detail::blocks_for(quads ? count / 4 : count);
    auto* y4 = reinterpret_cast<float4*>(y);
    const auto c = unsigned(channels);
    if (quads && relu) kernels::add_channel_bias4<true><<<blocks, detail::kThreads, 0, ctx.stream()>>>(b, y4, unsigned(count / 4), c, unsigned(s / 4));
    else if (quads) kernels::add_channel_bias4<false><<<blocks, detail::kThreads, 0, ctx.stream()>>>(b, y4, unsigned(count / 4), c, unsigned(s / 4));
    else if (relu) kernels::add_channel_bias<true><<<blocks, detail::kThreads, 0, ctx.stream()>>>(b, y, unsigned(count), c, unsigned(s));
    else kernels::add_channel_bias<false><<<blocks, detail::kThreads, 0, ctx.stream()>>>(b, y, unsigned(count), c, unsigned(s));
    detail::check_launch("add_channel_bias");
}
// Same rule as the CPU kernel: the mask is a pure function of (seed, layer, global sample, element).
inline void dropout_apply(const Context& ctx, float p, std::uint64_t seed, std::uint32_t layer,
                          std::uint64_t first_sample, const float* x, float* y, std::size_t n, std::size_t size)
{
    kernels::dropout<<<detail::blocks_for(n * size), detail::kThreads, 0, ctx.stream()>>>(p, seed, layer, first_sample, x, y,
                                                                                       size, n * size, ctx.step_params());
    detail::check_launch("dropout");
}
inline void copy(const Context& ctx, const float* src, float* dst, std::size_t count)
{
    if (count != 0 && src != dst)
        REPLICA_CHECK(cudaMemcpyAsync(dst, src, count * sizeof(float), cudaMemcpyDeviceToDevice, ctx.stream()));
}
inline void fill(const Context& ctx, float* dst, float value, std::size_t count)
{
    kernels::fill<<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(dst, value, count);
    detail::check_launch("fill");
}
inline void add(const Context& ctx, const float* src, float* dst, std::size_t count)
{
    std::size_t done = 0;
    if (detail::quad_aligned(src, dst) && count >= 4) {
        done = count / 4 * 4;
        kernels::add4<<<detail::blocks_for(count / 4), detail::kThreads, 0, ctx.stream()>>>(
            reinterpret_cast<const float4*>(src), reinterpret_cast<float4*>(dst), count / 4);
    }
    if (done < count)
        kernels::add<<<detail::blocks_for(count - done), detail::kThreads, 0, ctx.stream()>>>(src + done, dst + done, count - done);
    detail::check_launch("add");
}
// The reproducible mode's exact sums (core/fixed_point.hpp), with the CPU's per-element rules. An
// out-of-range term is flagged in pinned memory; check_fixed reports it once the stream has finished.
inline void add_fixed(const Context& ctx, const float* g, std::int64_t* acc, std::size_t count)
{
    kernels::add_fixed<<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(g, acc, count,
                                                                                      ctx.reductions().fixed_status.data());
    detail::check_launch("add_fixed");
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

namespace detail {
// rows x `row` values from src (rows `src_pitch` apart) to dst (rows `dst_pitch` apart), in four-float
// moves where every row start is 16-byte aligned. A kernel, not cudaMemcpy2DAsync, which is slow
// for rows of a few kB (GoogLeNet's channel slices; docs/benchmarks.md).
inline void copy_rows(const Context& ctx, const float* src, std::size_t src_pitch, float* dst, std::size_t dst_pitch,
                      std::size_t row, std::size_t rows)
{
    const std::size_t count = row * rows;
    if (count == 0) return;
    core::require(rows * std::max(src_pitch, dst_pitch) < (std::size_t(1) << 32),
                  "a channel slice copy over 2^32 values or more: use a smaller batch");
    if (quad_aligned(src, dst) && src_pitch % 4 == 0 && dst_pitch % 4 == 0 && row % 4 == 0)
        kernels::copy_rows<<<blocks_for(count / 4), kThreads, 0, ctx.stream()>>>(
            reinterpret_cast<const float4*>(src), unsigned(src_pitch / 4), reinterpret_cast<float4*>(dst),
            unsigned(dst_pitch / 4), unsigned(row / 4), unsigned(count / 4));
    else
        kernels::copy_rows<<<blocks_for(count), kThreads, 0, ctx.stream()>>>(src, unsigned(src_pitch), dst, unsigned(dst_pitch),
                                                                          unsigned(row), unsigned(count));
    check_launch("copy_rows");
}
} // namespace detail

// dst[:, offset:offset+c] = src (n, c, pixels): a concatenation's input on channels.
inline void copy_channels_in(const Context& ctx, const float* src, std::size_t n, std::size_t c, std::size_t pixels,
                             float* dst, std::size_t channels, std::size_t offset)
{
    detail::copy_rows(ctx, src, c * pixels, dst + offset * pixels, channels * pixels, c * pixels, n);
}
// dst (n, c, pixels) = src[:, offset:offset+c].
inline void copy_channels_out(const Context& ctx, const float* src, std::size_t channels, std::size_t offset, std::size_t n,
                              std::size_t c, std::size_t pixels, float* dst)
{
    detail::copy_rows(ctx, src + offset * pixels, channels * pixels, dst, c * pixels, c * pixels, n);
}

} // namespace replica::backend::cuda
