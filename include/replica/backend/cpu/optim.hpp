#pragma once
// Optimizer updates on the CPU, one pass over parameters, gradients and state.

#include <cstddef>

#include "replica/backend/cpu/context.hpp"

namespace replica::backend::cpu {

// SGD as PyTorch defines it (dampening 0):
//   g = grad + wd * w;  v = momentum * v + g;  w -= lr * (nesterov ? g + momentum * v : v)
inline void sgd_update(const Context&, float* w, const float* grad, float* v, std::size_t count, float lr,
                       float momentum, float weight_decay, bool nesterov)
{
    for (std::size_t i = 0; i < count; ++i) {
        const float g = grad[i] + weight_decay * w[i];
        const float vi = momentum * v[i] + g;
        v[i] = vi;
        w[i] -= lr * (nesterov ? g + momentum * vi : vi);
    }
}

} // namespace replica::backend::cpu
