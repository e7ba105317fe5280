#pragma once
// Batch normalisation and the residual merge on the GPU (layers/normalization.hpp, model/residual.hpp).
// x is (n, c, inner) in the context's layout (layout.hpp: channels-last, (n, inner, c), whose sums and
// per-channel maps are columns.hpp's). Per-channel sums in two stages of fixed shape, in double: blocks
// sum fixed parts of each channel (a block tree), then one thread a channel adds the parts in order:
// the same bits every run (channels-last: columns.hpp's lanes add in float, their totals in double).
// x, y, dx, dy (and add_into's a, b, y) are activations of one type T (float, bf16, fp16), read as
// float, each output rounded once to T; sums, statistics and parameters stay float (the sums in
// double, as for float).

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "replica/backend/batch_norm_rules.hpp"
#include "replica/backend/cuda/columns.hpp"
#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/elementwise.hpp"
#include "replica/backend/cuda/launch.hpp"
#include "replica/backend/cuda/layout.hpp"
#include "replica/backend/cuda/packed.hpp"
#include "replica/core/config.hpp"
#include "replica/core/number.hpp"

namespace REPLICA_NAMESPACE::backend::cuda {

namespace kernels {
// BatchNorm's per-value rules, which every kernel of both layouts applies (so all give the same bits):
// a channel's coefficients (scale = weight * invstd, shift = bias - mean * scale); a value normalised,
// the addend added when Add, then the ReLU when Relu; the ReLU's mask recomputed from x; and a value's
// input gradient from the channel's coefficients. The roundings are spelt out, not left to the
// compiler's contraction, so that the backward's mask sees the forward's very values.
struct Coefficients {
    float scale, shift;
};
__device__ inline Coefficients coefficients(float weight, float bias, float mean, float invstd)
{
    const float scale = __fmul_rn(weight, invstd);
    return {scale, __fmaf_rn(-mean, scale, bias)};
}
template <bool Relu, bool Add>
__device__ inline float normalized(float v, float scale, float shift, float addend)
{
    float u = __fmaf_rn(v, scale, shift);
    if constexpr (Add) u = __fadd_rn(u, addend);
    return Relu && u < 0.0f ? 0.0f : u;
}
// The largest float that rounds to zero in T: half T's smallest subnormal (the tie goes to the even
// zero), 0 for float. A float rounds to a T above zero exactly when it is above this.
template <core::Storage T>
inline constexpr float kRoundsToZero = std::same_as<T, core::bf16>   ? 0x1p-134f
                                       : std::same_as<T, core::fp16> ? 0x1p-25f
                                                                     : 0.0f;
// dy through the mask of a ReLU that followed a normalisation without an addend: relu_grad(y, dy) with
// y the ReLU's output as batch_norm_apply rounds it to T, recomputed from x (y itself is not read).
// The sign of the rounded value is read off the float (kRoundsToZero), which spares a conversion
// a value: the same result, NaN's included (it passes no gradient).
template <core::Storage T>
__device__ inline float relu_grad_from_x(float v, Coefficients k, float dy)
{
    return normalized<false, false>(v, k.scale, k.shift, 0.0f) > kRoundsToZero<T> ? dy : 0.0f;
}
__device__ inline float normalized_gradient(float v, float d, float mean, float invstd, float scale, float mean_dy,
                                            float mean_dy_xhat)
{
    const float xhat = (v - mean) * invstd;
    return scale * (d - mean_dy - xhat * mean_dy_xhat);
}

// How a backward pass reads dy (backend::ReluAfter): as it is, through the ReLU's mask recomputed from x
// (relu_grad_from_x), or through the mask read from the ReLU's output y, writing the masked values to
// dz as they are read (backward sums only).
enum class Mask { none, from_x, from_y };

// dy's V values at `at` as a backward pass reads them (M), x's values v already read; with M ==
// from_y written to relu.dz. k: the channel's coefficients (from_x).
template <Mask M, int V, class T, class I>
__device__ inline void read_gradient(const T* dy, I at, const float (&v)[8], Coefficients k, const ReluAfter<T>& relu,
                                     float (&d)[8])
{
    load_v<V>(dy + at, d);
    if constexpr (M == Mask::from_x) {
#pragma unroll
        for (int j = 0; j < V; ++j) d[j] = relu_grad_from_x<T>(v[j], k, d[j]);
    } else if constexpr (M == Mask::from_y) {
        float r[8];
        load_v<V>(relu.y + at, r);
#pragma unroll
        for (int j = 0; j < V; ++j) d[j] = relu_grad(r[j], d[j]);
        store_v<V>(relu.dz + at, d);
    }
}

// Stage one of a per-channel sum. A channel's n * inner elements, in (sample, position) order, fall
// into chunks of 8; block (ch, part) sums the chunks of part `part` (a fixed range of them) into
// partial[(ch * parts + part) * 2 + {0, 1}]; each thread takes every blockDim.x-th chunk and adds its
// values in order. Stage two (finish_channel_sums) adds the parts in order. All in double. V is how a
// chunk is read (8: one 16-byte move, inner a multiple of 8 and x, dy aligned; 4: two moves, inner a
// multiple of 4; 1: value by value): the sums, and so their bits, do not depend on it. Backward: dy
// read as M says (read_gradient; centre is then the mean, and invstd with relu's weight and bias the
// rest of the coefficients).
template <bool Backward, int V, class I, core::Storage T, Mask M = Mask::none>
__global__ void channel_partial_sums(const T* x, const T* dy, I n, I c, I inner, const float* centre, double* partial,
                                     const float* invstd = nullptr, ReluAfter<T> relu = {})
{
    __shared__ double lane[detail::kThreads];
    const I ch = blockIdx.x, parts = gridDim.y, count = n * inner;
    const I chunks = (count + 7) / 8, per = (chunks + parts - 1) / parts, first = I(blockIdx.y) * per;
    const I last = first + per < chunks ? first + per : chunks;
    const double k = centre[ch];
    Coefficients mask{};
    if constexpr (M == Mask::from_x) mask = coefficients(relu.weight[ch], relu.bias[ch], centre[ch], invstd[ch]);
    double s1 = 0.0, s2 = 0.0;
    for (I q = first + I(threadIdx.x); q < last; q += I(blockDim.x)) {
        float v[8], g[8] = {};
        const I e0 = 8 * q, m = count - e0 < 8 ? count - e0 : 8;
        const auto read = [&](I at, int h, auto move) {   // a move of V values lies in one sample's plane
            constexpr int W = decltype(move)::value;
            float u[8];
            [[maybe_unused]] float d[8];   // read in backward only
            load_v<W>(x + at, u);
            if constexpr (Backward) read_gradient<M, W>(dy, at, u, mask, relu, d);
#pragma unroll
            for (int j = 0; j < W; ++j) {
                v[h + j] = u[j];
                if constexpr (Backward) g[h + j] = d[j];
            }
        };
        if constexpr (V == 1) {
            for (I j = 0; j < m; ++j) {
                const I e = e0 + j, i = e / inner;
                read((i * c + ch) * inner + (e - i * inner), int(j), std::integral_constant<int, 1>{});
            }
        } else {
#pragma unroll
            for (int h = 0; h < 8; h += V) {
                if (I(h) >= m) break;
                const I e = e0 + I(h), i = e / inner;
                read((i * c + ch) * inner + (e - i * inner), h, std::integral_constant<int, V>{});
            }
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            if (I(j) >= m) break;
            const double d = double(v[j]) - k;
            if constexpr (Backward) {   // sum of dy, and of dy * (x - mean)
                s1 += double(g[j]);
                s2 += double(g[j]) * d;
            } else {   // sum of x - shift, and of its square
                s1 += d;
                s2 += d * d;
            }
        }
    }
    const auto plus = [](double a, double b) { return a + b; };
    s1 = detail::block_reduce(lane, s1, plus);
    __syncthreads();
    s2 = detail::block_reduce(lane, s2, plus);
    if (threadIdx.x == 0) {
        partial[(ch * parts + blockIdx.y) * 2] = s1;
        partial[(ch * parts + blockIdx.y) * 2 + 1] = s2;
    }
}

// One channel's sums as forward writes them (sums = [s1 (c) | s2 (c) | count]), and with `then` its
// statistics from those floats (batch_norm_statistics').
__device__ inline void forward_sums(std::size_t ch, std::size_t c, double s1, double s2, std::size_t count, float* sums,
                                    const StatisticsUpdate& then)
{
    sums[ch] = float(s1);
    sums[c + ch] = float(s2);
    if (ch == 0) sums[2 * c] = float(count);
    if (then)
        batch_statistics(float(s1), float(s2), float(count), then.running_mean[ch], then.running_var[ch], then.momentum,
                         then.eps, then.mean[ch], then.invstd[ch]);
}

// Forward: forward_sums. Backward: dparams = [s2 * invstd (c) | s1 (c)].
template <bool Backward>
__global__ void finish_channel_sums(const double* partial, std::size_t parts, std::size_t c, std::size_t count,
                                    const float* invstd, float* out, StatisticsUpdate then = {})
{
    const std::size_t ch = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
    if (ch >= c) return;
    double s1 = 0.0, s2 = 0.0;
    for (std::size_t p = 0; p < parts; ++p) {
        s1 += partial[(ch * parts + p) * 2];
        s2 += partial[(ch * parts + p) * 2 + 1];
    }
    if constexpr (Backward) {
        out[ch] = float(s2 * invstd[ch]);
        out[c + ch] = float(s1);
    } else {
        forward_sums(ch, c, s1, s2, count, out, then);
    }
}

// finish_channel_sums for channels-last sums (columns.hpp's parts, up to kColumnParts a channel): the
// same outputs, the parts added by a warp a channel.
template <bool Backward>
__global__ void finish_column_sums(const double* partial, std::size_t parts, std::size_t c, std::size_t count,
                                   const float* invstd, float* out, StatisticsUpdate then = {})
{
    fold_parts<2>(partial, parts, c, [&](std::size_t ch, const double (&s)[2]) {
        if constexpr (Backward) {
            out[ch] = float(s[1] * invstd[ch]);
            out[c + ch] = float(s[0]);
        } else {
            forward_sums(ch, c, s[0], s[1], count, out, then);
        }
    });
}

template <int = 0>
__global__ void batch_norm_statistics(const float* sums, float* running_mean, float* running_var, Momentum momentum,
                                      float eps, float* mean, float* invstd, std::size_t c)
{
    const std::size_t ch = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
    if (ch >= c) return;
    batch_statistics(sums[ch], sums[c + ch], sums[2 * c], running_mean[ch], running_var[ch], momentum, eps, mean[ch],
                     invstd[ch]);
}

template <int = 0>
__global__ void batch_norm_shard_sums(const float* sums, float* out, float scale, std::size_t c)
{
    const std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
    if (i < 2 * c) out[i] = sums[i] * scale;
}

template <int = 0>
__global__ void batch_norm_step_statistics(const float* sums, float* running_mean, float* running_var, Momentum momentum,
                                           double ratio, double count, std::size_t c)
{
    const std::size_t ch = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
    if (ch >= c) return;
    const double d = sums[ch] * ratio;
    const double s2 = sums[c + ch] * ratio - d * d;
    move_running(running_mean[ch], running_var[ch], double(running_mean[ch]) + d, s2 > 0.0 ? s2 : 0.0, count, momentum);
}

template <int = 0>
__global__ void batch_norm_running(const float* running_mean, const float* running_var, float eps, float* mean,
                                   float* invstd, std::size_t c)
{
    const std::size_t ch = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
    if (ch >= c) return;
    mean[ch] = running_mean[ch];
    invstd[ch] = float(1.0 / sqrt(double(running_var[ch]) + double(eps)));
}

// The elementwise passes over groups of V values of one (sample, channel) plane (inner a multiple of
// V, and the pointers aligned to a move of V where V > 1): one channel lookup a group. Channels-last
// activations take columns.hpp's column_map with the Ops below instead, the same expressions.
// Add: addend's values are added before the ReLU (a Residual's other branch, layers/op.hpp).
template <bool Relu, bool Add, int V, class I, core::Storage T>
__global__ void batch_norm_apply(const T* x, T* y, I groups, I c, I inner_groups, const float* weight, const float* bias,
                                 const float* mean, const float* invstd, const T* addend)
{
    REPLICA_GRID_LOOP_AS(I, g, groups)
    {
        const I ch = (g / inner_groups) % c;
        float v[8], a[8] = {};
        load_v<V>(x + g * V, v);
        if constexpr (Add) load_v<V>(addend + g * V, a);
        const Coefficients k = coefficients(weight[ch], bias[ch], mean[ch], invstd[ch]);
#pragma unroll
        for (int j = 0; j < V; ++j) v[j] = normalized<Relu, Add>(v[j], k.scale, k.shift, a[j]);
        store_v<V>(y + g * V, v);
    }
}

// dy read as M says, as channel_partial_sums reads it (none or from_x: relu's bias is the normalisation's).
template <int V, class I, core::Storage T, Mask M = Mask::none>
__global__ void batch_norm_backward_input(const T* x, const T* dy, T* dx, I groups, I c, I inner_groups,
                                          const float* weight, const float* mean, const float* invstd,
                                          const float* sums, const float* elements, ReluAfter<T> relu = {})
{
    static_assert(M != Mask::from_y, "the input gradient reads the masked gradient the sums wrote");
    const float inv_count = 1.0f / *elements;
    REPLICA_GRID_LOOP_AS(I, g, groups)
    {
        const I ch = (g / inner_groups) % c;
        float v[8], d[8];
        load_v<V>(x + g * V, v);
        const float m = mean[ch], s = invstd[ch], scale = weight[ch] * s;
        const float mean_dy = sums[c + ch] * inv_count, mean_dy_xhat = sums[ch] * inv_count;
        Coefficients k{};
        if constexpr (M == Mask::from_x) k = coefficients(weight[ch], relu.bias[ch], m, s);
        read_gradient<M, V>(dy, g * V, v, k, relu, d);
#pragma unroll
        for (int j = 0; j < V; ++j) v[j] = normalized_gradient(v[j], d[j], m, s, scale, mean_dy, mean_dy_xhat);
        store_v<V>(dx + g * V, v);
    }
}

// columns.hpp's column_map Ops for channels-last BatchNorm: batch_norm_apply's and
// batch_norm_backward_input's expressions, each channel's coefficients read once a thread.
template <bool Relu, bool Add, core::Storage T>
struct ColumnNormalize {
    const T* x;
    T* y;
    const float *weight, *bias, *mean, *invstd;
    const T* addend;
    template <int V, class I>
    __device__ auto load(I at) const
    {
        struct {
            Raw<V, T> x, addend;
        } in;
        in.x = load_raw<V>(x + at);
        if constexpr (Add) in.addend = load_raw<V>(addend + at);
        return in;
    }
    template <int V, class I>
    __device__ auto group(I ch) const
    {
        Coefficients k[V];
#pragma unroll
        for (int j = 0; j < V; ++j) k[j] = coefficients(weight[ch + j], bias[ch + j], mean[ch + j], invstd[ch + j]);
        return [=, y = y](I at, const auto& in) {
            float v[8], a[8] = {};
            widen_raw(in.x, v);
            if constexpr (Add) widen_raw(in.addend, a);
#pragma unroll
            for (int j = 0; j < V; ++j) v[j] = normalized<Relu, Add>(v[j], k[j].scale, k[j].shift, a[j]);
            store_v<V>(y + at, v);
        };
    }
};
template <Mask M, core::Storage T>
struct ColumnNormalizeGradient {
    static_assert(M != Mask::from_y, "the input gradient reads the masked gradient the sums wrote");
    const T *x, *dy;
    T* dx;
    const float *weight, *mean, *invstd, *sums, *elements;
    std::size_t c;
    ReluAfter<T> relu;
    template <int V, class I>
    __device__ auto load(I at) const
    {
        struct {
            Raw<V, T> x, dy;
        } in;
        in.x = load_raw<V>(x + at);
        in.dy = load_raw<V>(dy + at);
        return in;
    }
    // The mask's coefficients (coefficients()) share the gradient's scale, weight * invstd.
    template <int V, class I>
    __device__ auto group(I ch) const
    {
        const float inv_count = 1.0f / *elements;
        float m[V], s[V], scale[V], shift[V], mean_dy[V], mean_dy_xhat[V];
#pragma unroll
        for (int j = 0; j < V; ++j) {
            const Coefficients k = coefficients(weight[ch + j], M == Mask::from_x ? relu.bias[ch + j] : 0.0f, mean[ch + j], invstd[ch + j]);
            m[j] = mean[ch + j], s[j] = invstd[ch + j], scale[j] = k.scale, shift[j] = k.shift;
            mean_dy[j] = sums[c + ch + j] * inv_count, mean_dy_xhat[j] = sums[ch + j] * inv_count;
        }
        return [=, dx = dx](I at, const auto& in) {
            float v[8], d[8];
            widen_raw(in.x, v);
            widen_raw(in.dy, d);
#pragma unroll
            for (int j = 0; j < V; ++j) {
                if constexpr (M == Mask::from_x) d[j] = relu_grad_from_x<T>(v[j], {scale[j], shift[j]}, d[j]);
                v[j] = normalized_gradient(v[j], d[j], m[j], s[j], scale[j], mean_dy[j], mean_dy_xhat[j]);
            }
            store_v<V>(dx + at, v);
        };
    }
};

template <bool Relu>
__global__ void add_into(const float* a, const float* b, float* y, std::size_t count)
{
    REPLICA_GRID_LOOP(i, count)
    {
        const float v = a[i] + b[i];
        y[i] = Relu && v < 0.0f ? 0.0f : v;
    }
}
template <bool Relu>
__global__ void add_into4(const float4* a, const float4* b, float4* y, std::size_t quads)
{
    REPLICA_GRID_LOOP(i, quads)
    {
        const float4 u = a[i], v = b[i];
        float4 s = make_float4(u.x + v.x, u.y + v.y, u.z + v.z, u.w + v.w);
        if (Relu) s = make_float4(s.x > 0.0f ? s.x : 0.0f, s.y > 0.0f ? s.y : 0.0f, s.z > 0.0f ? s.z : 0.0f,
                                  s.w > 0.0f ? s.w : 0.0f);
        y[i] = s;
    }
}
// a + b, then the ReLU when Relu: add_into's rule for packed.hpp's maps (bf16, fp16).
template <bool Relu>
struct PlusRelu {
    __device__ float operator()(float a, float b) const
    {
        const float v = a + b;
        return Relu && v < 0.0f ? 0.0f : v;
    }
};
// columns.hpp's Ops for channels-last BatchNorm: the forward sums (of x - centre and its square) and
// the backward ones (of dy, or of dy through the ReLU's mask, and of that times x - mean), each channel's
// constants read once a thread. A lane adds in float (columns.hpp), every rounding spelt out, so that
// the moves of eight values and the single values add the same bits.
template <core::Storage T>
struct ColumnMoments {
    const T* x;
    const float* centre;
    template <int V>
    __device__ Raw<V, T> load(std::size_t at) const
    {
        return load_raw<V>(x + at);
    }
    template <int V>
    __device__ auto group(unsigned ch) const
    {
        float k[V];
#pragma unroll
        for (int j = 0; j < V; ++j) k[j] = centre[ch + j];
        return [=](std::size_t, const Raw<V, T>& in, float (&s)[2][V]) {
            float v[8];
            widen_raw(in, v);
#pragma unroll
            for (int j = 0; j < V; ++j) {
                const float d = __fsub_rn(v[j], k[j]);
                s[0][j] = __fadd_rn(s[0][j], d);
                s[1][j] = __fmaf_rn(d, d, s[1][j]);
            }
        };
    }
};
// dy read as M says (read_gradient's rules; invstd with mean and relu's weight and bias: the
// coefficients of the mask from x; with from_y the masked values written to relu.dz).
template <core::Storage T, Mask M>
struct ColumnGradientMoments {
    const T* x;
    const T* dy;
    const float* mean;
    const float* invstd = nullptr;
    ReluAfter<T> relu = {};
    template <int V>
    __device__ auto load(std::size_t at) const
    {
        struct {
            Raw<V, T> x, dy, y;
        } in;
        in.x = load_raw<V>(x + at);
        in.dy = load_raw<V>(dy + at);
        if constexpr (M == Mask::from_y) in.y = load_raw<V>(relu.y + at);
        return in;
    }
    template <int V>
    __device__ auto group(unsigned ch) const
    {
        float m[V];
        Coefficients k[V];
#pragma unroll
        for (int j = 0; j < V; ++j) {
            m[j] = mean[ch + j];
            if constexpr (M == Mask::from_x) k[j] = coefficients(relu.weight[ch + j], relu.bias[ch + j], m[j], invstd[ch + j]);
        }
        return [=, dz = relu.dz](std::size_t at, const auto& in, float (&s)[2][V]) {
            float v[8], d[8];
            widen_raw(in.x, v);
            widen_raw(in.dy, d);
            if constexpr (M == Mask::from_x) {
#pragma unroll
                for (int j = 0; j < V; ++j) d[j] = relu_grad_from_x<T>(v[j], k[j], d[j]);
            } else if constexpr (M == Mask::from_y) {
                relu_grad_store(in.y, d, dz + at);
            }
#pragma unroll
            for (int j = 0; j < V; ++j) {
                s[0][j] = __fadd_rn(s[0][j], d[j]);
                s[1][j] = __fmaf_rn(d[j], __fsub_rn(v[j], m[j]), s[1][j]);
            }
        };
    }
};
} // namespace kernels

namespace detail {
// Parts a channel's n * inner elements are summed in: about 8192 elements each, at most
// kChannelParts (the partial-sum buffer's size a channel).
inline constexpr std::size_t kChannelParts = 128;
inline std::size_t channel_parts(std::size_t count)
{
    return std::clamp<std::size_t>((count + 8191) / 8192, 1, kChannelParts);
}
} // namespace detail

// Floats of scratch the per-channel sums of c channels need (partial sums, in doubles, at the first
// 8-byte boundary of the scratch), for activations of type T (the same for all: the sums are double).
template <core::Storage T = float>
std::size_t batch_norm_scratch(const Context& ctx, std::size_t c)
{
    return 4 * (channels_last<T>(ctx) ? detail::kColumnParts : detail::kChannelParts) * c + 1;
}

namespace detail {
// f(std::integral_constant<int, V>{}) for the widest move V (8, 4 or 1 values) that splits every
// (sample, channel) plane of `inner` values and that every pointer is aligned to.
template <core::Storage T, class F, class... P>
void with_move(std::size_t inner, F&& f, const P*... p)
{
    const auto aligned = [&](std::size_t bytes) { return ((reinterpret_cast<std::uintptr_t>(p) % bytes == 0) && ...); };
    if (inner % 8 == 0 && aligned(16)) f(std::integral_constant<int, 8>{});
    else if (inner % 4 == 0 && aligned(4 * sizeof(T))) f(std::integral_constant<int, 4>{});
    else f(std::integral_constant<int, 1>{});
}

// An elementwise pass over count values in planes of `inner`: f(V, I{}, groups) with the widest move
// V (with_move) and the index type I (indexed) for count / V groups of V values; nothing when count is 0.
template <core::Storage T, class F, class... P>
void in_groups(std::size_t count, std::size_t inner, F&& f, const P*... p)
{
    if (count == 0) return;
    with_move<T>(
        inner, [&](auto v) { indexed(count, [&](auto index) { f(v, index, count / decltype(v)::value); }); }, p...);
}

inline double* partial_sums(float* scratch)
{
    const auto p = reinterpret_cast<std::uintptr_t>(scratch);
    return reinterpret_cast<double*>((p + alignof(double) - 1) / alignof(double) * alignof(double));
}
} // namespace detail

namespace detail {
// f(std::integral_constant<kernels::Mask, M>{}) for the way relu says dy is read.
template <core::Storage T, class F>
void with_mask(const ReluAfter<T>& relu, F&& f)
{
    using kernels::Mask;
    if (relu.from_x()) f(std::integral_constant<Mask, Mask::from_x>{});
    else if (relu.from_y()) f(std::integral_constant<Mask, Mask::from_y>{});
    else f(std::integral_constant<Mask, Mask::none>{});
}

// relu (backward only): dy is read through the ReLU's mask (kernels::read_gradient); centre is then
// the mean. A null pointer is aligned to every move.
template <bool Backward, core::Storage T>
void channel_sums(const Context& ctx, const T* x, const T* dy, std::size_t n, std::size_t c, std::size_t inner,
                  const float* centre, double* partial, std::size_t parts, const float* invstd = nullptr,
                  ReluAfter<T> relu = {})
{
    const auto launch = [&](auto v, auto index, auto mask) {
        using I = decltype(index);
        kernels::channel_partial_sums<Backward, decltype(v)::value, I, T, decltype(mask)::value>
            <<<dim3(unsigned(c), unsigned(parts)), kThreads, 0, ctx.stream()>>>(x, dy, I(n), I(c), I(inner), centre,
                                                                             partial, invstd, relu);
    };
    indexed(n * c * inner, [&](auto index) {
        if constexpr (Backward)
            with_move<T>(inner, [&](auto v) { with_mask(relu, [&](auto mask) { launch(v, index, mask); }); }, x, dy,
                         relu.y, static_cast<const T*>(relu.dz));
        else with_move<T>(inner, [&](auto v) { launch(v, index, std::integral_constant<kernels::Mask, kernels::Mask::none>{}); }, x);
    });
}
} // namespace detail

// then (not empty): batch_norm_statistics from these sums too, in the pass that finishes them.
template <core::Storage T>
void batch_norm_sums(const Context& ctx, const T* x, std::size_t n, std::size_t c, std::size_t inner, const float* shift,
                     float* sums, float* scratch, StatisticsUpdate then = {})
{
    const bool last = channels_last<T>(ctx);
    const std::size_t parts = last ? detail::column_parts(n * inner, c) : detail::channel_parts(n * inner);
    double* partial = detail::partial_sums(scratch);
    detail::by_layout<T>(ctx, [&](auto l) {
        if constexpr (decltype(l)::value) {
            detail::column_sums<2>(ctx, n * inner, c, parts, partial, [&](auto) { return kernels::ColumnMoments<T>{x, shift}; }, x);
            kernels::finish_column_sums<false><<<detail::fold_blocks(c, parts), detail::kThreads, 0, ctx.stream()>>>(
                partial, parts, c, n * inner, nullptr, sums, then);
        } else {
            detail::channel_sums<false>(ctx, x, static_cast<const T*>(nullptr), n, c, inner, shift, partial, parts);
            kernels::finish_channel_sums<false><<<detail::blocks_for(c), detail::kThreads, 0, ctx.stream()>>>(
                partial, parts, c, n * inner, nullptr, sums, then);
        }
    });
    detail::check_launch("batch_norm_sums");
}

inline void batch_norm_statistics(const Context& ctx, const float* sums, float* running_mean, float* running_var,
                                  Momentum momentum, float eps, float* mean, float* invstd, std::size_t c)
{
    kernels::batch_norm_statistics<<<detail::blocks_for(c), detail::kThreads, 0, ctx.stream()>>>(
        sums, running_mean, running_var, momentum, eps, mean, invstd, c);
    detail::check_launch("batch_norm_statistics");
}

// The reproducible mode (see the CPU backend's): a micro-shard's share, and the once-a-step update.
inline void batch_norm_shard_sums(const Context& ctx, const float* sums, float* out, float scale, std::size_t c)
{
    kernels::batch_norm_shard_sums<<<detail::blocks_for(2 * c), detail::kThreads, 0, ctx.stream()>>>(sums, out, scale, c);
    detail::check_launch("batch_norm_shard_sums");
}
inline void batch_norm_step_statistics(const Context& ctx, const float* sums, float* running_mean, float* running_var,
                                       Momentum momentum, double ratio, double count, std::size_t c)
{
    kernels::batch_norm_step_statistics<<<detail::blocks_for(c), detail::kThreads, 0, ctx.stream()>>>(
        sums, running_mean, running_var, momentum, ratio, count, c);
    detail::check_launch("batch_norm_step_statistics");
}

inline void batch_norm_running(const Context& ctx, const float* running_mean, const float* running_var, float eps,
                               float* mean, float* invstd, std::size_t c)
{
    kernels::batch_norm_running<<<detail::blocks_for(c), detail::kThreads, 0, ctx.stream()>>>(running_mean, running_var,
                                                                                             eps, mean, invstd, c);
    detail::check_launch("batch_norm_running");
}

// addend (not null): added before the ReLU (kernels::batch_norm_apply's Add).
template <core::Storage T>
void batch_norm_apply(const Context& ctx, const T* x, T* y, std::size_t n, std::size_t c, std::size_t inner,
                      const float* weight, const float* bias, const float* mean, const float* invstd, bool relu,
                      const std::type_identity_t<T>* addend = nullptr)
{
    const auto launch = [&](auto r, auto add) {
        constexpr bool R = decltype(r)::value, A = decltype(add)::value;
        detail::by_layout<T>(ctx, [&](auto l) {
            if constexpr (decltype(l)::value) {
                detail::column_map(
                    ctx, n * inner, c, [&](auto) { return kernels::ColumnNormalize<R, A, T>{x, y, weight, bias, mean, invstd, addend}; },
                    "batch_norm_apply", x, y, addend);
            } else {
                detail::in_groups<T>(n * c * inner, inner, [&](auto v, auto index, std::size_t groups) {
                    using I = decltype(index);
                    kernels::batch_norm_apply<R, A, decltype(v)::value, I, T>
                        <<<detail::blocks_for(groups), detail::kThreads, 0, ctx.stream()>>>(x, y, I(groups), I(c), I(inner / decltype(v)::value),
                                                                                            weight, bias, mean, invstd, addend);
                }, x, y, addend);
                detail::check_launch("batch_norm_apply");
            }
        });
    };
    const auto with_relu = [&](auto r) {
        if (addend) launch(r, std::true_type{});
        else launch(r, std::false_type{});
    };
    if (relu) with_relu(std::true_type{});
    else with_relu(std::false_type{});
}

// relu (batch_norm_rules.hpp): dy is the ReLU's output gradient, read through its mask (relu_backward's
// rule: the same bits as relu_backward's output in dy's place), and with relu.from_y() written to relu.dz.
template <core::Storage T>
void batch_norm_backward_sums(const Context& ctx, const T* x, const T* dy, std::size_t n, std::size_t c, std::size_t inner,
                              const float* mean, const float* invstd, float* dparams, float* scratch,
                              ReluAfter<std::type_identity_t<T>> relu = {})
{
    const bool last = channels_last<T>(ctx);
    const std::size_t parts = last ? detail::column_parts(n * inner, c) : detail::channel_parts(n * inner);
    double* partial = detail::partial_sums(scratch);
    detail::by_layout<T>(ctx, [&](auto l) {
        if constexpr (!decltype(l)::value) {
            detail::channel_sums<true>(ctx, x, dy, n, c, inner, mean, partial, parts, invstd, relu);
            kernels::finish_channel_sums<true><<<detail::blocks_for(c), detail::kThreads, 0, ctx.stream()>>>(
                partial, parts, c, n * inner, invstd, dparams);
        } else {
            detail::with_mask(relu, [&](auto mask) {
                detail::column_sums<2>(
                    ctx, n * inner, c, parts, partial,
                    [&](auto) { return kernels::ColumnGradientMoments<T, decltype(mask)::value>{x, dy, mean, invstd, relu}; }, x, dy,
                    relu.y, static_cast<const T*>(relu.dz));
            });
            kernels::finish_column_sums<true><<<detail::fold_blocks(c, parts), detail::kThreads, 0, ctx.stream()>>>(
                partial, parts, c, n * inner, invstd, dparams);
        }
    });
    detail::check_launch("batch_norm_backward_sums");
}

// relu: as for batch_norm_backward_sums, recomputed from x only (the input gradient of a ReLU read from y
// reads the masked gradient the sums wrote, unmasked).
template <core::Storage T>
void batch_norm_backward_input(const Context& ctx, const T* x, const T* dy, T* dx, std::size_t n, std::size_t c,
                               std::size_t inner, const float* weight, const float* mean, const float* invstd,
                               const float* sums, const float* count, ReluAfter<std::type_identity_t<T>> relu = {})
{
    core::require(!relu.from_y(), "batch_norm_backward_input: a ReLU read from its output is the sums' to apply; pass "
                                  "the masked gradient they wrote as dy");
    const auto launch = [&](auto mask) {
        constexpr kernels::Mask M = decltype(mask)::value;
        detail::by_layout<T>(ctx, [&](auto l) {
            if constexpr (decltype(l)::value) {
                detail::column_map(
                    ctx, n * inner, c,
                    [&](auto) { return kernels::ColumnNormalizeGradient<M, T>{x, dy, dx, weight, mean, invstd, sums, count, c, relu}; },
                    "batch_norm_backward_input", x, dy, dx);
            } else {
                detail::in_groups<T>(n * c * inner, inner, [&](auto v, auto index, std::size_t groups) {
                    using I = decltype(index);
                    kernels::batch_norm_backward_input<decltype(v)::value, I, T, M>
                        <<<detail::blocks_for(groups), detail::kThreads, 0, ctx.stream()>>>(
                            x, dy, dx, I(groups), I(c), I(inner / decltype(v)::value), weight, mean, invstd, sums, count, relu);
                }, x, dy, dx);
                detail::check_launch("batch_norm_backward_input");
            }
        });
    };
    if (relu.from_x()) launch(std::integral_constant<kernels::Mask, kernels::Mask::from_x>{});
    else launch(std::integral_constant<kernels::Mask, kernels::Mask::none>{});
}

// y = a + b, then the ReLU when relu.
template <core::Storage T>
void add_into(const Context& ctx, const T* a, const T* b, T* y, std::size_t count, bool relu)
{
    if (count == 0) return;
    const auto launch = [&](auto r) {
        constexpr bool R = decltype(r)::value;
        if constexpr (std::same_as<T, float>) {
            const auto s = ctx.stream();
            detail::in_moves(
                detail::quad_aligned(a, b, y), count, 4,
                [&](std::size_t quads) {
                    kernels::add_into4<R><<<detail::blocks_for(quads), detail::kThreads, 0, s>>>(
                        reinterpret_cast<const float4*>(a), reinterpret_cast<const float4*>(b), reinterpret_cast<float4*>(y),
                        quads);
                },
                [&](std::size_t done) {
                    kernels::add_into<R><<<detail::blocks_for(count - done), detail::kThreads, 0, s>>>(
                        a + done, b + done, y + done, count - done);
                });
            detail::check_launch("add_into");
        } else {
            detail::map2<kernels::PlusRelu<R>>(ctx, a, b, y, count, "add_into");
        }
    };
    if (relu) launch(std::true_type{});
    else launch(std::false_type{});
}

} // namespace replica::backend::cuda
