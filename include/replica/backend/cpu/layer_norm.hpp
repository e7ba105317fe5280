#pragma once
// Layer normalisation on the CPU: `rows` rows of `features` values, each normalised on its own
// (layers/layer_norm.hpp). x, y, dy, dx are T (core::Storage), loaded as float; the weight, the bias,
// their gradients and the per-row statistics are float. Sums in float, in row order.

#include <cmath>
#include <cstddef>
#include <type_traits>

#include "replica/backend/cpu/context.hpp"
#include "replica/core/config.hpp"
#include "replica/core/number.hpp"

namespace REPLICA_NAMESPACE::backend::cpu {

// y = (x - mean) * rstd * w + b per row, rstd = 1 / sqrt(biased var + eps); w, b null: 1 and 0.
// mean and rstd (rows floats each) assigned, for backward.
template <core::Storage T>
void layer_norm_forward(const Context&, const T* x, T* y, const float* w, const float* b, std::size_t rows,
                        std::size_t features, float eps, float* mean, float* rstd)
{
    for (std::size_t r = 0; r < rows; ++r) {
        const T* xr = x + r * features;
        T* yr = y + r * features;
        float sum = 0.0f;
        for (std::size_t f = 0; f < features; ++f) sum += core::to_float(xr[f]);
        const float m = sum / float(features);
        float squares = 0.0f;
        for (std::size_t f = 0; f < features; ++f) {
            const float c = core::to_float(xr[f]) - m;
            squares += c * c;
        }
        const float s = 1.0f / std::sqrt(squares / float(features) + eps);
        for (std::size_t f = 0; f < features; ++f) {
            const float h = (core::to_float(xr[f]) - m) * s;
            yr[f] = core::from_float<T>(w ? h * w[f] + b[f] : h);
        }
        mean[r] = m;
        rstd[r] = s;
    }
}

// From forward's mean and rstd: dx = rstd * (g - mean(g) - xhat * mean(g xhat)) with g = dy * w
// (dx may be null); dw = sum over rows of dy * xhat, db = sum of dy (both assigned; null without
// affine, w then null too).
template <core::Storage T>
void layer_norm_backward(const Context&, const T* x, const T* dy, const float* w, const float* mean, const float* rstd,
                         std::type_identity_t<T>* dx, float* dw, float* db, std::size_t rows, std::size_t features)
{
    if (dw) {
        for (std::size_t f = 0; f < features; ++f) dw[f] = 0.0f, db[f] = 0.0f;
        for (std::size_t r = 0; r < rows; ++r)
            for (std::size_t f = 0; f < features; ++f) {
                const float d = core::to_float(dy[r * features + f]);
                dw[f] += d * (core::to_float(x[r * features + f]) - mean[r]) * rstd[r];
                db[f] += d;
            }
    }
    if (!dx) return;
    for (std::size_t r = 0; r < rows; ++r) {
        const T* xr = x + r * features;
        const T* dyr = dy + r * features;
        float sum_g = 0.0f, sum_gh = 0.0f;
        for (std::size_t f = 0; f < features; ++f) {
            const float g = core::to_float(dyr[f]) * (w ? w[f] : 1.0f);
            sum_g += g;
            sum_gh += g * (core::to_float(xr[f]) - mean[r]) * rstd[r];
        }
        const float mg = sum_g / float(features), mgh = sum_gh / float(features);
        for (std::size_t f = 0; f < features; ++f) {
            const float g = core::to_float(dyr[f]) * (w ? w[f] : 1.0f);
            const float h = (core::to_float(xr[f]) - mean[r]) * rstd[r];
            dx[r * features + f] = core::from_float<T>(rstd[r] * (g - mg - h * mgh));
        }
    }
}

} // namespace replica::backend::cpu
