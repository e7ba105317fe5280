#pragma once
// Causal scaled dot-product attention on the GPU, the CPU backend's contract and layouts
// (backend/cpu/attention.hpp): qkv (n, t, 3d) with each position's q, k, v; o (n, t, d); the softmax's
// log-sum-exp (n, heads, t), natural log. Tiled kernels in the manner of FlashAttention-2: no (t, t)
// matrix exists anywhere, only (B, B) tiles of it in shared memory, so t has no bound.
//   forward   block: B queries of one (sample, head), over the key tiles at or before its own (online
//             softmax: a running maximum and sum a row, the output rescaled when the maximum grows);
//             writes o and lse.
//   backward  delta_i = do_i . o_i into scratch (a warp a row); then one kernel for dk and dv (block: B
//             keys, over the query tiles at or after its own) and one for dq (block: B queries, over
//             the key tiles at or before its own), each recomputing the weights p_ij = exp(s_ij - lse_i)
//             and ds_ij = p_ij (do_i . v_j - delta_i) scale.
// A block is 256 threads, a 16 x 16 grid: thread (ty, tx) holds rows ty + 16 a of the block's tile and
// columns tx + 16 b (of the scores) or tx + 16 m (of the head's features), sums in registers. Tiles are
// float in shared memory, rows padded to HD + 1; HD, the head size rounded up to 32, 64 or 128, and B
// are template arguments. No atomics: each block owns its outputs, every sum is in a fixed order
// (features and positions in order, the row reductions in a butterfly fixed by the warp), so every
// result is the same on every run. Values T (float, bf16, fp16) computed in float, rounded once.
// Scratch: delta, n heads t floats.
// bf16 and fp16 activations with heads of at most 64 features run on tensor cores instead, where the
// device has them (attention_tc.hpp: the same passes and contract, the weights rounded to T as the
// products' operands); these kernels run every other case.

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "replica/backend/cuda/attention_tc.hpp"
#include "replica/backend/cuda/check.hpp"
#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/launch.hpp"
#include "replica/core/config.hpp"
#include "replica/core/error.hpp"
#include "replica/core/number.hpp"

namespace REPLICA_NAMESPACE::backend::cuda {

namespace kernels {
inline constexpr int kAttentionThreads = 256;   // a 16 x 16 grid
inline constexpr int kAttentionMaxHead = 128;

// Tile rows: the forward's, and the backward's (four tiles of HD + 1 and two of B a block).
template <int HD>
inline constexpr int kAttentionForwardRows = 64;
template <int HD>
inline constexpr int kAttentionBackwardRows = HD > 64 ? 32 : 64;

// Rows [first, first + B) of one head's q, k, v (base: the sample's first row, at the part and head;
// stride: a row's values) into a (B, HD + 1) float tile; rows at or past t and columns at or past hd
// are zeros, so that masked products are finite.
template <int HD, int B, class T>
__device__ inline void attention_load(float* tile, const T* base, std::size_t stride, unsigned first, unsigned t,
                                      unsigned hd)
{
    for (unsigned e = threadIdx.x; e < unsigned(B * HD); e += kAttentionThreads) {
        const unsigned r = e / HD, c = e % HD;
        tile[r * (HD + 1) + c] = first + r < t && c < hd ? core::to_float(base[(first + r) * stride + c]) : 0.0f;
    }
}

// The maximum, or the sum, of v over the 16 threads of a row (tx), the same bits in each.
__device__ inline float attention_row_max(float v)
{
    for (int lane = 8; lane > 0; lane /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, lane));
    return v;
}
__device__ inline float attention_row_sum(float v)
{
    for (int lane = 8; lane > 0; lane /= 2) v += __shfl_xor_sync(0xffffffffu, v, lane);
    return v;
}

// Block: query tile (the last first) of (sample, head) blockIdx.x / tiles. Shared: q (B, HD + 1), the
// key tile then the value tile (B, HD + 1), the weights (B, B).
template <class T, int HD, int B>
__global__ void __launch_bounds__(kAttentionThreads)
    attention_forward(const T* qkv, T* o, float* lse, unsigned t, unsigned d, unsigned heads, unsigned hd, float scale)
{
    constexpr int R = B / 16, C = HD / 16, P = HD + 1;
    extern __shared__ float shared[];
    float* q = shared;
    float* kv = q + B * P;
    float* w = kv + B * P;
    const unsigned tiles = (t + B - 1) / B, tile = tiles - 1 - blockIdx.x % tiles, sh = blockIdx.x / tiles;
    const unsigned h = sh % heads, tx = threadIdx.x % 16, ty = threadIdx.x / 16, first = tile * B;
    const std::size_t s = sh / heads, row = 3 * std::size_t(d);
    const T* base = qkv + s * t * row + h * hd;
    attention_load<HD, B>(q, base, row, first, t, hd);
    float most[R], sum[R], acc[R][C];
#pragma unroll
    for (int a = 0; a < R; ++a) {
        most[a] = -INFINITY;
        sum[a] = 0.0f;
#pragma unroll
        for (int m = 0; m < C; ++m) acc[a][m] = 0.0f;
    }
    for (unsigned kt = 0; kt <= tile; ++kt) {   // the causal mask: later key tiles are never read
        const unsigned key0 = kt * B;
        __syncthreads();   // q loaded; the last tile's values and weights read
        attention_load<HD, B>(kv, base + d, row, key0, t, hd);
        __syncthreads();
        float sc[R][R] = {};
        for (unsigned c = 0; c < hd; ++c)
#pragma unroll
            for (int a = 0; a < R; ++a)
#pragma unroll
                for (int b = 0; b < R; ++b) sc[a][b] += q[(ty + 16 * a) * P + c] * kv[(tx + 16 * b) * P + c];
#pragma unroll
        for (int a = 0; a < R; ++a) {
            const unsigned i = first + ty + 16 * a;
            float tile_most = -INFINITY;
#pragma unroll
            for (int b = 0; b < R; ++b) {
                const unsigned j = key0 + tx + 16 * b;
                sc[a][b] = j <= i && j < t ? sc[a][b] * scale : -INFINITY;
                tile_most = fmaxf(tile_most, sc[a][b]);
            }
            const float next = fmaxf(most[a], attention_row_max(tile_most));   // finite: key 0 is in tile 0
            const float alpha = expf(most[a] - next);
            float part = 0.0f;
#pragma unroll
            for (int b = 0; b < R; ++b) {
                const float e = expf(sc[a][b] - next);
                w[(ty + 16 * a) * B + tx + 16 * b] = e;
                part += e;
            }
            sum[a] = sum[a] * alpha + attention_row_sum(part);
            most[a] = next;
#pragma unroll
            for (int m = 0; m < C; ++m) acc[a][m] *= alpha;
        }
        __syncthreads();   // the keys read, the weights written
        attention_load<HD, B>(kv, base + 2 * std::size_t(d), row, key0, t, hd);
        __syncthreads();
        const unsigned keys = min(unsigned(B), t - key0);
        for (unsigned j = 0; j < keys; ++j)
#pragma unroll
            for (int a = 0; a < R; ++a) {
                const float p = w[(ty + 16 * a) * B + j];
#pragma unroll
                for (int m = 0; m < C; ++m) acc[a][m] += p * kv[j * P + tx + 16 * m];
            }
    }
#pragma unroll
    for (int a = 0; a < R; ++a) {
        const unsigned i = first + ty + 16 * a;
        if (i >= t) continue;
        T* out = o + (s * t + i) * d + h * hd;
#pragma unroll
        for (int m = 0; m < C; ++m)
            if (tx + 16 * m < hd) out[tx + 16 * m] = core::from_float<T>(acc[a][m] / sum[a]);
        if (tx == 0) lse[std::size_t(sh) * t + i] = most[a] + logf(sum[a]);
    }
}

// delta (n, heads, t): do_i . o_i of each head. `lanes` threads a row (a power of two at most 32),
// lane l summing chunks l, l + lanes, ... of 16 bytes each in order, then the row's lanes added in a
// butterfly. wide: hd a multiple of a chunk's values and o, do 16-byte aligned, each chunk one load;
// otherwise value by value, the same sums in the same order.
template <class T>
__global__ void __launch_bounds__(kAttentionThreads)
    attention_delta(const T* o, const T* d_o, float* delta, unsigned t, unsigned d, unsigned heads, unsigned hd,
                    std::size_t rows, unsigned lanes, bool wide)
{
    constexpr unsigned V = 16 / sizeof(T);   // a chunk's values
    const std::size_t r = (blockIdx.x * std::size_t(kAttentionThreads) + threadIdx.x) / lanes;
    const unsigned lane = threadIdx.x % lanes;
    float v = 0.0f;
    if (r < rows) {   // rows past the end still take part in the butterfly
        const unsigned i = unsigned(r % t);
        const std::size_t sh = r / t, at = ((sh / heads) * t + i) * d + (sh % heads) * hd;
        for (unsigned c = V * lane; c < hd; c += V * lanes) {
            alignas(16) T a[V], b[V];
            if (wide) {
                *reinterpret_cast<uint4*>(a) = *reinterpret_cast<const uint4*>(o + at + c);
                *reinterpret_cast<uint4*>(b) = *reinterpret_cast<const uint4*>(d_o + at + c);
            } else {
#pragma unroll
                for (unsigned k = 0; k < V; ++k) {
                    a[k] = c + k < hd ? o[at + c + k] : T{};
                    b[k] = c + k < hd ? d_o[at + c + k] : T{};
                }
            }
#pragma unroll
            for (unsigned k = 0; k < V; ++k) v += core::to_float(b[k]) * core::to_float(a[k]);
        }
    }
    for (unsigned half = lanes / 2; half > 0; half /= 2) v += __shfl_xor_sync(0xffffffffu, v, half);
    if (r < rows && lane == 0) delta[r] = v;
}

// dk_j = scale sum_{i >= j} ds_ij q_i, dv_j = sum_{i >= j} p_ij do_i, in query order. Block: key tile
// blockIdx.x % tiles of (sample, head) blockIdx.x / tiles. Shared: k, v, q, do (B, HD + 1), p and ds
// (B keys, B queries), lse and delta (B).
template <class T, int HD, int B>
__global__ void __launch_bounds__(kAttentionThreads)
    attention_backward_key(const T* qkv, const T* d_o, const float* lse, const float* delta, T* dqkv, unsigned t,
                           unsigned d, unsigned heads, unsigned hd, float scale)
{
    constexpr int R = B / 16, C = HD / 16, P = HD + 1;
    extern __shared__ float shared[];
    float* k = shared;
    float* v = k + B * P;
    float* q = v + B * P;
    float* g = q + B * P;
    float* p = g + B * P;
    float* ds = p + B * B;
    float* l = ds + B * B;
    float* dl = l + B;
    const unsigned tiles = (t + B - 1) / B, tile = blockIdx.x % tiles, sh = blockIdx.x / tiles;
    const unsigned h = sh % heads, tx = threadIdx.x % 16, ty = threadIdx.x / 16, key0 = tile * B;
    const std::size_t s = sh / heads, row = 3 * std::size_t(d);
    const T* base = qkv + s * t * row + h * hd;
    const T* grad = d_o + s * t * d + h * hd;
    const float* rows = lse + std::size_t(sh) * t;
    const float* deltas = delta + std::size_t(sh) * t;
    attention_load<HD, B>(k, base + d, row, key0, t, hd);
    attention_load<HD, B>(v, base + 2 * std::size_t(d), row, key0, t, hd);
    float dk[R][C] = {}, dv[R][C] = {};
    for (unsigned qt = tile; qt < tiles; ++qt) {   // the causal mask: earlier query tiles see none of these keys
        const unsigned q0 = qt * B;
        __syncthreads();   // the last tile's q, do, p, ds read
        attention_load<HD, B>(q, base, row, q0, t, hd);
        attention_load<HD, B>(g, grad, d, q0, t, hd);
        for (unsigned e = threadIdx.x; e < unsigned(B); e += kAttentionThreads) {
            l[e] = q0 + e < t ? rows[q0 + e] : 0.0f;
            dl[e] = q0 + e < t ? deltas[q0 + e] : 0.0f;
        }
        __syncthreads();
        float sc[R][R] = {}, dp[R][R] = {};
        for (unsigned c = 0; c < hd; ++c)
#pragma unroll
            for (int a = 0; a < R; ++a)
#pragma unroll
                for (int b = 0; b < R; ++b) {
                    sc[a][b] += q[(tx + 16 * b) * P + c] * k[(ty + 16 * a) * P + c];
                    dp[a][b] += g[(tx + 16 * b) * P + c] * v[(ty + 16 * a) * P + c];
                }
#pragma unroll
        for (int a = 0; a < R; ++a)
#pragma unroll
            for (int b = 0; b < R; ++b) {
                const unsigned j = key0 + ty + 16 * a, i = q0 + tx + 16 * b;
                const float pij = j <= i && i < t ? expf(sc[a][b] * scale - l[tx + 16 * b]) : 0.0f;
                p[(ty + 16 * a) * B + tx + 16 * b] = pij;
                ds[(ty + 16 * a) * B + tx + 16 * b] = pij * (dp[a][b] - dl[tx + 16 * b]) * scale;
            }
        __syncthreads();
        const unsigned queries = min(unsigned(B), t - q0);
        for (unsigned i = 0; i < queries; ++i)
#pragma unroll
            for (int a = 0; a < R; ++a) {
                const float pa = p[(ty + 16 * a) * B + i], sa = ds[(ty + 16 * a) * B + i];
#pragma unroll
                for (int m = 0; m < C; ++m) {
                    dv[a][m] += pa * g[i * P + tx + 16 * m];
                    dk[a][m] += sa * q[i * P + tx + 16 * m];
                }
            }
    }
#pragma unroll
    for (int a = 0; a < R; ++a) {
        const unsigned j = key0 + ty + 16 * a;
        if (j >= t) continue;
        T* out = dqkv + (s * t + j) * row + h * hd;
#pragma unroll
        for (int m = 0; m < C; ++m)
            if (tx + 16 * m < hd) {
                out[d + tx + 16 * m] = core::from_float<T>(dk[a][m]);
                out[2 * std::size_t(d) + tx + 16 * m] = core::from_float<T>(dv[a][m]);
            }
    }
}

// dq_i = scale sum_{j <= i} ds_ij k_j, in key order. Block: query tile (the last first) of (sample,
// head) blockIdx.x / tiles. Shared: q, do, k, v (B, HD + 1), ds (B queries, B keys), lse and delta (B).
template <class T, int HD, int B>
__global__ void __launch_bounds__(kAttentionThreads)
    attention_backward_query(const T* qkv, const T* d_o, const float* lse, const float* delta, T* dqkv, unsigned t,
                             unsigned d, unsigned heads, unsigned hd, float scale)
{
    constexpr int R = B / 16, C = HD / 16, P = HD + 1;
    extern __shared__ float shared[];
    float* q = shared;
    float* g = q + B * P;
    float* k = g + B * P;
    float* v = k + B * P;
    float* ds = v + B * P;
    float* l = ds + B * B;
    float* dl = l + B;
    const unsigned tiles = (t + B - 1) / B, tile = tiles - 1 - blockIdx.x % tiles, sh = blockIdx.x / tiles;
    const unsigned h = sh % heads, tx = threadIdx.x % 16, ty = threadIdx.x / 16, first = tile * B;
    const std::size_t s = sh / heads, row = 3 * std::size_t(d);
    const T* base = qkv + s * t * row + h * hd;
    attention_load<HD, B>(q, base, row, first, t, hd);
    attention_load<HD, B>(g, d_o + s * t * d + h * hd, d, first, t, hd);
    for (unsigned e = threadIdx.x; e < unsigned(B); e += kAttentionThreads) {
        l[e] = first + e < t ? lse[std::size_t(sh) * t + first + e] : 0.0f;
        dl[e] = first + e < t ? delta[std::size_t(sh) * t + first + e] : 0.0f;
    }
    float dq[R][C] = {};
    for (unsigned kt = 0; kt <= tile; ++kt) {   // the causal mask
        const unsigned key0 = kt * B;
        __syncthreads();   // q, do, lse, delta loaded; the last tile's k and ds read
        attention_load<HD, B>(k, base + d, row, key0, t, hd);
        attention_load<HD, B>(v, base + 2 * std::size_t(d), row, key0, t, hd);
        __syncthreads();
        float sc[R][R] = {}, dp[R][R] = {};
        for (unsigned c = 0; c < hd; ++c)
#pragma unroll
            for (int a = 0; a < R; ++a)
#pragma unroll
                for (int b = 0; b < R; ++b) {
                    sc[a][b] += q[(ty + 16 * a) * P + c] * k[(tx + 16 * b) * P + c];
                    dp[a][b] += g[(ty + 16 * a) * P + c] * v[(tx + 16 * b) * P + c];
                }
#pragma unroll
        for (int a = 0; a < R; ++a)
#pragma unroll
            for (int b = 0; b < R; ++b) {
                const unsigned i = first + ty + 16 * a, j = key0 + tx + 16 * b;
                const float pij = j <= i && i < t ? expf(sc[a][b] * scale - l[ty + 16 * a]) : 0.0f;
                ds[(ty + 16 * a) * B + tx + 16 * b] = pij * (dp[a][b] - dl[ty + 16 * a]) * scale;
            }
        __syncthreads();
        const unsigned keys = min(unsigned(B), t - key0);
        for (unsigned j = 0; j < keys; ++j)
#pragma unroll
            for (int a = 0; a < R; ++a) {
                const float sa = ds[(ty + 16 * a) * B + j];
#pragma unroll
                for (int m = 0; m < C; ++m) dq[a][m] += sa * k[j * P + tx + 16 * m];
            }
    }
#pragma unroll
    for (int a = 0; a < R; ++a) {
        const unsigned i = first + ty + 16 * a;
        if (i >= t) continue;
        T* out = dqkv + (s * t + i) * row + h * hd;
#pragma unroll
        for (int m = 0; m < C; ++m)
            if (tx + 16 * m < hd) out[tx + 16 * m] = core::from_float<T>(dq[a][m]);
    }
}
} // namespace kernels

namespace detail {
inline void attention_check(std::size_t d, std::size_t heads)
{
    core::require(d / heads <= std::size_t(kernels::kAttentionMaxHead),
                  "CausalSelfAttention on the GPU takes heads of at most " + std::to_string(kernels::kAttentionMaxHead) +
                      " features (D / Heads), not " + std::to_string(d / heads) + ": use more heads");
}

// f(HD) for the head size hd: the tile width, 32, 64 or 128, that holds it.
template <class F>
void with_head_tile(std::size_t hd, F&& f)
{
    if (hd <= 32) f(std::integral_constant<int, 32>{});
    else if (hd <= 64) f(std::integral_constant<int, 64>{});
    else f(std::integral_constant<int, 128>{});
}

// Launches kernel on blocks x 256 threads with `bytes` of dynamic shared memory, raising the kernel's
// limit where bytes pass the default 48 KiB.
template <class... Params, class... Args>
void attention_launch(void (*kernel)(Params...), const char* name, unsigned blocks, std::size_t bytes,
                      cudaStream_t stream, Args... args)
{
    if (bytes > 48 * 1024)
        REPLICA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
    kernel<<<blocks, kernels::kAttentionThreads, bytes, stream>>>(args...);
    check_launch(name);
}
} // namespace detail

// The floats of delta, do_i . o_i a (sample, head, position), that backward keeps in scratch.
template <class T = float>
std::size_t attention_scratch(const Context&, std::size_t n, std::size_t t, std::size_t, std::size_t heads)
{
    static_assert(core::Storage<T>, "activations are float, core::bf16 or core::fp16");
    return n * heads * t;
}

namespace detail {
// Whether the tensor-core kernels run on ctx's device: the image of them loaded there was built for
// compute capability 8.0 or later (the mma.sync forms they use). Asked once a device.
inline bool attention_on_tensor_cores(const Context& ctx)
{
    static std::array<std::atomic<int>, 64> known{};   // a device index's answer: 0 not yet asked, 1 yes, 2 no
    std::atomic<int>& answer = known[std::size_t(ctx.device().index()) % known.size()];
    if (answer.load() == 0) {
        ctx.activate();
        cudaFuncAttributes attributes{};
        const bool yes = cudaFuncGetAttributes(&attributes, &kernels::tc::attention_forward<core::bf16, 64>) == cudaSuccess &&
                         attributes.ptxVersion >= 80;
        cudaGetLastError();   // a device without such an image: not an error of later calls
        answer.store(yes ? 1 : 2);
    }
    return answer.load() == 1;
}

// f(HD) for a head of hd <= 64 features on tensor cores: the tile width, 32 or 64, that holds it.
template <class F>
void with_tc_head_tile(std::size_t hd, F&& f)
{
    if (hd <= 32) f(std::integral_constant<int, 32>{});
    else f(std::integral_constant<int, 64>{});
}

// Whether every row a kernel loads is whole 16-byte chunks: hd a multiple of `values` (a chunk's: 8
// for the tensor-core kernels' 16-bit values) and the tensors 16-byte aligned (offsets are then
// multiples of a chunk too).
inline bool attention_wide(std::size_t hd, const void* a, const void* b, std::size_t values = 8)
{
    return hd % values == 0 && reinterpret_cast<std::uintptr_t>(a) % 16 == 0 && reinterpret_cast<std::uintptr_t>(b) % 16 == 0;
}

template <core::Storage T>
void attention_forward_tc(const Context& ctx, const T* qkv, T* o, float* lse, std::size_t n, std::size_t t,
                          std::size_t d, std::size_t heads)
{
    const std::size_t hd = d / heads;
    const bool wide = attention_wide(hd, qkv, o);
    with_tc_head_tile(hd, [&](auto tile) {
        constexpr int HD = decltype(tile)::value;
        const unsigned blocks = unsigned((t + kernels::tc::kRows - 1) / kernels::tc::kRows * n * heads);
        kernels::tc::attention_forward<T, HD><<<blocks, kernels::tc::kThreads, kernels::tc::shared_bytes<HD>(4, 0),
                                                ctx.stream()>>>(qkv, o, lse, unsigned(t), unsigned(d), unsigned(heads),
                                                                unsigned(hd), 1.0f / std::sqrt(float(hd)), wide);
        check_launch("attention_forward (tensor cores)");
    });
}

template <core::Storage T>
void attention_forward_simt(const Context& ctx, const T* qkv, T* o, float* lse, std::size_t n, std::size_t t,
                            std::size_t d, std::size_t heads)
{
    const std::size_t hd = d / heads;
    const float scale = 1.0f / std::sqrt(float(hd));
    with_head_tile(hd, [&](auto tile) {
        constexpr int HD = decltype(tile)::value, B = kernels::kAttentionForwardRows<HD>;
        const std::size_t bytes = (2 * B * (HD + 1) + B * B) * sizeof(float);
        const unsigned blocks = unsigned((t + B - 1) / B * n * heads);
        attention_launch(&kernels::attention_forward<T, HD, B>, "attention_forward", blocks, bytes, ctx.stream(), qkv, o,
                         lse, unsigned(t), unsigned(d), unsigned(heads), unsigned(hd), scale);
    });
}

// delta = do_i . o_i into scratch.
template <core::Storage T>
void attention_delta(const Context& ctx, const T* o, const T* d_o, float* delta, std::size_t n, std::size_t t,
                     std::size_t d, std::size_t heads)
{
    const std::size_t rows = n * heads * t, hd = d / heads, chunk = 16 / sizeof(T);
    const bool wide = attention_wide(hd, o, d_o, chunk);
    const unsigned lanes = std::min(32u, std::bit_ceil(unsigned((hd + chunk - 1) / chunk)));
    const std::size_t rows_a_block = kernels::kAttentionThreads / lanes;
    attention_launch(&kernels::attention_delta<T>, "attention_delta", unsigned((rows + rows_a_block - 1) / rows_a_block), 0,
                     ctx.stream(), o, d_o, delta, unsigned(t), unsigned(d), unsigned(heads), unsigned(hd), rows, lanes,
                     wide);
}

template <core::Storage T>
void attention_backward_tc(const Context& ctx, const T* qkv, const float* lse, const T* d_o, const float* delta,
                           T* dqkv, std::size_t n, std::size_t t, std::size_t d, std::size_t heads)
{
    const std::size_t hd = d / heads;
    const float scale = 1.0f / std::sqrt(float(hd));
    const bool wide = attention_wide(hd, qkv, d_o);
    with_tc_head_tile(hd, [&](auto tile) {
        constexpr int HD = decltype(tile)::value;
        namespace tc = kernels::tc;
        const unsigned blocks = unsigned((t + tc::kRows - 1) / tc::kRows * n * heads);
        tc::attention_backward_key<T, HD><<<blocks, tc::kThreads, tc::shared_bytes<HD>(4, 4 * tc::kRows), ctx.stream()>>>(
            qkv, d_o, lse, delta, dqkv, unsigned(t), unsigned(d), unsigned(heads), unsigned(hd), scale, wide);
        check_launch("attention_backward_key (tensor cores)");
        tc::attention_backward_query<T, HD><<<blocks, tc::kThreads, tc::shared_bytes<HD>(4, 0), ctx.stream()>>>(
            qkv, d_o, lse, delta, dqkv, unsigned(t), unsigned(d), unsigned(heads), unsigned(hd), scale, wide);
        check_launch("attention_backward_query (tensor cores)");
    });
}

template <core::Storage T>
void attention_backward_simt(const Context& ctx, const T* qkv, const float* lse, const T* d_o, const float* delta,
                             T* dqkv, std::size_t n, std::size_t t, std::size_t d, std::size_t heads)
{
    const std::size_t hd = d / heads;
    const float scale = 1.0f / std::sqrt(float(hd));
    with_head_tile(hd, [&](auto tile) {
        constexpr int HD = decltype(tile)::value, B = kernels::kAttentionBackwardRows<HD>;
        const std::size_t bytes = (4 * B * (HD + 1) + 2 * B * B + 2 * B) * sizeof(float);
        const unsigned blocks = unsigned((t + B - 1) / B * n * heads);
        attention_launch(&kernels::attention_backward_key<T, HD, B>, "attention_backward_key", blocks, bytes, ctx.stream(),
                         qkv, d_o, lse, delta, dqkv, unsigned(t), unsigned(d), unsigned(heads), unsigned(hd), scale);
        attention_launch(&kernels::attention_backward_query<T, HD, B>, "attention_backward_query", blocks,
                         bytes - B * B * sizeof(float), ctx.stream(), qkv, d_o, lse, delta, dqkv, unsigned(t), unsigned(d),
                         unsigned(heads), unsigned(hd), scale);
    });
}

// Whether (T, head size) runs on tensor cores on ctx's device.
template <core::Storage T>
bool attention_tc_serves(const Context& ctx, std::size_t hd)
{
    return !std::is_same_v<T, float> && hd <= std::size_t(kernels::tc::kMaxHead) && attention_on_tensor_cores(ctx);
}
} // namespace detail

// o (n, t, d) and lse (n, heads, t) assigned.
template <core::Storage T>
void attention_forward(const Context& ctx, const T* qkv, T* o, float* lse, std::size_t n, std::size_t t, std::size_t d,
                       std::size_t heads, float*)
{
    if (n == 0 || t == 0) return;
    detail::attention_check(d, heads);
    if (detail::attention_tc_serves<T>(ctx, d / heads)) detail::attention_forward_tc(ctx, qkv, o, lse, n, t, d, heads);
    else detail::attention_forward_simt(ctx, qkv, o, lse, n, t, d, heads);
}

// dqkv (n, t, 3d) assigned, from forward's qkv, o, lse and the gradient of o; scratch: delta.
template <core::Storage T>
void attention_backward(const Context& ctx, const T* qkv, const T* o, const float* lse, const T* d_o, T* dqkv,
                        std::size_t n, std::size_t t, std::size_t d, std::size_t heads, float* scratch)
{
    if (n == 0 || t == 0) return;
    detail::attention_check(d, heads);
    detail::attention_delta(ctx, o, d_o, scratch, n, t, d, heads);
    if (detail::attention_tc_serves<T>(ctx, d / heads))
        detail::attention_backward_tc(ctx, qkv, lse, d_o, scratch, dqkv, n, t, d, heads);
    else detail::attention_backward_simt(ctx, qkv, lse, d_o, scratch, dqkv, n, t, d, heads);
}

} // namespace replica::backend::cuda
