#pragma once
// The optimizer family (train/sgd.hpp, train/adam.hpp, train/accumulate.hpp, train/clip.hpp,
// train/loss_scale.hpp; what every family shares: kernels/kernels.hpp): updates of float parameters
// from float gradients, segment by segment. A segment (core/param_kind.hpp, made by the model's
// UpdatePlan: model/param_layout.hpp) names parameters [begin, begin + count) of the slice w, their
// gradients (at the same index, or at their state index with GradientAt::state), their state from
// state index `state`, and the factors on the weight decay (decay) and the learning rate (lr_scale).
// Parameters that no segment names (frozen) are not touched. Every op computes each value from the
// values at its own index: the result does not depend on how the work is split.

#include <concepts>
#include <cstddef>
#include <span>

#include "replica/core/config.hpp"
#include "replica/core/param_kind.hpp"

namespace REPLICA_NAMESPACE::backend::kernels {

template <class C>
concept OptimizerKernels =
    requires(const C& ctx, float* w, const float* grad, float* g, float* state, float* acc,
             std::span<const core::ParamSegment> segments, core::GradientAt at, float lr, float momentum,
             float weight_decay, bool nesterov, float beta1, float beta2, float eps, bool decoupled, float step_size,
             float bias2_sqrt, bool last, float scale, std::size_t count, float max_norm, float inv_scale,
             double* squares) {
        // Queued. PyTorch's SGD (dampening 0), with wd = weight_decay * decay and rate = lr * lr_scale:
        // g' = g + wd w; v = momentum v + g'; w -= rate (nesterov ? g' + momentum v : v); v one float a
        // trainable parameter, at its state index.
        sgd_update(ctx, w, grad, state, segments, at, lr, momentum, weight_decay, nesterov);
        // Queued. PyTorch's Adam (decoupled false: g' = g + wd w) and AdamW (w *= 1 - rate wd), then
        // m = beta1 m + (1 - beta1) g'; v = beta2 v + (1 - beta2) g'^2;
        // w -= step_size lr_scale m / (sqrt(v) / bias2_sqrt + eps); (m, v) interleaved at 2 * state index.
        adam_update(ctx, w, grad, state, segments, at, lr, beta1, beta2, eps, weight_decay, decoupled, step_size,
                    bias2_sqrt);
        // Queued. acc[state + j] += grad[begin + j]; then, when last, acc *= scale.
        accumulate_gradient(ctx, grad, acc, segments, last, scale);
        // Queued. *squares = the sum of g[i]^2 over g's count floats, in double, in an order fixed by
        // count (the same bits on every run); squares is one double in the context's memory (the
        // device's on a GPU, outside the context's workspace).
        sum_of_squares(ctx, g, count, squares);
        // Queued. g (count floats) *= max_norm / (norm + 1e-6) where norm = sqrt(*squares) exceeds
        // max_norm; *squares as sum_of_squares leaves it (the whole gradient's, when g is a part of it).
        clip_to_norm(ctx, g, count, static_cast<const double*>(squares), max_norm);
        // Queued. g (count floats) *= max_norm / (|g| + 1e-6) where its L2 norm |g| exceeds max_norm:
        // sum_of_squares over g, then clip_to_norm, with no host round trip.
        clip_by_norm(ctx, g, count, max_norm);
        // g *= inv_scale; returns whether every value was finite before. Waits: the host needs the answer.
        { unscale_gradient(ctx, g, count, inv_scale) } -> std::same_as<bool>;
    };

} // namespace replica::backend::kernels
