#pragma once
// Batch normalisation kernels on the CPU (layers/normalization.hpp). x is (n, c, inner); per-channel
// sums run in double, in a fixed order.

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "replica/backend/batch_norm_rules.hpp"
#include "replica/backend/cpu/context.hpp"

namespace replica::backend::cpu {

// The per-channel sums need no scratch here.
inline std::size_t batch_norm_scratch(const Context&, std::size_t) { return 0; }

// sums = [sum of (x - shift[c]) (c) | sum of its square (c) | n * inner].
inline void batch_norm_sums(const Context&, const float* x, std::size_t n, std::size_t c, std::size_t inner,
                            const float* shift, float* sums, float*)
{
    for (std::size_t ch = 0; ch < c; ++ch) {
        double s1 = 0.0, s2 = 0.0;
        for (std::size_t i = 0; i < n; ++i) {
            const float* p = x + (i * c + ch) * inner;
            for (std::size_t j = 0; j < inner; ++j) {
                const double d = double(p[j]) - double(shift[ch]);
                s1 += d;
                s2 += d * d;
            }
        }
        sums[ch] = float(s1);
        sums[c + ch] = float(s2);
    }
    sums[2 * c] = float(n * inner);
}

// From sums (over the whole batch): the batch mean, 1 / sqrt(biased var + eps), and the running
// estimates moved `momentum` of the way to the mean and the unbiased variance (momentum 0: left as
// they are).
inline void batch_norm_statistics(const Context&, const float* sums, float* running_mean, float* running_var,
                                  float momentum, float eps, float* mean, float* invstd, std::size_t c)
{
    const double count = sums[2 * c];
    for (std::size_t ch = 0; ch < c; ++ch) {
        const double d = count > 0 ? sums[ch] / count : 0.0;
        const double var = count > 0 ? std::max(0.0, sums[c + ch] / count - d * d) : 0.0;
        const double m = double(running_mean[ch]) + d;
        mean[ch] = float(m);
        invstd[ch] = float(1.0 / std::sqrt(var + double(eps)));
        if (momentum != 0.0f) move_running(running_mean[ch], running_var[ch], m, var, count, momentum);
    }
}

// The reproducible mode. A micro-shard's share of the step's sums: out = sums[0, 2c) * scale.
inline void batch_norm_shard_sums(const Context&, const float* sums, float* out, float scale, std::size_t c)
{
    for (std::size_t i = 0; i < 2 * c; ++i) out[i] = sums[i] * scale;
}
// Once a step, from the shards' summed shares: the batch's mean is running_mean + sums[ch] * ratio,
// its biased variance sums[c + ch] * ratio - (sums[ch] * ratio)^2, over count values.
inline void batch_norm_step_statistics(const Context&, const float* sums, float* running_mean, float* running_var,
                                       float momentum, double ratio, double count, std::size_t c)
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

// y = weight * (x - mean) * invstd + bias, then max(y, 0) when relu.
inline void batch_norm_apply(const Context&, const float* x, float* y, std::size_t n, std::size_t c, std::size_t inner,
                             const float* weight, const float* bias, const float* mean, const float* invstd, bool relu)
{
    for (std::size_t i = 0; i < n; ++i)
        for (std::size_t ch = 0; ch < c; ++ch) {
            const float scale = weight[ch] * invstd[ch], shift = bias[ch] - mean[ch] * scale;
            const float* p = x + (i * c + ch) * inner;
            float* q = y + (i * c + ch) * inner;
            for (std::size_t j = 0; j < inner; ++j) {
                const float v = p[j] * scale + shift;
                q[j] = relu && v < 0.0f ? 0.0f : v;
            }
        }
}

// dparams = [sum of dy * xhat (c) | sum of dy (c)], xhat = (x - mean) * invstd.
inline void batch_norm_backward_sums(const Context&, const float* x, const float* dy, std::size_t n, std::size_t c,
                                     std::size_t inner, const float* mean, const float* invstd, float* dparams, float*)
{
    for (std::size_t ch = 0; ch < c; ++ch) {
        double sdy = 0.0, sdyx = 0.0;
        for (std::size_t i = 0; i < n; ++i) {
            const float* p = x + (i * c + ch) * inner;
            const float* d = dy + (i * c + ch) * inner;
            for (std::size_t j = 0; j < inner; ++j) {
                sdy += d[j];
                sdyx += double(d[j]) * (double(p[j]) - double(mean[ch]));
            }
        }
        dparams[ch] = float(sdyx * invstd[ch]);
        dparams[c + ch] = float(sdy);
    }
}

// dx = weight * invstd * (dy - sum dy / N - xhat * sum(dy * xhat) / N), sums = [sum dy*xhat | sum dy]
// over the whole batch of *count elements a channel.
inline void batch_norm_backward_input(const Context&, const float* x, const float* dy, float* dx, std::size_t n,
                                      std::size_t c, std::size_t inner, const float* weight, const float* mean,
                                      const float* invstd, const float* sums, const float* count)
{
    const float inv_count = 1.0f / *count;
    for (std::size_t ch = 0; ch < c; ++ch) {
        const float k = weight[ch] * invstd[ch];
        const float mdy = sums[c + ch] * inv_count, mdyx = sums[ch] * inv_count;
        for (std::size_t i = 0; i < n; ++i) {
            const float* p = x + (i * c + ch) * inner;
            const float* d = dy + (i * c + ch) * inner;
            float* q = dx + (i * c + ch) * inner;
            for (std::size_t j = 0; j < inner; ++j) {
                const float xhat = (p[j] - mean[ch]) * invstd[ch];
                q[j] = k * (d[j] - mdy - xhat * mdyx);
            }
        }
    }
}

} // namespace replica::backend::cpu
