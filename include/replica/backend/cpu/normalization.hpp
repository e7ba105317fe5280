#pragma once
// Batch normalisation kernels on the CPU (layers/normalization.hpp). x is (n, c, inner); per-channel
// sums run in double, in an order fixed by the shape (detail::LaneSums). Every pass reads the tensors
// in memory order and has no branch per value, so that the compiler vectorises it.
//
// x, y, dy, dx are T (core::Storage), loaded as float; weight, bias, mean, invstd, the sums, the
// running estimates and dparams are float. A bf16/fp16 output element is round_through<T> of the float
// path's on the same inputs; the float outputs (sums, dparams) are the float path's bit for bit.

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <optional>
#include <type_traits>
#include <vector>

#include "replica/backend/batch_norm_rules.hpp"
#include "replica/backend/cpu/context.hpp"
#include "replica/backend/cpu/ops.hpp"
#include "replica/backend/cpu/threads.hpp"
#include "replica/backend/cpu/vectorized.hpp"
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

namespace detail {
// The per-channel sums run in double: a row (a channel's inner values of one sample) is read in
// blocks of at most row_block values, value j of a block added to lane j % sum_lanes of its channel's
// sums, and the lanes are added pairwise at the end. The order depends on the shape only and is kept
// for every T; the lanes are independent sums, which the compiler keeps in vector registers.
inline constexpr std::size_t sum_lanes = 8;
inline constexpr std::size_t row_block = 256;
static_assert(row_block % sum_lanes == 0, "a block starts at lane 0");

struct LaneSums {
    double lane[sum_lanes] = {};
    double total() const
    {
        return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    }
};
static_assert(sum_lanes == 8, "LaneSums::total adds eight lanes");

// 2c lane sums, zero, for a kernel's channels: the calling thread's, reused by its next call (no
// allocation once its largest c has run). The kernels read the rows in memory order (sample by
// sample, channel by channel), each channel's lanes kept here: every channel's sums are in the order
// above.
inline LaneSums* channel_sums(std::size_t c)
{
    thread_local std::vector<LaneSums> sums;
    sums.assign(2 * c, LaneSums{});
    return sums.data();
}

// Calls f(offset, count) for the blocks of a row of `inner` values.
template <class F>
void for_each_block(std::size_t inner, F&& f)
{
    for (std::size_t at = 0; at < inner; at += row_block) f(at, std::min(row_block, inner - at));
}

// dst[0, count) = from_float<T> of what f writes to a float block: in place for float.
template <core::Storage T, class F>
void write_floats(T* dst, std::size_t count, F&& f)
{
    if constexpr (std::same_as<T, float>) {
        f(dst);
    } else {
        float buffer[row_block];
        f(buffer);
        store_float(buffer, count, dst);
    }
}

// Over a block of count values, by lane: s1 += first(j) and s2 += second(j) (doubles).
template <class First, class Second>
void add_by_lane(LaneSums& s1, LaneSums& s2, std::size_t count, First first, Second second)
{
    LaneSums a = s1, b = s2;
    std::size_t j = 0;
    for (; j + sum_lanes <= count; j += sum_lanes)
        for (std::size_t k = 0; k < sum_lanes; ++k) {
            a.lane[k] += first(j + k);
            b.lane[k] += second(j + k);
        }
    if (j < count) {   // the last values, lanes past them adding zeros (which leave a sum as it is)
        double ta[sum_lanes] = {}, tb[sum_lanes] = {};
        for (std::size_t k = 0; j + k < count; ++k) {
            ta[k] = first(j + k);
            tb[k] = second(j + k);
        }
        for (std::size_t k = 0; k < sum_lanes; ++k) {
            a.lane[k] += ta[k];
            b.lane[k] += tb[k];
        }
    }
    s1 = a, s2 = b;
}

// s1 += x - shift and s2 += (x - shift)^2 over a block of x values v.
inline void add_centred(LaneSums& s1, LaneSums& s2, const float* v, std::size_t count, double shift)
{
    add_by_lane(
        s1, s2, count, [v, shift](std::size_t j) { return double(v[j]) - shift; },
        [v, shift](std::size_t j) { return (double(v[j]) - shift) * (double(v[j]) - shift); });
}

// sdy += g and sdyx += g * (x - mean) over a block of gradients g and x values v.
inline void add_products(LaneSums& sdy, LaneSums& sdyx, const float* g, const float* v, std::size_t count, double mean)
{
    add_by_lane(
        sdy, sdyx, count, [g](std::size_t j) { return double(g[j]); },
        [g, v, mean](std::size_t j) { return double(g[j]) * (double(v[j]) - mean); });
}
} // namespace detail

// sums = [sum of (x - shift[c]) (c) | sum of its square (c) | n * inner].
// then (not empty): batch_norm_statistics from these sums too.
template <core::Storage T>
void batch_norm_sums(const Context& ctx, const T* x, std::size_t n, std::size_t c, std::size_t inner, const float* shift,
                     float* sums, float*, StatisticsUpdate then = {})
{
    parallel_rows(c, n * c * inner, [&](std::size_t c0, std::size_t c1) {   // channels [c0, c1) on a thread
        vectorized([&] {
            float buffer[detail::row_block];
            const std::size_t cs = c1 - c0;
            detail::LaneSums* s = detail::channel_sums(cs);   // [of x - shift (cs) | of its square (cs)]
            for (std::size_t i = 0; i < n; ++i)
                for (std::size_t ch = c0; ch < c1; ++ch) {
                    const T* p = x + (i * c + ch) * inner;
                    detail::for_each_block(inner, [&](std::size_t at, std::size_t count) {
                        detail::add_centred(s[ch - c0], s[cs + ch - c0], as_float(p + at, count, buffer), count,
                                            double(shift[ch]));
                    });
                }
            for (std::size_t ch = c0; ch < c1; ++ch) {
                sums[ch] = float(s[ch - c0].total());
                sums[c + ch] = float(s[cs + ch - c0].total());
            }
        });
    });
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
    parallel_rows(n * c, n * c * inner, [&](std::size_t r0, std::size_t r1) {   // rows (sample, channel)
        vectorized([&] {
            float xs[detail::row_block], as[detail::row_block];
            for (std::size_t r = r0; r < r1; ++r) {
                const std::size_t ch = r % c;
                const detail::Normalization normalize(weight, bias, mean, invstd, ch);
                const std::size_t row = r * inner;
                detail::for_each_block(inner, [&](std::size_t at, std::size_t count) {
                    const float* v = as_float(x + row + at, count, xs);
                    const float* a = addend ? as_float(addend + row + at, count, as) : nullptr;
                    detail::write_floats(y + row + at, count, [&](float* out) {
                        if (a != nullptr)
                            for (std::size_t j = 0; j < count; ++j) out[j] = normalize(v[j]) + a[j];
                        else
                            for (std::size_t j = 0; j < count; ++j) out[j] = normalize(v[j]);
                        if (relu)
                            for (std::size_t j = 0; j < count; ++j) out[j] = out[j] < 0.0f ? 0.0f : out[j];
                    });
                });
            }
        });
    });
}

namespace detail {
// A block of dy as float (d), or with the ReLU after the normalisation relu_backward's rule on the
// ReLU's output: d[j] where that output > 0, else 0, written to g. The output is recomputed from the
// block's x values v (mask: the channel's normalisation) as batch_norm_apply rounds it, or read from
// y (not null), the masked values then also written to dz. Returns the block to read: d or g.
template <core::Storage T>
const float* masked_dy(const float* d, const float* v, std::size_t count, const Normalization* mask, float* g,
                       const T* y = nullptr, T* dz = nullptr)
{
    if (y != nullptr) {
        float ys[row_block];
        const float* out = as_float(y, count, ys);
        for (std::size_t j = 0; j < count; ++j) {
            const float dj = d[j];   // read whatever the mask: the loop has no branch
            g[j] = out[j] > 0.0f ? dj : 0.0f;
        }
        store_float(g, count, dz);
        return g;
    }
    if (mask == nullptr) return d;
    for (std::size_t j = 0; j < count; ++j) {
        const float dj = d[j], u = (*mask)(v[j]);
        g[j] = core::to_float(core::from_float<T>(u < 0.0f ? 0.0f : u)) > 0.0f ? dj : 0.0f;
    }
    return g;
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
    parallel_rows(c, n * c * inner, [&](std::size_t c0, std::size_t c1) {   // channels [c0, c1) on a thread
        vectorized([&] {
            float xs[detail::row_block], ds[detail::row_block], g[detail::row_block];
            const std::size_t cs = c1 - c0;
            detail::LaneSums* s = detail::channel_sums(cs);   // [of dy (cs) | of dy * (x - mean) (cs)]
            for (std::size_t i = 0; i < n; ++i)
                for (std::size_t ch = c0; ch < c1; ++ch) {
                    const auto mask = detail::relu_mask(relu, mean, invstd, ch);
                    const std::size_t row = (i * c + ch) * inner;
                    detail::for_each_block(inner, [&](std::size_t at, std::size_t count) {
                        const std::size_t j = row + at;
                        const float* v = as_float(x + j, count, xs);
                        const float* d = detail::masked_dy(as_float(dy + j, count, ds), v, count, mask ? &*mask : nullptr,
                                                           g, relu.y ? relu.y + j : nullptr, relu.dz ? relu.dz + j : nullptr);
                        detail::add_products(s[ch - c0], s[cs + ch - c0], d, v, count, double(mean[ch]));
                    });
                }
            for (std::size_t ch = c0; ch < c1; ++ch) {
                dparams[ch] = float(s[cs + ch - c0].total() * invstd[ch]);
                dparams[c + ch] = float(s[ch - c0].total());
            }
        });
    });
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
    parallel_rows(n * c, n * c * inner, [&](std::size_t r0, std::size_t r1) {   // rows (sample, channel)
        vectorized([&] {
            float xs[detail::row_block], ds[detail::row_block], g[detail::row_block];
            for (std::size_t r = r0; r < r1; ++r) {
                const std::size_t ch = r % c;
                const float k = weight[ch] * invstd[ch], m = mean[ch], s = invstd[ch];
                const float mdy = sums[c + ch] * inv_count, mdyx = sums[ch] * inv_count;
                const auto mask = detail::relu_mask(relu, mean, invstd, ch);
                const std::size_t row = r * inner;
                detail::for_each_block(inner, [&](std::size_t at, std::size_t values) {
                    const std::size_t j0 = row + at;
                    const float* v = as_float(x + j0, values, xs);
                    const float* d =
                        detail::masked_dy<T>(as_float(dy + j0, values, ds), v, values, mask ? &*mask : nullptr, g);
                    detail::write_floats(dx + j0, values, [&](float* out) {
                        for (std::size_t j = 0; j < values; ++j) {
                            const float xhat = (v[j] - m) * s;
                            out[j] = k * (d[j] - mdy - xhat * mdyx);
                        }
                    });
                });
            }
        });
    });
}

} // namespace replica::backend::cpu
