#pragma once
// Optimizer updates on the GPU: one fused pass over parameters, gradients and state.

#include <cstddef>

#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/launch.hpp"

namespace replica::backend::cuda {

namespace kernels {
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
} // namespace kernels

// The CPU backend's rule, PyTorch's SGD.
inline void sgd_update(const Context& ctx, float* w, const float* grad, float* v, std::size_t count, float lr,
                       float momentum, float weight_decay, bool nesterov)
{
    kernels::sgd<<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(w, grad, v, count, lr, momentum,
                                                                                 weight_decay, nesterov);
    detail::check_launch("sgd");
}

} // namespace replica::backend::cuda
