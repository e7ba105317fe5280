#pragma once
// The layer normalisation family (layers/layer_norm.hpp; what every family shares:
// kernels/kernels.hpp): `rows` rows of `features` values as stored, each normalised on its own. x, y
// and their gradients are of the model's element type T, computed in float, each output rounded once; the weight, the bias, their gradients and the per-row statistics are float. Sums run
// in an order that depends on the shape only, so every result is the same every run.

#include <concepts>
#include <cstddef>

#include "replica/core/config.hpp"
#include "replica/core/number.hpp"

namespace REPLICA_NAMESPACE::backend::kernels {

// The family for activations of type T. All ops are queued.
template <class C, class T>
concept LayerNormKernelsFor = core::Storage<T> &&
    requires(const C& ctx, const T* x, T* y, const T* dy, T* dx, const float* w, const float* b, std::size_t rows,
             std::size_t features, float eps, float* mean, float* rstd, const float* mean_in, const float* rstd_in,
             float* dw, float* db) {
        // y = (x - mean) * rstd * w + b per row (w and b null: 1 and 0, no affine), rstd = 1 / sqrt(biased
        // variance + eps); mean and rstd (rows floats each) assigned, for backward.
        layer_norm_forward(ctx, x, y, w, b, rows, features, eps, mean, rstd);
        // From forward's mean and rstd, with g = dy * w: dx = rstd * (g - mean(g) - xhat * mean(g xhat)),
        // assigned, or nothing where dx is null; dw (features) = the sum over rows of dy * xhat and db =
        // the sum of dy, assigned (both null without affine, and w then null too).
        layer_norm_backward(ctx, x, dy, w, mean_in, rstd_in, dx, dw, db, rows, features);
    };

// The family for every element type of activations.
template <class C>
concept LayerNormKernels =
    LayerNormKernelsFor<C, float> && LayerNormKernelsFor<C, core::bf16> && LayerNormKernelsFor<C, core::fp16>;

} // namespace replica::backend::kernels
