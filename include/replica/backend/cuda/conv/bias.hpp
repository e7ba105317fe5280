#pragma once
// A convolution's bias gradient, db (channels) = dy (n, channels, pixels) summed over samples and
// pixels (dy of type T: float, bf16 or fp16, in the context's layout; the sums and db in float), by
// our own two-pass channel sums (channels-last: columns.hpp's; cuDNN's cudnnConvolutionBackwardBias
// was slower, docs/results/), in an order fixed by the shape: the same bits every run and on
// every GPU.
// Every way of running a convolution (conv/) uses it. A null bias b (and then a null db) is a
// convolution without bias (Bias::none): nothing is added or summed for it, and a fused ReLU, or its
// rule in backward, runs in a pass of its own (bias_forward, bias_backward). Only under nvcc.

#include <algorithm>
#include <concepts>
#include <cstddef>

#include "replica/backend/cuda/columns.hpp"
#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/conv/storage.hpp"
#include "replica/backend/cuda/elementwise.hpp"
#include "replica/backend/cuda/launch.hpp"
#include "replica/backend/cuda/layout.hpp"
#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::backend::cuda {

namespace kernels {
// One unit of W consecutive values (W = 1 or 4) of the bias-gradient pass: their sum in float, in an
// order fixed by W (never by alignment: `aligned` picks one vector load or four scalar ones); with
// Relu, the ReLU's rule is applied first and the result written to dz (exactly: it is dy or 0).
template <bool Relu, unsigned W, class T>
__device__ inline float unit_sum(const T* dy, const T* y, T* dz, bool aligned)
{
    if constexpr (W == 1) {
        float v = kernels::widen(*dy);
        if constexpr (Relu) {
            v = relu_grad(kernels::widen(*y), v);
            *dz = kernels::narrow<T>(v);
        }
        return v;
    } else {
        float4 d = detail::load4(dy, aligned);
        if constexpr (Relu) {
            const float4 a = detail::load4(y, aligned);
            d = make_float4(relu_grad(a.x, d.x), relu_grad(a.y, d.y), relu_grad(a.z, d.z), relu_grad(a.w, d.w));
            detail::store4(dz, d, aligned);
        }
        return (d.x + d.y) + (d.z + d.w);
    }
}

// Pass 1 of db[c] = sum over i < n, j < s of dy[i][c][j]: block (part, c) sums the units (of W values;
// s and per_part count units) [part * per_part, (part + 1) * per_part) of channel c's n * s in a
// fixed order (threads stride along the contiguous rows, then a tree in shared memory), so the result
// is the same every run. Relu: dy is the gradient of relu(z), y = relu(z); the pass also writes
// dz = y > 0 ? dy : 0 and sums dz (a convolution's backward with the ReLU after it: one pass over
// memory instead of two).
template <bool Relu, unsigned W, class T>
__global__ void channel_partial_sums(const T* dy, const T* y, T* dz, float* partial, unsigned channels, unsigned n,
                                     unsigned s, unsigned per_part, bool aligned)
{
    __shared__ float lane[detail::kThreads];
    const unsigned c = blockIdx.y, part = blockIdx.x, total = n * s;
    const unsigned end = min(total, (part + 1) * per_part), step_i = blockDim.x / s, step_j = blockDim.x % s;
    float sum = 0.0f;
    unsigned k = part * per_part + threadIdx.x;
    if (k < end) {
        unsigned i = k / s, j = k - i * s;
        for (; k < end; k += blockDim.x) {
            const std::size_t at = ((std::size_t(i) * channels + c) * s + j) * W;
            sum += unit_sum<Relu, W, T>(dy + at, y + at, dz + at, aligned);
            i += step_i;
            j += step_j;
            if (j >= s) {
                j -= s;
                ++i;
            }
        }
    }
    sum = detail::block_reduce(lane, sum, [](float a, float b) { return a + b; });
    if (threadIdx.x == 0) partial[std::size_t(c) * gridDim.x + part] = sum;
}

// columns.hpp's Op for a channels-last bias gradient: dy summed, or with Relu dz = relu_grad(y, dy)
// written and summed (unit_sum's rule).
template <core::Storage T, bool Relu>
struct ColumnBias {
    const T* dy;
    const T* y;
    T* dz;
    template <int V>
    __device__ auto load(std::size_t at) const
    {
        struct {
            Raw<V, T> dy, y;
        } in;
        in.dy = load_raw<V>(dy + at);
        if constexpr (Relu) in.y = load_raw<V>(y + at);
        return in;
    }
    template <int V>
    __device__ auto group(unsigned) const
    {
        return [dz = dz](std::size_t at, const auto& in, float (&s)[1][V]) {
            float d[8];
            widen_raw(in.dy, d);
            if constexpr (Relu) relu_grad_store(in.y, d, dz + at);
#pragma unroll
            for (int j = 0; j < V; ++j) s[0][j] = __fadd_rn(s[0][j], d[j]);
        };
    }
};

// Pass 2 over channels-last parts (columns.hpp): db[c] = the sum of channel c's parts, a warp a channel.
template <int = 0>
__global__ void column_totals(const float* partial, float* db, std::size_t channels, std::size_t parts)
{
    fold_parts<1>(partial, parts, channels, [&](std::size_t ch, const float (&s)[1]) { db[ch] = s[0]; });
}

// Pass 2: db[c] = the sum of channel c's parts, in order.
template <int = 0>
__global__ void channel_totals(const float* partial, float* db, unsigned channels, unsigned parts)
{
    REPLICA_GRID_LOOP(c, channels)
    {
        float sum = 0.0f;
        for (unsigned p = 0; p < parts; ++p) sum += partial[c * parts + p];
        db[c] = sum;
    }
}
} // namespace kernels

namespace detail {
// Parts per channel for the bias gradient: about 2048 blocks in all, none with fewer than 1024 values
// (fewer, larger parts leave the pass waiting on memory; docs/results/). It depends on the shape
// only (never on the GPU), so every device sums in the same order.
inline unsigned bias_parts(std::size_t channels, std::size_t per_channel)
{
    const std::size_t wanted = (2048 + channels - 1) / channels, most = (per_channel + 1023) / 1024;
    return unsigned(std::clamp<std::size_t>(std::min(wanted, most), 1, 65535));
}

// The floats of partial sums a bias gradient over `channels` of `rows` values each needs: for 16-bit
// types room for either layout's parts (channels-last takes columns.hpp's).
template <core::Storage T>
std::size_t bias_scratch(std::size_t channels, std::size_t rows)
{
    const std::size_t parts = bias_parts(channels, rows);
    return channels * (std::same_as<T, float> ? parts : std::max<std::size_t>(parts, column_parts(rows, channels)));
}

// channel_sums over channels-last dy (rows, channels) (columns.hpp).
template <core::Storage T>
void channel_sums_last(const Context& ctx, const T* dy, float* db, std::size_t channels, std::size_t rows, float* partial,
                       const T* relu_y, T* dz)
{
    const std::size_t parts = column_parts(rows, channels);
    if (relu_y)
        column_sums<1>(ctx, rows, channels, parts, partial, [&](auto) { return kernels::ColumnBias<T, true>{dy, relu_y, dz}; },
                       dy, relu_y, dz);
    else
        column_sums<1>(ctx, rows, channels, parts, partial, [&](auto) { return kernels::ColumnBias<T, false>{dy, nullptr, nullptr}; },
                       dy);
    kernels::column_totals<<<fold_blocks(channels, parts), kThreads, 0, ctx.stream()>>>(partial, db, channels, parts);
    check_launch("column_totals");
}

// db (channels) = dy (n, channels, s) summed over n and s; `partial` holds bias_scratch<T>(channels,
// n * s) floats. With relu_y (the output of the ReLU that dy is the gradient of), dz = relu_y > 0 ? dy
// : 0 is written and summed instead.
template <core::Storage T>
void channel_sums(const Context& ctx, const T* dy, float* db, std::size_t channels, std::size_t n, std::size_t s,
                  float* partial, const T* relu_y = nullptr, T* dz = nullptr)
{
    core::require(n * s < (std::size_t(1) << 31), "a bias gradient over 2^31 values or more per channel: use a smaller batch");
    if constexpr (!std::same_as<T, float>) {
        if (channels_last<T>(ctx)) {
            channel_sums_last(ctx, dy, db, channels, n * s, partial, relu_y, dz);
            return;
        }
    }
    // Units of four values where rows hold whole quads: the order depends on the shape only.
    const unsigned w = s % 4 == 0 ? 4 : 1, units = unsigned(n * s / w);
    const unsigned parts = bias_parts(channels, n * s), per_part = (units + parts - 1) / parts;
    const bool aligned = w == 4 && vector_aligned<T>(dy) && (!relu_y || vector_aligned<T>(relu_y, dz));
    const dim3 grid(parts, unsigned(channels));
    const auto c = unsigned(channels), nn = unsigned(n), sw = unsigned(s / w);
    const T* none = nullptr;
    if (relu_y && w == 4)
        kernels::channel_partial_sums<true, 4, T><<<grid, kThreads, 0, ctx.stream()>>>(dy, relu_y, dz, partial, c, nn, sw, per_part, aligned);
    else if (relu_y)
        kernels::channel_partial_sums<true, 1, T><<<grid, kThreads, 0, ctx.stream()>>>(dy, relu_y, dz, partial, c, nn, sw, per_part, false);
    else if (w == 4)
        kernels::channel_partial_sums<false, 4, T><<<grid, kThreads, 0, ctx.stream()>>>(dy, none, nullptr, partial, c, nn, sw, per_part, aligned);
    else
        kernels::channel_partial_sums<false, 1, T><<<grid, kThreads, 0, ctx.stream()>>>(dy, none, nullptr, partial, c, nn, sw, per_part, false);
    check_launch("channel_partial_sums");
    kernels::channel_totals<<<blocks_for(channels), kThreads, 0, ctx.stream()>>>(partial, db, c, parts);
    check_launch("channel_totals");
}

// After a convolution wrote y (n, channels, s): b added (none where b is null), then the ReLU if relu.
template <core::Storage T>
void bias_forward(const Context& ctx, const float* b, T* y, std::size_t n, std::size_t channels, std::size_t s, bool relu)
{
    if (b) add_channel_bias(ctx, b, y, n, channels, s, relu);
    else if (relu) relu_forward(ctx, y, y, n * channels * s);
}

// Before a convolution's filter and data gradients: db from dy as channel_sums (none where db is
// null); with relu_y, dz = relu_y > 0 ? dy : 0 is written too (in the same pass where there is a
// bias). The gradients then read dz where relu_y is given, else dy.
template <core::Storage T>
void bias_backward(const Context& ctx, const T* dy, float* db, std::size_t channels, std::size_t n, std::size_t s,
                   float* partial, const T* relu_y = nullptr, T* dz = nullptr)
{
    if (db) channel_sums(ctx, dy, db, channels, n, s, partial, relu_y, dz);
    else if (relu_y) relu_backward(ctx, relu_y, dy, dz, n * channels * s);
}
} // namespace detail

} // namespace replica::backend::cuda
