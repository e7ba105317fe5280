#pragma once
// Elementwise and layout kernels on the GPU: activations, dropout, copies, channel slices.

#include <cstddef>
#include <cstdint>

#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/launch.hpp"
#include "replica/core/fixed_point.hpp"
#include "replica/core/rng.hpp"

namespace replica::backend::cuda {

namespace kernels {
__global__ void relu_forward(const float* x, float* y, std::size_t count)
{
    REPLICA_GRID_LOOP(i, count) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}
__global__ void relu_backward(const float* y, const float* dy, float* dx, std::size_t count)
{
    REPLICA_GRID_LOOP(i, count) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
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

inline void relu_forward(const Context& ctx, const float* x, float* y, std::size_t count)
{
    kernels::relu_forward<<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(x, y, count);
    detail::check_launch("relu_forward");
}
inline void relu_backward(const Context& ctx, const float* y, const float* dy, float* dx, std::size_t count)
{
    kernels::relu_backward<<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(y, dy, dx, count);
    detail::check_launch("relu_backward");
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
    kernels::add<<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(src, dst, count);
    detail::check_launch("add");
}
// The reproducible mode's exact sums (core/fixed_point.hpp), with the CPU's per-element rules. An
// out-of-range term is flagged in pinned memory; check_fixed reports it once the stream has finished.
inline void add_fixed(const Context& ctx, const float* g, std::int64_t* acc, std::size_t count)
{
    kernels::add_fixed<<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(g, acc, count,
                                                                                      ctx.state().fixed_status);
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
    core::FixedStatus& s = *ctx.state().fixed_status;
    if (!s.bad) return;
    s.bad = 0;
    throw core::fixed_range_error(std::to_string(s.value));
}

// dst[:, offset:offset+c] = src (n, c, pixels), as one strided copy.
inline void copy_channels_in(const Context& ctx, const float* src, std::size_t n, std::size_t c, std::size_t pixels,
                             float* dst, std::size_t channels, std::size_t offset)
{
    REPLICA_CHECK(cudaMemcpy2DAsync(dst + offset * pixels, channels * pixels * sizeof(float), src, c * pixels * sizeof(float),
                                    c * pixels * sizeof(float), n, cudaMemcpyDeviceToDevice, ctx.stream()));
}
inline void copy_channels_out(const Context& ctx, const float* src, std::size_t channels, std::size_t offset, std::size_t n,
                              std::size_t c, std::size_t pixels, float* dst)
{
    REPLICA_CHECK(cudaMemcpy2DAsync(dst, c * pixels * sizeof(float), src + offset * pixels, channels * pixels * sizeof(float),
                                    c * pixels * sizeof(float), n, cudaMemcpyDeviceToDevice, ctx.stream()));
}

} // namespace replica::backend::cuda
