#pragma once
// Batch normalisation and the residual merge on the GPU (layers/normalization.hpp, model/residual.hpp).
// x is (n, c, inner). Per-channel sums: one block per channel, each thread summing a fixed stride of
// the channel's elements in double, then a block tree of fixed shape: the same bits every run.

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/elementwise.hpp"
#include "replica/backend/cuda/launch.hpp"

namespace replica::backend::cuda {

namespace kernels {
__global__ void batch_norm_sums(const float* x, std::size_t n, std::size_t c, std::size_t inner, const float* shift,
                                float* sums)
{
    __shared__ double lane[detail::kThreads];
    const std::size_t ch = blockIdx.x, count = n * inner;
    const double k = shift[ch];
    double s1 = 0.0, s2 = 0.0;
    for (std::size_t e = threadIdx.x; e < count; e += blockDim.x) {
        const std::size_t i = e / inner, j = e - i * inner;
        const double d = double(x[(i * c + ch) * inner + j]) - k;
        s1 += d;
        s2 += d * d;
    }
    const auto plus = [](double a, double b) { return a + b; };
    s1 = detail::block_reduce(lane, s1, plus);
    __syncthreads();
    s2 = detail::block_reduce(lane, s2, plus);
    if (threadIdx.x == 0) {
        sums[ch] = float(s1);
        sums[c + ch] = float(s2);
        if (ch == 0) sums[2 * c] = float(count);
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
    const double unbiased = count > 1 ? var * count / (count - 1) : var;
    running_mean[ch] = float((1.0 - momentum) * running_mean[ch] + momentum * m);
    running_var[ch] = float((1.0 - momentum) * running_var[ch] + momentum * unbiased);
}

__global__ void batch_norm_running(const float* running_mean, const float* running_var, float eps, float* mean,
                                   float* invstd, std::size_t c)
{
    const std::size_t ch = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
    if (ch >= c) return;
    mean[ch] = running_mean[ch];
    invstd[ch] = float(1.0 / sqrt(double(running_var[ch]) + double(eps)));
}

template <bool Relu, class I>
__global__ void batch_norm_apply(const float* x, float* y, I count, I c, I inner, const float* weight, const float* bias,
                                 const float* mean, const float* invstd)
{
    REPLICA_GRID_LOOP_AS(I, e, count)
    {
        const I ch = (e / inner) % c;
        const float scale = weight[ch] * invstd[ch];
        const float v = x[e] * scale + (bias[ch] - mean[ch] * scale);
        y[e] = Relu && v < 0.0f ? 0.0f : v;
    }
}

__global__ void batch_norm_backward_sums(const float* x, const float* dy, std::size_t n, std::size_t c, std::size_t inner,
                                         const float* mean, const float* invstd, float* dparams)
{
    __shared__ double lane[detail::kThreads];
    const std::size_t ch = blockIdx.x, count = n * inner;
    const double m = mean[ch];
    double sdy = 0.0, sdyx = 0.0;
    for (std::size_t e = threadIdx.x; e < count; e += blockDim.x) {
        const std::size_t i = e / inner, j = e - i * inner, at = (i * c + ch) * inner + j;
        const double d = dy[at];
        sdy += d;
        sdyx += d * (double(x[at]) - m);
    }
    const auto plus = [](double a, double b) { return a + b; };
    sdy = detail::block_reduce(lane, sdy, plus);
    __syncthreads();
    sdyx = detail::block_reduce(lane, sdyx, plus);
    if (threadIdx.x == 0) {
        dparams[ch] = float(sdyx * invstd[ch]);
        dparams[c + ch] = float(sdy);
    }
}

template <class I>
__global__ void batch_norm_backward_input(const float* x, const float* dy, float* dx, I count, I c, I inner,
                                          const float* weight, const float* mean, const float* invstd, const float* sums,
                                          const float* elements)
{
    const float inv_count = 1.0f / *elements;
    REPLICA_GRID_LOOP_AS(I, e, count)
    {
        const I ch = (e / inner) % c;
        const float xhat = (x[e] - mean[ch]) * invstd[ch];
        dx[e] = weight[ch] * invstd[ch] * (dy[e] - sums[c + ch] * inv_count - xhat * sums[ch] * inv_count);
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
} // namespace kernels

inline void batch_norm_sums(const Context& ctx, const float* x, std::size_t n, std::size_t c, std::size_t inner,
                            const float* shift, float* sums)
{
    kernels::batch_norm_sums<<<unsigned(c), detail::kThreads, 0, ctx.stream()>>>(x, n, c, inner, shift, sums);
    detail::check_launch("batch_norm_sums");
}

inline void batch_norm_statistics(const Context& ctx, const float* sums, float* running_mean, float* running_var,
                                  float momentum, float eps, float* mean, float* invstd, std::size_t c)
{
    kernels::batch_norm_statistics<<<detail::blocks_for(c), detail::kThreads, 0, ctx.stream()>>>(
        sums, running_mean, running_var, momentum, eps, mean, invstd, c);
    detail::check_launch("batch_norm_statistics");
}

inline void batch_norm_running(const Context& ctx, const float* running_mean, const float* running_var, float eps,
                               float* mean, float* invstd, std::size_t c)
{
    kernels::batch_norm_running<<<detail::blocks_for(c), detail::kThreads, 0, ctx.stream()>>>(running_mean, running_var,
                                                                                             eps, mean, invstd, c);
    detail::check_launch("batch_norm_running");
}

inline void batch_norm_apply(const Context& ctx, const float* x, float* y, std::size_t n, std::size_t c,
                             std::size_t inner, const float* weight, const float* bias, const float* mean,
                             const float* invstd, bool relu)
{
    const std::size_t count = n * c * inner;
    if (count == 0) return;
    detail::indexed(count, [&](auto index) {
        using I = decltype(index);
        if (relu)
            kernels::batch_norm_apply<true, I><<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(
                x, y, I(count), I(c), I(inner), weight, bias, mean, invstd);
        else
            kernels::batch_norm_apply<false, I><<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(
                x, y, I(count), I(c), I(inner), weight, bias, mean, invstd);
    });
    detail::check_launch("batch_norm_apply");
}

inline void batch_norm_backward_sums(const Context& ctx, const float* x, const float* dy, std::size_t n, std::size_t c,
                                     std::size_t inner, const float* mean, const float* invstd, float* dparams)
{
    kernels::batch_norm_backward_sums<<<unsigned(c), detail::kThreads, 0, ctx.stream()>>>(x, dy, n, c, inner, mean,
                                                                                          invstd, dparams);
    detail::check_launch("batch_norm_backward_sums");
}

inline void batch_norm_backward_input(const Context& ctx, const float* x, const float* dy, float* dx, std::size_t n,
                                      std::size_t c, std::size_t inner, const float* weight, const float* mean,
                                      const float* invstd, const float* sums, const float* count)
{
    const std::size_t total = n * c * inner;
    if (total == 0) return;
    detail::indexed(total, [&](auto index) {
        using I = decltype(index);
        kernels::batch_norm_backward_input<I><<<detail::blocks_for(total), detail::kThreads, 0, ctx.stream()>>>(
            x, dy, dx, I(total), I(c), I(inner), weight, mean, invstd, sums, count);
    });
    detail::check_launch("batch_norm_backward_input");
}

// y = a + b, then the ReLU when relu.
inline void add_into(const Context& ctx, const float* a, const float* b, float* y, std::size_t count, bool relu)
{
    if (count == 0) return;
    const auto launch = [&](auto r) {
        constexpr bool R = decltype(r)::value;
        std::size_t done = 0;
        if (detail::quad_aligned(a, b, y) && count >= 4) {
            done = count / 4 * 4;
            kernels::add_into4<R><<<detail::blocks_for(count / 4), detail::kThreads, 0, ctx.stream()>>>(
                reinterpret_cast<const float4*>(a), reinterpret_cast<const float4*>(b), reinterpret_cast<float4*>(y),
                count / 4);
        }
        if (done < count)
            kernels::add_into<R><<<detail::blocks_for(count - done), detail::kThreads, 0, ctx.stream()>>>(
                a + done, b + done, y + done, count - done);
    };
    if (relu) launch(std::true_type{});
    else launch(std::false_type{});
    detail::check_launch("add_into");
}

} // namespace replica::backend::cuda
