#pragma once
// Optimizer updates on the CPU, one pass over parameters, gradients and state, each value updated
// alone (on the backend's threads, threads.hpp, with one thread's bits).

#include <cmath>
#include <cstddef>
#include <span>

#include "replica/backend/cpu/context.hpp"
#include "replica/backend/cpu/threads.hpp"
#include "replica/backend/cpu/vectorized.hpp"
#include "replica/core/config.hpp"
#include "replica/core/param_kind.hpp"

namespace REPLICA_NAMESPACE::backend::cpu {

// The updates go segment by segment (core/param_kind.hpp): parameter begin + j of a segment, its
// gradient (at begin + j, or at its state index with GradientAt::state) and its state (at state index
// state + j); the segment's decay and lr_scale multiply the weight decay and the learning rate.
inline std::size_t gradient_index(const core::ParamSegment& s, core::GradientAt at)
{
    return at == core::GradientAt::params ? s.begin : s.state;
}

// SGD as PyTorch defines it (dampening 0):
//   g = grad + wd * w;  v = momentum * v + g;  w -= lr * (nesterov ? g + momentum * v : v)
inline void sgd_update(const Context&, float* w, const float* grad, float* velocity,
                       std::span<const core::ParamSegment> segments, core::GradientAt at, float lr, float momentum,
                       float weight_decay, bool nesterov)
{
    for (const core::ParamSegment& s : segments) {
        float* ws = w + s.begin;
        const float* gs = grad + gradient_index(s, at);
        float* v = velocity + s.state;
        const float wd = weight_decay * s.decay, rate = lr * s.lr_scale;
        parallel_values(s.count, [&](std::size_t begin, std::size_t end) {
            vectorized([&] {
                for (std::size_t i = begin; i < end; ++i) {
                    const float g = gs[i] + wd * ws[i];
                    const float vi = momentum * v[i] + g;
                    v[i] = vi;
                    ws[i] -= rate * (nesterov ? g + momentum * vi : vi);
                }
            });
        });
    }
}

// Adam as PyTorch defines it (torch.optim.Adam and AdamW, amsgrad off), the bias corrections
// computed by the caller from the step count t:
//   AdamW (decoupled):  w *= 1 - lr * wd;   g = grad
//   Adam:               g = grad + wd * w
//   m = beta1 * m + (1 - beta1) * g;   v = beta2 * v + (1 - beta2) * g^2
//   w -= step_size * m / (sqrt(v) / bias2_sqrt + eps)
// with step_size = lr / (1 - beta1^t) and bias2_sqrt = sqrt(1 - beta2^t), lr and step_size scaled by
// the segment's lr_scale. state holds (m, v) per trainable parameter, interleaved (2 floats at 2 *
// state index): the layout does not depend on how the model slices its parameters for the update.
inline void adam_update(const Context&, float* w, const float* grad, float* state,
                        std::span<const core::ParamSegment> segments, core::GradientAt at, float lr, float beta1,
                        float beta2, float eps, float weight_decay, bool decoupled, float step_size, float bias2_sqrt)
{
    for (const core::ParamSegment& s : segments) {
        float* ws = w + s.begin;
        const float* gs = grad + gradient_index(s, at);
        float* mv = state + 2 * s.state;
        const float wd = weight_decay * s.decay, rate = lr * s.lr_scale, step = step_size * s.lr_scale;
        const float shrink = 1.0f - rate * wd;
        parallel_values(s.count, [&](std::size_t begin, std::size_t end) {
            vectorized([&] {
                for (std::size_t i = begin; i < end; ++i) {
                    float g = gs[i];
                    if (decoupled) ws[i] *= shrink;
                    else g += wd * ws[i];
                    float& m = mv[2 * i];
                    float& v = mv[2 * i + 1];
                    m = beta1 * m + (1.0f - beta1) * g;
                    v = beta2 * v + (1.0f - beta2) * g * g;
                    ws[i] -= step * m / (std::sqrt(v) / bias2_sqrt + eps);
                }
            });
        });
    }
}

// Gradient accumulation into a sum kept at the state indices: acc[state + j] += grad[begin + j];
// then, when `last`, acc *= scale (the mean over the batches).
inline void accumulate_gradient(const Context&, const float* grad, float* acc, std::span<const core::ParamSegment> segments,
                                bool last, float scale)
{
    for (const core::ParamSegment& s : segments) {
        const float* g = grad + s.begin;
        float* a = acc + s.state;
        parallel_values(s.count, [&](std::size_t begin, std::size_t end) {
            vectorized([&] {
                for (std::size_t i = begin; i < end; ++i) a[i] = last ? (a[i] + g[i]) * scale : a[i] + g[i];
            });
        });
    }
}

// *squares = the sum of g[i]^2 over g's count values, in double, in index order.
inline void sum_of_squares(const Context&, const float* g, std::size_t count, double* squares)
{
    vectorized([&] {
        double s = 0.0;
        for (std::size_t i = 0; i < count; ++i) s += double(g[i]) * double(g[i]);
        *squares = s;
    });
}

// g *= max_norm / (norm + 1e-6) when norm = sqrt(*squares) exceeds max_norm.
inline void clip_to_norm(const Context&, float* g, std::size_t count, const double* squares, float max_norm)
{
    vectorized([&] {
        const double norm = std::sqrt(*squares);
        if (!(norm > double(max_norm))) return;
        const float scale = float(double(max_norm) / (norm + 1e-6));
        for (std::size_t i = 0; i < count; ++i) g[i] *= scale;
    });
}

// g *= max_norm / (|g| + 1e-6) when the L2 norm |g| exceeds max_norm (clip_grad_norm); the norm in double.
inline void clip_by_norm(const Context& ctx, float* g, std::size_t count, float max_norm)
{
    double squares = 0.0;
    sum_of_squares(ctx, g, count, &squares);
    clip_to_norm(ctx, g, count, &squares, max_norm);
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
