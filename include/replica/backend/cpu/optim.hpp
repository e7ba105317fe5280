#pragma once
// Optimizer updates on the CPU, one pass over parameters, gradients and state.

#include <cmath>
#include <cstddef>

#include "replica/backend/cpu/context.hpp"
#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::backend::cpu {

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

// Adam as PyTorch defines it (torch.optim.Adam and AdamW, amsgrad off), the bias corrections
// computed by the caller from the step count t:
//   AdamW (decoupled):  w *= 1 - lr * wd;   g = grad
//   Adam:               g = grad + wd * w
//   m = beta1 * m + (1 - beta1) * g;   v = beta2 * v + (1 - beta2) * g^2
//   w -= step_size * m / (sqrt(v) / bias2_sqrt + eps)
// with step_size = lr / (1 - beta1^t) and bias2_sqrt = sqrt(1 - beta2^t). state holds (m, v) per
// parameter, interleaved (2 * count floats): the layout does not depend on how the model slices its
// parameters for the update.
inline void adam_update(const Context&, float* w, const float* grad, float* state, std::size_t count, float lr,
                        float beta1, float beta2, float eps, float weight_decay, bool decoupled, float step_size,
                        float bias2_sqrt)
{
    const float shrink = 1.0f - lr * weight_decay;
    for (std::size_t i = 0; i < count; ++i) {
        float g = grad[i];
        if (decoupled) w[i] *= shrink;
        else g += weight_decay * w[i];
        float& m = state[2 * i];
        float& v = state[2 * i + 1];
        m = beta1 * m + (1.0f - beta1) * g;
        v = beta2 * v + (1.0f - beta2) * g * g;
        w[i] -= step_size * m / (std::sqrt(v) / bias2_sqrt + eps);
    }
}

// Gradient accumulation: acc += g; then, when `last`, acc *= scale (the mean over the batches).
inline void accumulate_gradient(const Context&, const float* g, float* acc, std::size_t count, bool last, float scale)
{
    for (std::size_t i = 0; i < count; ++i) acc[i] = last ? (acc[i] + g[i]) * scale : acc[i] + g[i];
}

// g *= max_norm / (|g| + 1e-6) when the L2 norm |g| exceeds max_norm (clip_grad_norm); the norm in double.
inline void clip_by_norm(const Context&, float* g, std::size_t count, float max_norm)
{
    double squares = 0.0;
    for (std::size_t i = 0; i < count; ++i) squares += double(g[i]) * double(g[i]);
    const double norm = std::sqrt(squares);
    if (!(norm > double(max_norm))) return;
    const float scale = float(double(max_norm) / (norm + 1e-6));
    for (std::size_t i = 0; i < count; ++i) g[i] *= scale;
}

// Loss scaling's check and unscale (train/loss_scale.hpp), in one pass: g *= inv_scale. Returns
// whether every value of g was finite before the product; when one was not, the caller discards g.
inline bool unscale_gradient(const Context&, float* g, std::size_t count, float inv_scale)
{
    bool finite = true;
    for (std::size_t i = 0; i < count; ++i) {
        finite = finite && std::isfinite(g[i]);
        g[i] *= inv_scale;
    }
    return finite;
}

} // namespace replica::backend::cpu
