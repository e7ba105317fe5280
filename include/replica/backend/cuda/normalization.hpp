#pragma once
// Batch normalisation and the residual merge on the GPU (layers/normalization.hpp, model/residual.hpp).
// x is (n, c, inner). Per-channel sums in two stages of fixed shape, in double: blocks sum fixed parts
// of each channel (a block tree), then one thread a channel adds the parts in order: the same bits
// every run. x, y, dx, dy (and add_into's a, b, y) are activations of one type T (float, bf16, fp16),
// read as float, each output rounded once to T; sums, statistics and parameters stay float (the sums
// in double, as for float).

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "replica/backend/batch_norm_rules.hpp"
#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/elementwise.hpp"
#include "replica/backend/cuda/launch.hpp"
#include "replica/backend/cuda/packed.hpp"

namespace replica::backend::cuda {

namespace kernels {
// Stage one of a per-channel sum: block (ch, part) sums part `part` of channel ch's n * inner
// elements (a contiguous range of its (sample, position) index) into partial[(ch * parts + part) * 2 +
// {0, 1}]. Stage two (finish_channel_sums) adds the parts in order. Both in double.
template <bool Backward, core::Storage T>
__global__ void channel_partial_sums(const T* x, const T* dy, std::size_t n, std::size_t c, std::size_t inner,
                                     const float* centre, double* partial)
{
    __shared__ double lane[detail::kThreads];
    const std::size_t ch = blockIdx.x, parts = gridDim.y, count = n * inner;
    const std::size_t per = (count + parts - 1) / parts, begin = blockIdx.y * per;
    const std::size_t end = begin + per < count ? begin + per : count;
    const double k = centre[ch];
    double s1 = 0.0, s2 = 0.0;
    for (std::size_t e = begin + threadIdx.x; e < end; e += blockDim.x) {
        const std::size_t i = e / inner, at = (i * c + ch) * inner + (e - i * inner);
        const double d = double(widen(x[at])) - k;
        if constexpr (Backward) {   // sum of dy, and of dy * (x - mean)
            const double g = widen(dy[at]);
            s1 += g;
            s2 += g * d;
        } else {   // sum of x - shift, and of its square
            s1 += d;
            s2 += d * d;
        }
    }
    const auto plus = [](double a, double b) { return a + b; };
    s1 = detail::block_reduce(lane, s1, plus);
    __syncthreads();
    s2 = detail::block_reduce(lane, s2, plus);
    if (threadIdx.x == 0) {
        partial[(ch * parts + blockIdx.y) * 2] = s1;
        partial[(ch * parts + blockIdx.y) * 2 + 1] = s2;
    }
}

// Forward: sums = [s1 (c) | s2 (c) | count]. Backward: dparams = [s2 * invstd (c) | s1 (c)].
template <bool Backward>
__global__ void finish_channel_sums(const double* partial, std::size_t parts, std::size_t c, std::size_t count,
                                    const float* invstd, float* out)
{
    const std::size_t ch = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
    if (ch >= c) return;
    double s1 = 0.0, s2 = 0.0;
    for (std::size_t p = 0; p < parts; ++p) {
        s1 += partial[(ch * parts + p) * 2];
        s2 += partial[(ch * parts + p) * 2 + 1];
    }
    if constexpr (Backward) {
        out[ch] = float(s2 * invstd[ch]);
        out[c + ch] = float(s1);
    } else {
        out[ch] = float(s1);
        out[c + ch] = float(s2);
        if (ch == 0) out[2 * c] = float(count);
    }
}

__global__ void batch_norm_statistics(const float* sums, float* running_mean, float* running_var, float momentum,
                                      float eps, float* mean, float* invstd, std::size_t c)
{
    const std::size_t ch = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
    if (ch >= c) return;
    const double count = sums[2 * c];
    const double d = count > 0 ? sums[ch] / count : 0.0;
    const double s2 = count > 0 ? sums[c + ch] / count - d * d : 0.0;
    const double var = s2 > 0.0 ? s2 : 0.0;
    const double m = double(running_mean[ch]) + d;
    mean[ch] = float(m);
    invstd[ch] = float(1.0 / sqrt(var + double(eps)));
    if (momentum != 0.0f) move_running(running_mean[ch], running_var[ch], m, var, count, momentum);
}

__global__ void batch_norm_shard_sums(const float* sums, float* out, float scale, std::size_t c)
{
    const std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
    if (i < 2 * c) out[i] = sums[i] * scale;
}

__global__ void batch_norm_step_statistics(const float* sums, float* running_mean, float* running_var, float momentum,
                                           double ratio, double count, std::size_t c)
{
    const std::size_t ch = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
    if (ch >= c) return;
    const double d = sums[ch] * ratio;
    const double s2 = sums[c + ch] * ratio - d * d;
    move_running(running_mean[ch], running_var[ch], double(running_mean[ch]) + d, s2 > 0.0 ? s2 : 0.0, count, momentum);
}

__global__ void batch_norm_running(const float* running_mean, const float* running_var, float eps, float* mean,
                                   float* invstd, std::size_t c)
{
    const std::size_t ch = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
    if (ch >= c) return;
    mean[ch] = running_mean[ch];
    invstd[ch] = float(1.0 / sqrt(double(running_var[ch]) + double(eps)));
}

template <bool Relu, class I, core::Storage T>
__global__ void batch_norm_apply(const T* x, T* y, I count, I c, I inner, const float* weight, const float* bias,
                                 const float* mean, const float* invstd)
{
    REPLICA_GRID_LOOP_AS(I, e, count)
    {
        const I ch = (e / inner) % c;
        const float scale = weight[ch] * invstd[ch];
        const float v = widen(x[e]) * scale + (bias[ch] - mean[ch] * scale);
        y[e] = narrow<T>(Relu && v < 0.0f ? 0.0f : v);
    }
}

template <class I, core::Storage T>
__global__ void batch_norm_backward_input(const T* x, const T* dy, T* dx, I count, I c, I inner,
                                          const float* weight, const float* mean, const float* invstd, const float* sums,
                                          const float* elements)
{
    const float inv_count = 1.0f / *elements;
    REPLICA_GRID_LOOP_AS(I, e, count)
    {
        const I ch = (e / inner) % c;
        const float xhat = (widen(x[e]) - mean[ch]) * invstd[ch];
        dx[e] = narrow<T>(weight[ch] * invstd[ch] * (widen(dy[e]) - sums[c + ch] * inv_count - xhat * sums[ch] * inv_count));
    }
}

template <bool Relu>
__global__ void add_into(const float* a, const float* b, float* y, std::size_t count)
{
    REPLICA_GRID_LOOP(i, count)
    {
        const float v = a[i] + b[i];
        y[i] = Relu && v < 0.0f ? 0.0f : v;
    }
}
template <bool Relu>
__global__ void add_into4(const float4* a, const float4* b, float4* y, std::size_t quads)
{
    REPLICA_GRID_LOOP(i, quads)
    {
        const float4 u = a[i], v = b[i];
        float4 s = make_float4(u.x + v.x, u.y + v.y, u.z + v.z, u.w + v.w);
        if (Relu) s = make_float4(s.x > 0.0f ? s.x : 0.0f, s.y > 0.0f ? s.y : 0.0f, s.z > 0.0f ? s.z : 0.0f,
                                  s.w > 0.0f ? s.w : 0.0f);
        y[i] = s;
    }
}
// a + b, then the ReLU when Relu: add_into's rule for packed.hpp's maps (bf16, fp16).
template <bool Relu>
struct PlusRelu {
    __device__ float operator()(float a, float b) const
    {
        const float v = a + b;
        return Relu && v < 0.0f ? 0.0f : v;
    }
};
} // namespace kernels

namespace detail {
// Parts a channel's n * inner elements are summed in: about 8192 elements each, at most
// kChannelParts (the partial-sum buffer's size a channel).
inline constexpr std::size_t kChannelParts = 128;
inline std::size_t channel_parts(std::size_t count)
{
    return std::clamp<std::size_t>((count + 8191) / 8192, 1, kChannelParts);
}
} // namespace detail

// Floats of scratch the per-channel sums of c channels need (partial sums, in doubles, at the first
// 8-byte boundary of the scratch), for activations of type T (the same for all: the sums are double).
template <core::Storage T = float>
std::size_t batch_norm_scratch(const Context&, std::size_t c)
{
    return 4 * detail::kChannelParts * c + 1;
}

namespace detail {
inline double* partial_sums(float* scratch)
{
    const auto p = reinterpret_cast<std::uintptr_t>(scratch);
    return reinterpret_cast<double*>((p + alignof(double) - 1) / alignof(double) * alignof(double));
}
} // namespace detail

template <core::Storage T>
void batch_norm_sums(const Context& ctx, const T* x, std::size_t n, std::size_t c, std::size_t inner, const float* shift,
                     float* sums, float* scratch)
{
    const std::size_t parts = detail::channel_parts(n * inner);
    double* partial = detail::partial_sums(scratch);
    kernels::channel_partial_sums<false><<<dim3(unsigned(c), unsigned(parts)), detail::kThreads, 0, ctx.stream()>>>(
        x, static_cast<const T*>(nullptr), n, c, inner, shift, partial);
    kernels::finish_channel_sums<false><<<detail::blocks_for(c), detail::kThreads, 0, ctx.stream()>>>(
        partial, parts, c, n * inner, nullptr, sums);
    detail::check_launch("batch_norm_sums");
}

inline void batch_norm_statistics(const Context& ctx, const float* sums, float* running_mean, float* running_var,
                                  float momentum, float eps, float* mean, float* invstd, std::size_t c)
{
    kernels::batch_norm_statistics<<<detail::blocks_for(c), detail::kThreads, 0, ctx.stream()>>>(
        sums, running_mean, running_var, momentum, eps, mean, invstd, c);
    detail::check_launch("batch_norm_statistics");
}

// The reproducible mode (see the CPU backend's): a micro-shard's share, and the once-a-step update.
inline void batch_norm_shard_sums(const Context& ctx, const float* sums, float* out, float scale, std::size_t c)
{
    kernels::batch_norm_shard_sums<<<detail::blocks_for(2 * c), detail::kThreads, 0, ctx.stream()>>>(sums, out, scale, c);
    detail::check_launch("batch_norm_shard_sums");
}
inline void batch_norm_step_statistics(const Context& ctx, const float* sums, float* running_mean, float* running_var,
                                       float momentum, double ratio, double count, std::size_t c)
{
    kernels::batch_norm_step_statistics<<<detail::blocks_for(c), detail::kThreads, 0, ctx.stream()>>>(
        sums, running_mean, running_var, momentum, ratio, count, c);
    detail::check_launch("batch_norm_step_statistics");
}

inline void batch_norm_running(const Context& ctx, const float* running_mean, const float* running_var, float eps,
                               float* mean, float* invstd, std::size_t c)
{
    kernels::batch_norm_running<<<detail::blocks_for(c), detail::kThreads, 0, ctx.stream()>>>(running_mean, running_var,
                                                                                             eps, mean, invstd, c);
    detail::check_launch("batch_norm_running");
}

template <core::Storage T>
void batch_norm_apply(const Context& ctx, const T* x, T* y, std::size_t n, std::size_t c, std::size_t inner,
                      const float* weight, const float* bias, const float* mean, const float* invstd, bool relu)
{
    const std::size_t count = n * c * inner;
    if (count == 0) return;
    detail::indexed(count, [&](auto index) {
        using I = decltype(index);
        if (relu)
            kernels::batch_norm_apply<true, I, T><<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(
                x, y, I(count), I(c), I(inner), weight, bias, mean, invstd);
        else
            kernels::batch_norm_apply<false, I, T><<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(
                x, y, I(count), I(c), I(inner), weight, bias, mean, invstd);
    });
    detail::check_launch("batch_norm_apply");
}

template <core::Storage T>
void batch_norm_backward_sums(const Context& ctx, const T* x, const T* dy, std::size_t n, std::size_t c, std::size_t inner,
                              const float* mean, const float* invstd, float* dparams, float* scratch)
{
    const std::size_t parts = detail::channel_parts(n * inner);
    double* partial = detail::partial_sums(scratch);
    kernels::channel_partial_sums<true><<<dim3(unsigned(c), unsigned(parts)), detail::kThreads, 0, ctx.stream()>>>(
        x, dy, n, c, inner, mean, partial);
    kernels::finish_channel_sums<true><<<detail::blocks_for(c), detail::kThreads, 0, ctx.stream()>>>(
        partial, parts, c, n * inner, invstd, dparams);
    detail::check_launch("batch_norm_backward_sums");
}

template <core::Storage T>
void batch_norm_backward_input(const Context& ctx, const T* x, const T* dy, T* dx, std::size_t n, std::size_t c,
                               std::size_t inner, const float* weight, const float* mean, const float* invstd,
                               const float* sums, const float* count)
{
    const std::size_t total = n * c * inner;
    if (total == 0) return;
    detail::indexed(total, [&](auto index) {
        using I = decltype(index);
        kernels::batch_norm_backward_input<I, T><<<detail::blocks_for(total), detail::kThreads, 0, ctx.stream()>>>(
            x, dy, dx, I(total), I(c), I(inner), weight, mean, invstd, sums, count);
    });
    detail::check_launch("batch_norm_backward_input");
}

// y = a + b, then the ReLU when relu.
template <core::Storage T>
void add_into(const Context& ctx, const T* a, const T* b, T* y, std::size_t count, bool relu)
{
    if (count == 0) return;
    const auto launch = [&](auto r) {
        constexpr bool R = decltype(r)::value;
        if constexpr (std::same_as<T, float>) {
            const auto s = ctx.stream();
            detail::in_moves(
                detail::quad_aligned(a, b, y), count, 4,
                [&](std::size_t quads) {
                    kernels::add_into4<R><<<detail::blocks_for(quads), detail::kThreads, 0, s>>>(
                        reinterpret_cast<const float4*>(a), reinterpret_cast<const float4*>(b), reinterpret_cast<float4*>(y),
                        quads);
                },
                [&](std::size_t done) {
                    kernels::add_into<R><<<detail::blocks_for(count - done), detail::kThreads, 0, s>>>(
                        a + done, b + done, y + done, count - done);
                });
            detail::check_launch("add_into");
        } else {
            detail::map2<kernels::PlusRelu<R>>(ctx, a, b, y, count, "add_into");
        }
    };
    if (relu) launch(std::true_type{});
    else launch(std::false_type{});
}

} // namespace replica::backend::cuda
