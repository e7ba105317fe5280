#pragma once
// Batch normalisation kernels on the CPU (layers/normalization.hpp). x is (n, c, inner); per-channel
// sums run in double, in a fixed order.
//
// x, y, dy, dx are T (core::Storage), loaded as float; weight, bias, mean, invstd, the sums, the
// running estimates and dparams are float. A bf16/fp16 output element is round_through<T> of the float
// path's on the same inputs; the float outputs (sums, dparams) are the float path's bit for bit.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <optional>
#include <type_traits>

#include "replica/backend/batch_norm_rules.hpp"
#include "replica/backend/cpu/context.hpp"
#include "replica/core/config.hpp"
#include "replica/core/error.hpp"
#include "replica/core/number.hpp"

namespace REPLICA_NAMESPACE::backend::cpu {

// The per-channel sums need no scratch here, for any T.
template <class T = float>
std::size_t batch_norm_scratch(const Context&, std::size_t)
{
    static_assert(core::Storage<T>, "activations are float, core::bf16 or core::fp16");
    return 0;
}

// From sums (over the whole batch): the batch mean, 1 / sqrt(biased var + eps), and the running
// estimates moved `momentum` of the way to the mean and the unbiased variance (momentum 0: left as
// they are): batch_statistics for each channel.
inline void batch_norm_statistics(const Context&, const float* sums, float* running_mean, float* running_var,
                                  Momentum momentum, float eps, float* mean, float* invstd, std::size_t c)
{
    for (std::size_t ch = 0; ch < c; ++ch)
        batch_statistics(sums[ch], sums[c + ch], sums[2 * c], running_mean[ch], running_var[ch], momentum, eps, mean[ch],
                         invstd[ch]);
}

// sums = [sum of (x - shift[c]) (c) | sum of its square (c) | n * inner].
// then (not empty): batch_norm_statistics from these sums too.
template <core::Storage T>
void batch_norm_sums(const Context& ctx, const T* x, std::size_t n, std::size_t c, std::size_t inner, const float* shift,
                     float* sums, float*, StatisticsUpdate then = {})
{
    for (std::size_t ch = 0; ch < c; ++ch) {
        double s1 = 0.0, s2 = 0.0;
        for (std::size_t i = 0; i < n; ++i) {
            const T* p = x + (i * c + ch) * inner;
            for (std::size_t j = 0; j < inner; ++j) {
                const double d = double(core::to_float(p[j])) - double(shift[ch]);
                s1 += d;
                s2 += d * d;
            }
        }
        sums[ch] = float(s1);
        sums[c + ch] = float(s2);
    }
    sums[2 * c] = float(n * inner);
    if (then)
        batch_norm_statistics(ctx, sums, then.running_mean, then.running_var, then.momentum, then.eps, then.mean,
                              then.invstd, c);
}

// The reproducible mode. A micro-shard's share of the step's sums: out = sums[0, 2c) * scale.
inline void batch_norm_shard_sums(const Context&, const float* sums, float* out, float scale, std::size_t c)
{
    for (std::size_t i = 0; i < 2 * c; ++i) out[i] = sums[i] * scale;
}
// Once a step, from the shards' summed shares: the batch's mean is running_mean + sums[ch] * ratio,
// its biased variance sums[c + ch] * ratio - (sums[ch] * ratio)^2, over count values.
inline void batch_norm_step_statistics(const Context&, const float* sums, float* running_mean, float* running_var,
                                       Momentum momentum, double ratio, double count, std::size_t c)
{
    for (std::size_t ch = 0; ch < c; ++ch) {
        const double d = sums[ch] * ratio;
        const double var = std::max(0.0, sums[c + ch] * ratio - d * d);
        move_running(running_mean[ch], running_var[ch], double(running_mean[ch]) + d, var, count, momentum);
    }
}

// Evaluation: the running estimates as mean and 1 / sqrt(var + eps).
inline void batch_norm_running(const Context&, const float* running_mean, const float* running_var, float eps,
                               float* mean, float* invstd, std::size_t c)
{
    for (std::size_t ch = 0; ch < c; ++ch) {
        mean[ch] = running_mean[ch];
        invstd[ch] = float(1.0 / std::sqrt(double(running_var[ch]) + double(eps)));
    }
}

namespace detail {
// A channel's normalisation y = x * scale + shift (before an addend and the ReLU), as
// batch_norm_apply computes it and the backward's ReLU mask recomputes it.
struct Normalization {
    float scale, shift;
    Normalization(const float* weight, const float* bias, const float* mean, const float* invstd, std::size_t ch)
        : scale(weight[ch] * invstd[ch]), shift(bias[ch] - mean[ch] * scale)
    {
    }
    float operator()(float v) const { return v * scale + shift; }
};
} // namespace detail

// y = weight * (x - mean) * invstd + bias, plus addend (null: nothing) in float, then max(y, 0) when
// relu; rounded to T once.
template <core::Storage T>
void batch_norm_apply(const Context&, const T* x, T* y, std::size_t n, std::size_t c, std::size_t inner,
                      const float* weight, const float* bias, const float* mean, const float* invstd, bool relu,
                      const std::type_identity_t<T>* addend = nullptr)
{
    for (std::size_t i = 0; i < n; ++i)
        for (std::size_t ch = 0; ch < c; ++ch) {
            const detail::Normalization normalize(weight, bias, mean, invstd, ch);
            const std::size_t at = (i * c + ch) * inner;
            for (std::size_t j = 0; j < inner; ++j) {
                float v = normalize(core::to_float(x[at + j]));
                if (addend) v += core::to_float(addend[at + j]);
                y[at + j] = core::from_float<T>(relu && v < 0.0f ? 0.0f : v);
            }
        }
}

namespace detail {
// dy[j] as float, or with the ReLU after the normalisation relu_backward's rule on the ReLU's output:
// dy[j] where that output > 0, else 0. The output is recomputed from x[j] (mask: the channel's
// normalisation) as batch_norm_apply rounds it, or read from y (not null), the value then written to
// dz[j].
template <core::Storage T>
float masked_dy(const T* x, const T* dy, std::size_t j, const Normalization* mask, const T* y = nullptr, T* dz = nullptr)
{
    const float d = core::to_float(dy[j]);
    if (y != nullptr) {
        const float g = core::to_float(y[j]) > 0.0f ? d : 0.0f;
        dz[j] = core::from_float<T>(g);
        return g;
    }
    if (mask == nullptr) return d;
    const float u = (*mask)(core::to_float(x[j]));
    return core::to_float(core::from_float<T>(u < 0.0f ? 0.0f : u)) > 0.0f ? d : 0.0f;
}
template <core::Storage T>
std::optional<Normalization> relu_mask(const ReluAfter<T>& relu, const float* mean, const float* invstd, std::size_t ch)
{
    if (!relu.from_x()) return std::nullopt;
    return Normalization(relu.weight, relu.bias, mean, invstd, ch);
}
} // namespace detail

// dparams = [sum of dy * xhat (c) | sum of dy (c)], xhat = (x - mean) * invstd. With relu
// (batch_norm_rules.hpp), dy is the ReLU's output gradient, and the sums are of relu_backward(y, dy)'s
// values in its place, the same bits (with relu.from_y() written to relu.dz).
template <core::Storage T>
void batch_norm_backward_sums(const Context&, const T* x, const T* dy, std::size_t n, std::size_t c, std::size_t inner,
                              const float* mean, const float* invstd, float* dparams, float*,
                              ReluAfter<std::type_identity_t<T>> relu = {})
{
    for (std::size_t ch = 0; ch < c; ++ch) {
        double sdy = 0.0, sdyx = 0.0;
        const auto mask = detail::relu_mask(relu, mean, invstd, ch);
        for (std::size_t i = 0; i < n; ++i) {
            const std::size_t at = (i * c + ch) * inner;
            const T* p = x + at;
            const T* d = dy + at;
            const T* y = relu.y ? relu.y + at : nullptr;
            T* dz = relu.dz ? relu.dz + at : nullptr;
            for (std::size_t j = 0; j < inner; ++j) {
                const float dj = detail::masked_dy(p, d, j, mask ? &*mask : nullptr, y, dz);
                sdy += dj;
                sdyx += double(dj) * (double(core::to_float(p[j])) - double(mean[ch]));
            }
        }
        dparams[ch] = float(sdyx * invstd[ch]);
        dparams[c + ch] = float(sdy);
    }
}

// dx = weight * invstd * (dy - sum dy / N - xhat * sum(dy * xhat) / N), sums = [sum dy*xhat | sum dy]
// over the whole batch of *count elements a channel. relu: as for batch_norm_backward_sums, recomputed
// from x only (after a ReLU read from y, dy is the masked gradient the sums wrote).
template <core::Storage T>
void batch_norm_backward_input(const Context&, const T* x, const T* dy, T* dx, std::size_t n, std::size_t c,
                               std::size_t inner, const float* weight, const float* mean, const float* invstd,
                               const float* sums, const float* count, ReluAfter<std::type_identity_t<T>> relu = {})
{
    core::require(!relu.from_y(), "batch_norm_backward_input: a ReLU read from its output is the sums' to apply; pass "
                                  "the masked gradient they wrote as dy");
    const float inv_count = 1.0f / *count;
    for (std::size_t ch = 0; ch < c; ++ch) {
        const float k = weight[ch] * invstd[ch];
        const float mdy = sums[c + ch] * inv_count, mdyx = sums[ch] * inv_count;
        const auto mask = detail::relu_mask(relu, mean, invstd, ch);
        for (std::size_t i = 0; i < n; ++i) {
            const std::size_t at = (i * c + ch) * inner;
            const T* p = x + at;
            const T* d = dy + at;
            T* q = dx + at;
            for (std::size_t j = 0; j < inner; ++j) {
                const float xhat = (core::to_float(p[j]) - mean[ch]) * invstd[ch];
                q[j] = core::from_float<T>(k * (detail::masked_dy(p, d, j, mask ? &*mask : nullptr) - mdy - xhat * mdyx));
            }
        }
    }
}

} // namespace replica::backend::cpu
