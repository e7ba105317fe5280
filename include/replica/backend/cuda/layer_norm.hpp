#pragma once
// Layer normalisation on the GPU, the CPU backend's contract (backend/cpu/layer_norm.hpp): `rows` rows
// of `features` values, each normalised on its own. The statistics, the output and the input gradient:
// where a row is packs of 8 values (features a multiple of 8, at most kLayerNormMaxPacks x 256: GPT's
// rows), one warp a row, its values read once into registers (a pack in one 16-byte move where the
// pointers are 16-byte aligned, else value by value: the same sums in the same order, so the bits do
// not depend on where an allocation starts) and the sums taken by a butterfly of shuffles (every lane
// gets the same bits); other rows one block a row, sums in a tree fixed by the block size. Both are
// passes bound by memory. The weight and bias gradients in
// two passes: each chunk of kLayerNormChunk rows summed in order, a thread a feature, into the
// context's workspace, then the chunks' sums added in chunk order. The grouping depends on the row
// count only, so every result is the same on every run and on any number of replicas. x, y, dy, dx are
// T (float, bf16, fp16), computed in float; the weight, bias, their gradients and the statistics float.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/launch.hpp"
#include "replica/backend/cuda/packed.hpp"
#include "replica/core/config.hpp"
#include "replica/core/error.hpp"
#include "replica/core/number.hpp"

namespace REPLICA_NAMESPACE::backend::cuda {

namespace kernels {
inline constexpr int kLayerNormThreads = 128;

struct Sum {
    __device__ float operator()(float a, float b) const { return a + b; }
};

// Block r: row r.
template <class T>
__global__ void layer_norm_forward(const T* x, T* y, const float* w, const float* b, unsigned features, float eps,
                                   float* mean, float* rstd)
{
    __shared__ float lane[kLayerNormThreads];
    const std::size_t r = blockIdx.x;
    const T* xr = x + r * features;
    float s = 0.0f;
    for (unsigned f = threadIdx.x; f < features; f += blockDim.x) s += core::to_float(xr[f]);
    const float m = detail::block_reduce(lane, s, Sum{}) / float(features);
    __syncthreads();   // every thread has read lane[0] before the next sum writes lane
    float q = 0.0f;
    for (unsigned f = threadIdx.x; f < features; f += blockDim.x) {
        const float c = core::to_float(xr[f]) - m;
        q += c * c;
    }
    const float rs = rsqrtf(detail::block_reduce(lane, q, Sum{}) / float(features) + eps);
    for (unsigned f = threadIdx.x; f < features; f += blockDim.x) {
        const float h = (core::to_float(xr[f]) - m) * rs;
        y[r * features + f] = core::from_float<T>(w ? h * w[f] + b[f] : h);
    }
    if (threadIdx.x == 0) mean[r] = m, rstd[r] = rs;
}

template <class T>
__global__ void layer_norm_backward_input(const T* x, const T* dy, const float* w, const float* mean, const float* rstd,
                                          T* dx, unsigned features)
{
    __shared__ float lane[kLayerNormThreads];
    const std::size_t r = blockIdx.x;
    const float m = mean[r], rs = rstd[r];
    float sg = 0.0f, sgh = 0.0f;
    for (unsigned f = threadIdx.x; f < features; f += blockDim.x) {
        const float g = core::to_float(dy[r * features + f]) * (w ? w[f] : 1.0f);
        sg += g;
        sgh += g * (core::to_float(x[r * features + f]) - m) * rs;
    }
    const float mg = detail::block_reduce(lane, sg, Sum{}) / float(features);
    __syncthreads();
    const float mgh = detail::block_reduce(lane, sgh, Sum{}) / float(features);
    for (unsigned f = threadIdx.x; f < features; f += blockDim.x) {
        const float g = core::to_float(dy[r * features + f]) * (w ? w[f] : 1.0f);
        const float h = (core::to_float(x[r * features + f]) - m) * rs;
        dx[r * features + f] = core::from_float<T>(rs * (g - mg - h * mgh));
    }
}

// The warp-a-row kernels: kLayerNormWarps rows a block; lane l holds the row's values 8 (k 32 + l) to
// 8 (k 32 + l) + 7 for k < K where they are in the row, K a power of two >= features / 256 (the packs
// beyond the row are skipped, so K changes no sum), at most kLayerNormMaxPacks. Aligned: every pointer
// 16-byte aligned, a pack one move.
inline constexpr unsigned kLayerNormWarps = 4;
inline constexpr unsigned kLayerNormMaxPacks = 8;

template <bool Aligned, class T>
__device__ inline void load_pack(const T* p, float (&v)[8])
{
    if constexpr (Aligned) {
        load8(p, v);
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = widen(p[j]);
    }
}
template <bool Aligned, class T>
__device__ inline void store_pack(T* p, const float (&v)[8])
{
    if constexpr (Aligned) {
        store8(p, v);
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) p[j] = narrow<T>(v[j]);
    }
}

// The sum of v over the warp, in a butterfly: every lane adds the same two values at every level (a + b
// = b + a), so every lane holds the same bits.
__device__ inline float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <unsigned K, bool Aligned, class T>
__global__ void __launch_bounds__(kLayerNormWarps * 32) layer_norm_forward_rows(const T* x, T* y, const float* w, const float* b,
                                                                                 unsigned rows, unsigned features, float eps,
                                                                                 float* mean, float* rstd)
{
    const unsigned r = blockIdx.x * kLayerNormWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (r >= rows) return;
    const std::size_t row = std::size_t(r) * features;
    float v[K][8];
    float s = 0.0f;
#pragma unroll
    for (unsigned k = 0; k < K; ++k) {
        const unsigned f = (k * 32 + lane) * 8;
        if (f >= features) continue;
        load_pack<Aligned>(x + row + f, v[k]);
#pragma unroll
        for (int j = 0; j < 8; ++j) s += v[k][j];
    }
    const float m = warp_sum(s) / float(features);
    float q = 0.0f;
#pragma unroll
    for (unsigned k = 0; k < K; ++k) {
        if ((k * 32 + lane) * 8 >= features) continue;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const float c = v[k][j] - m;
            q += c * c;
        }
    }
    const float rs = rsqrtf(warp_sum(q) / float(features) + eps);
#pragma unroll
    for (unsigned k = 0; k < K; ++k) {
        const unsigned f = (k * 32 + lane) * 8;
        if (f >= features) continue;
        float o[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const float h = (v[k][j] - m) * rs;
            o[j] = w ? h * __ldg(w + f + j) + __ldg(b + f + j) : h;
        }
        store_pack<Aligned>(y + row + f, o);
    }
    if (lane == 0) mean[r] = m, rstd[r] = rs;
}

template <unsigned K, bool Aligned, class T>
__global__ void __launch_bounds__(kLayerNormWarps * 32) layer_norm_backward_input_rows(const T* x, const T* dy, const float* w,
                                                                                        const float* mean, const float* rstd,
                                                                                        T* dx, unsigned rows, unsigned features)
{
    const unsigned r = blockIdx.x * kLayerNormWarps + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (r >= rows) return;
    const std::size_t row = std::size_t(r) * features;
    const float m = mean[r], rs = rstd[r];
    float h[K][8], g[K][8];
    float sg = 0.0f, sgh = 0.0f;
#pragma unroll
    for (unsigned k = 0; k < K; ++k) {
        const unsigned f = (k * 32 + lane) * 8;
        if (f >= features) continue;
        load_pack<Aligned>(x + row + f, h[k]);
        load_pack<Aligned>(dy + row + f, g[k]);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            h[k][j] = (h[k][j] - m) * rs;
            if (w) g[k][j] *= __ldg(w + f + j);
            sg += g[k][j];
            sgh += g[k][j] * h[k][j];
        }
    }
    const float mg = warp_sum(sg) / float(features), mgh = warp_sum(sgh) / float(features);
#pragma unroll
    for (unsigned k = 0; k < K; ++k) {
        const unsigned f = (k * 32 + lane) * 8;
        if (f >= features) continue;
        float o[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) o[j] = rs * (g[k][j] - mg - h[k][j] * mgh);
        store_pack<Aligned>(dx + row + f, o);
    }
}

inline constexpr std::size_t kLayerNormChunk = 64;

// Block (b, c), thread f of block b: feature f over chunk c's rows, in order, into partial's rows 2c
// (weight) and 2c + 1 (bias).
template <class T>
__global__ void layer_norm_backward_params_chunks(const T* x, const T* dy, const float* mean, const float* rstd,
                                                  float* partial, std::size_t rows, unsigned features)
{
    const unsigned f = blockIdx.x * blockDim.x + threadIdx.x;
    if (f >= features) return;
    const std::size_t begin = std::size_t(blockIdx.y) * kLayerNormChunk, end = min(rows, begin + kLayerNormChunk);
    float sw = 0.0f, sb = 0.0f;
    for (std::size_t r = begin; r < end; ++r) {
        const float d = core::to_float(dy[r * features + f]);
        sw += d * (core::to_float(x[r * features + f]) - mean[r]) * rstd[r];
        sb += d;
    }
    partial[2 * std::size_t(blockIdx.y) * features + f] = sw;
    partial[(2 * std::size_t(blockIdx.y) + 1) * features + f] = sb;
}

// Thread f: the chunks' sums of feature f, in chunk order.
template <int = 0>
__global__ void layer_norm_backward_params_total(const float* partial, std::size_t chunks, unsigned features, float* dw,
                                                 float* db)
{
    const unsigned f = blockIdx.x * blockDim.x + threadIdx.x;
    if (f >= features) return;
    float sw = 0.0f, sb = 0.0f;
    for (std::size_t c = 0; c < chunks; ++c) {
        sw += partial[2 * c * features + f];
        sb += partial[(2 * c + 1) * features + f];
    }
    dw[f] = sw;
    db[f] = sb;
}
} // namespace kernels

namespace detail {
// The packs K of the warp-a-row kernels (kernels above) for rows of `features`: the least power of two
// >= features / 256 where features is a multiple of 8 and K <= kLayerNormMaxPacks, and the rows fit the
// grid; 0 otherwise (a block a row). The shape alone decides, never the pointers.
inline unsigned warp_row_packs(std::size_t rows, std::size_t features)
{
    const std::size_t packs = (features + 255) / 256, blocks = (rows + kernels::kLayerNormWarps - 1) / kernels::kLayerNormWarps;
    if (features % 8 != 0 || packs > kernels::kLayerNormMaxPacks || blocks > 0x7fffffffu) return 0;
    return std::bit_ceil(unsigned(packs));
}
inline dim3 warp_row_blocks(std::size_t rows) { return dim3(unsigned((rows + kernels::kLayerNormWarps - 1) / kernels::kLayerNormWarps)); }
inline bool all_aligned(std::initializer_list<const void*> pointers)
{
    for (const void* p : pointers)
        if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0) return false;
    return true;
}

template <unsigned K = 1, class T>
void layer_norm_forward_rows(const Context& ctx, unsigned packs, const T* x, T* y, const float* w, const float* b,
                             std::size_t rows, std::size_t features, float eps, float* mean, float* rstd)
{
    if (packs != K) {
        if constexpr (K < kernels::kLayerNormMaxPacks)
            layer_norm_forward_rows<2 * K>(ctx, packs, x, y, w, b, rows, features, eps, mean, rstd);
        return;
    }
    const auto launch = [&](auto kernel) {
        kernel<<<warp_row_blocks(rows), kernels::kLayerNormWarps * 32, 0, ctx.stream()>>>(x, y, w, b, unsigned(rows),
                                                                                          unsigned(features), eps, mean, rstd);
    };
    if (all_aligned({x, y})) launch(kernels::layer_norm_forward_rows<K, true, T>);
    else launch(kernels::layer_norm_forward_rows<K, false, T>);
    check_launch("layer_norm_forward_rows");
}

template <unsigned K = 1, class T>
void layer_norm_backward_input_rows(const Context& ctx, unsigned packs, const T* x, const T* dy, const float* w,
                                    const float* mean, const float* rstd, T* dx, std::size_t rows, std::size_t features)
{
    if (packs != K) {
        if constexpr (K < kernels::kLayerNormMaxPacks)
            layer_norm_backward_input_rows<2 * K>(ctx, packs, x, dy, w, mean, rstd, dx, rows, features);
        return;
    }
    const auto launch = [&](auto kernel) {
        kernel<<<warp_row_blocks(rows), kernels::kLayerNormWarps * 32, 0, ctx.stream()>>>(x, dy, w, mean, rstd, dx,
                                                                                          unsigned(rows), unsigned(features));
    };
    if (all_aligned({x, dy, dx})) launch(kernels::layer_norm_backward_input_rows<K, true, T>);
    else launch(kernels::layer_norm_backward_input_rows<K, false, T>);
    check_launch("layer_norm_backward_input_rows");
}
} // namespace detail

// y = (x - mean) * rstd * w + b per row (w, b null: 1 and 0); mean and rstd (rows floats) assigned.
template <core::Storage T>
void layer_norm_forward(const Context& ctx, const T* x, T* y, const float* w, const float* b, std::size_t rows,
                        std::size_t features, float eps, float* mean, float* rstd)
{
    if (rows == 0) return;
    if (const unsigned packs = detail::warp_row_packs(rows, features)) {
        detail::layer_norm_forward_rows(ctx, packs, x, y, w, b, rows, features, eps, mean, rstd);
        return;
    }
    kernels::layer_norm_forward<<<unsigned(rows), kernels::kLayerNormThreads, 0, ctx.stream()>>>(
        x, y, w, b, unsigned(features), eps, mean, rstd);
    detail::check_launch("layer_norm_forward");
}

// dx (may be null) assigned; dw, db assigned (null without affine, w then null too).
template <core::Storage T>
void layer_norm_backward(const Context& ctx, const T* x, const T* dy, const float* w, const float* mean, const float* rstd,
                         std::type_identity_t<T>* dx, float* dw, float* db, std::size_t rows, std::size_t features)
{
    if (dw) {
        const std::size_t chunks = (rows + kernels::kLayerNormChunk - 1) / kernels::kLayerNormChunk;
        core::require(chunks <= 65535, "layer_norm_backward: at most 65535 x 64 rows a call");
        float* partial = static_cast<float*>(ctx.workspace(std::max<std::size_t>(1, 2 * chunks * features) * sizeof(float)));
        if (chunks > 0) {
            const dim3 grid(unsigned(detail::blocks_for(features)), unsigned(chunks));
            kernels::layer_norm_backward_params_chunks<<<grid, detail::kThreads, 0, ctx.stream()>>>(
                x, dy, mean, rstd, partial, rows, unsigned(features));
            detail::check_launch("layer_norm_backward_params_chunks");
        }
        kernels::layer_norm_backward_params_total<<<detail::blocks_for(features), detail::kThreads, 0, ctx.stream()>>>(
            partial, chunks, unsigned(features), dw, db);
        detail::check_launch("layer_norm_backward_params_total");
    }
    if (dx && rows > 0) {
        if (const unsigned packs = detail::warp_row_packs(rows, features)) {
            detail::layer_norm_backward_input_rows<1, T>(ctx, packs, x, dy, w, mean, rstd, dx, rows, features);
            return;
        }
        kernels::layer_norm_backward_input<<<unsigned(rows), kernels::kLayerNormThreads, 0, ctx.stream()>>>(
            x, dy, w, mean, rstd, dx, unsigned(features));
        detail::check_launch("layer_norm_backward_input");
    }
}

} // namespace replica::backend::cuda
