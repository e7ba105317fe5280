#pragma once
// The batch normalisation family (layers/normalization.hpp; what every family shares:
// kernels/kernels.hpp). The rules both backends compute alike (the running estimates, how a ReLU after
// the normalisation reaches backward) are backend/batch_norm_rules.hpp's.
//
// x (n, c, inner) and y, dy, dx (and the addend) are of the model's element type T, activations in
// the context's layout, read as float, each output rounded once; weight, bias, mean, invstd, the
// running estimates, the sums and dparams are float arrays of c (sums: as each op says). Per-channel
// sums run in an order that depends on the shape only, so they are the same every run (each backend
// says in what precision). `scratch` is context memory of at least batch_norm_scratch<T>(ctx, c)
// floats, the op's own for the call.

#include <concepts>
#include <cstddef>

#include "replica/backend/batch_norm_rules.hpp"
#include "replica/core/config.hpp"
#include "replica/core/number.hpp"

namespace REPLICA_NAMESPACE::backend::kernels {

// The family for activations of type T. batch_norm_scratch is host work; the other ops are queued.
template <class C, class T>
concept NormalizationKernelsFor = core::Storage<T> &&
    requires(const C& ctx, const T* x, T* y, const T* dy, T* dx, const T* addend, std::size_t n, std::size_t c,
             std::size_t inner, const float* shift, float* sums, const float* summed, float* scratch,
             StatisticsUpdate then, float* running_mean, float* running_var, const float* running_mean_in,
             const float* running_var_in, Momentum momentum, float eps, float* mean, float* invstd,
             const float* weight, const float* bias, const float* mean_in, const float* invstd_in, float* dparams,
             const float* count, float scale, double ratio, double values, bool relu, ReluAfter<T> relu_after) {
        // Floats of scratch the per-channel sums of c channels need.
        { batch_norm_scratch<T>(ctx, c) } -> std::same_as<std::size_t>;
        // sums (2c + 1) = [sum of x - shift[ch] (c) | sum of its square (c) | n * inner], assigned; with
        // `then` (not empty), batch_norm_statistics from these sums too, into then's arrays.
        batch_norm_sums(ctx, x, n, c, inner, shift, sums, scratch);
        batch_norm_sums(ctx, x, n, c, inner, shift, sums, scratch, then);
        // From sums (2c + 1, over the whole batch, around the running mean): mean and invstd
        // (1 / sqrt(biased variance + eps)) assigned, and the running estimates moved `momentum` of the
        // way to the batch's mean and unbiased variance (batch_statistics, each channel).
        batch_norm_statistics(ctx, summed, running_mean, running_var, momentum, eps, mean, invstd, c);
        // The reproducible mode, a micro-shard's share of its step's sums: sums[i] = summed[i] * scale,
        // i < 2c.
        batch_norm_shard_sums(ctx, summed, sums, scale, c);
        // The reproducible mode, once a step, from the shards' summed shares (2c): the batch's mean is
        // running_mean + summed[ch] * ratio, its biased variance summed[c + ch] * ratio - (summed[ch] *
        // ratio)^2, over `values` values; the running estimates moved `momentum` of the way (move_running).
        batch_norm_step_statistics(ctx, summed, running_mean, running_var, momentum, ratio, values, c);
        // Evaluation: mean = the running mean, invstd = 1 / sqrt(running variance + eps), assigned.
        batch_norm_running(ctx, running_mean_in, running_var_in, eps, mean, invstd, c);
        // y = weight * (x - mean) * invstd + bias, plus addend (null: none) in float, then max(y, 0)
        // when relu; rounded once.
        batch_norm_apply(ctx, x, y, n, c, inner, weight, bias, mean_in, invstd_in, relu, addend);
        // dparams (2c) = [sum of dy * xhat | sum of dy], xhat = (x - mean) * invstd, assigned. With
        // relu_after (not empty), dy is the gradient of the ReLU after the normalisation, read through
        // its mask (ReluAfter: recomputed from x, or read from its output y, the masked gradient then
        // also written to relu_after.dz).
        batch_norm_backward_sums(ctx, x, dy, n, c, inner, mean_in, invstd_in, dparams, scratch, relu_after);
        // dx = weight * invstd * (dy - sum dy / N - xhat * sum(dy * xhat) / N), assigned, from summed
        // (2c: batch_norm_backward_sums' over the whole batch) and N = *count (context memory). A ReLU
        // only from x: after one read from y, pass the masked gradient the sums wrote as dy.
        batch_norm_backward_input(ctx, x, dy, dx, n, c, inner, weight, mean_in, invstd_in, summed, count,
                                  relu_after);
    };

// The family for every element type of activations.
template <class C>
concept NormalizationKernels = NormalizationKernelsFor<C, float> && NormalizationKernelsFor<C, core::bf16> &&
                               NormalizationKernelsFor<C, core::fp16>;

} // namespace replica::backend::kernels
