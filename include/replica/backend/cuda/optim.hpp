#pragma once
// Optimizer updates on the GPU: one fused pass over parameters, gradients and state.

#include <cstddef>

#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/launch.hpp"
#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::backend::cuda {

namespace kernels {
template <int = 0>
__global__ void sgd(float* w, const float* grad, float* v, std::size_t count, float lr, float momentum,
                    float weight_decay, bool nesterov)
{
    REPLICA_GRID_LOOP(i, count)
    {
        const float g = grad[i] + weight_decay * w[i];
        const float vi = momentum * v[i] + g;
        v[i] = vi;
        w[i] -= lr * (nesterov ? g + momentum * vi : vi);
    }
}
template <int = 0>
__global__ void adam(float* w, const float* grad, float2* mv, std::size_t count, float lr, float beta1,
                     float beta2, float eps, float weight_decay, bool decoupled, float step_size, float bias2_sqrt)
{
    const float shrink = 1.0f - lr * weight_decay;
    REPLICA_GRID_LOOP(i, count)
    {
        float g = grad[i];
        float wi = w[i];
        if (decoupled) wi *= shrink;
        else g += weight_decay * wi;
        float2 s = mv[i];
        s.x = beta1 * s.x + (1.0f - beta1) * g;
        s.y = beta2 * s.y + (1.0f - beta2) * g * g;
        mv[i] = s;
        w[i] = wi - step_size * s.x / (sqrtf(s.y) / bias2_sqrt + eps);
    }
}
template <int = 0>
__global__ void accumulate_gradient(const float* g, float* acc, std::size_t count, bool last, float scale)
{
    REPLICA_GRID_LOOP(i, count) acc[i] = last ? (acc[i] + g[i]) * scale : acc[i] + g[i];
}
} // namespace kernels

// The CPU backend's rule, PyTorch's SGD.
inline void sgd_update(const Context& ctx, float* w, const float* grad, float* v, std::size_t count, float lr,
                       float momentum, float weight_decay, bool nesterov)
{
    kernels::sgd<<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(w, grad, v, count, lr, momentum,
                                                                                 weight_decay, nesterov);
    detail::check_launch("sgd");
}

// The CPU backend's rule, PyTorch's Adam and AdamW: state holds (m, v) per parameter, interleaved
// (state is 8-byte aligned: the model's state buffer, at an even offset).
inline void adam_update(const Context& ctx, float* w, const float* grad, float* state, std::size_t count, float lr,
                        float beta1, float beta2, float eps, float weight_decay, bool decoupled, float step_size,
                        float bias2_sqrt)
{
    kernels::adam<<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(
        w, grad, reinterpret_cast<float2*>(state), count, lr, beta1, beta2, eps, weight_decay, decoupled, step_size, bias2_sqrt);
    detail::check_launch("adam");
}

// The CPU backend's rule: acc += g, then acc *= scale when `last`.
inline void accumulate_gradient(const Context& ctx, const float* g, float* acc, std::size_t count, bool last, float scale)
{
    kernels::accumulate_gradient<<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(g, acc, count, last,
                                                                                                 scale);
    detail::check_launch("accumulate_gradient");
}

namespace kernels {
// One block: the sum of squares (double, a block tree of fixed shape), then the scale, in place.
template <int = 0>
__global__ void clip_by_norm(float* g, std::size_t count, float max_norm)
{
    __shared__ double lane[detail::kThreads];
    double squares = 0.0;
    for (std::size_t i = threadIdx.x; i < count; i += blockDim.x) squares += double(g[i]) * double(g[i]);
    squares = detail::block_reduce(lane, squares, [](double a, double b) { return a + b; });
    const double norm = sqrt(squares);
    if (!(norm > double(max_norm))) return;
    const float scale = float(double(max_norm) / (norm + 1e-6));
    for (std::size_t i = threadIdx.x; i < count; i += blockDim.x) g[i] *= scale;
}
} // namespace kernels

// g *= max_norm / (|g| + 1e-6) when the L2 norm |g| exceeds max_norm (clip_grad_norm). One block
// reads the gradient twice: simple and deterministic, and small beside a step.
inline void clip_by_norm(const Context& ctx, float* g, std::size_t count, float max_norm)
{
    kernels::clip_by_norm<<<1, detail::kThreads, 0, ctx.stream()>>>(g, count, max_norm);
    detail::check_launch("clip_by_norm");
}

namespace kernels {
template <int = 0>
__global__ void unscale_gradient(float* g, std::size_t count, float inv_scale, int* non_finite)
{
    REPLICA_GRID_LOOP(i, count)
    {
        const float v = g[i];
        if (!isfinite(v)) *non_finite = 1;
        g[i] = v * inv_scale;
    }
}
} // namespace kernels

// The CPU backend's rule: g *= inv_scale, and whether every value of g was finite before. The host
// needs the answer (it decides whether the optimizer runs), so this waits for the compute stream.
inline bool unscale_gradient(const Context& ctx, float* g, std::size_t count, float inv_scale)
{
    core::Buffer<int> flag = ctx.allocate<int>(1);
    REPLICA_CHECK(cudaMemsetAsync(flag.data(), 0, sizeof(int), ctx.stream()));
    if (count > 0) {
        kernels::unscale_gradient<<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(g, count, inv_scale,
                                                                                                   flag.data());
        detail::check_launch("unscale_gradient");
    }
    int non_finite = 0;
    ctx.download(&non_finite, flag.data(), 1);
    ctx.synchronize();
    return non_finite == 0;
}

} // namespace replica::backend::cuda

