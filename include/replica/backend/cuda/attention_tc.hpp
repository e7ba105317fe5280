#pragma once
// Causal attention on tensor cores, for bf16 and fp16 activations with heads of at most 64 features
// (attention.hpp chooses these kernels there and keeps its float kernels for the rest); the contract,
// layouts and passes are attention.hpp's, the order of work FlashAttention-2's.
//
// A block is 4 warps, 64 rows of one (sample, head); a warp owns 16 of them. Products are mma.sync
// m16n8k16 with float sums; their operands come from shared memory through ldmatrix (tiles of
// kRows x HD values, each row padded by 8 so that ldmatrix's eight rows fall on distinct banks) or,
// for the weights, from the previous product's accumulators, rounded to T: the layout of an m16n8
// accumulator pair is that of an m16k16 operand, so the weights never pass through shared memory.
//   forward        block: 64 queries; over key tiles 0..own (online softmax in base 2: a running
//                  maximum and a sum per thread and row, the sums of a row's four threads added once
//                  at the end); o = (P V) / sum, lse = (max + log2 sum) ln 2.
//   backward_key   block: 64 keys; over query tiles own..last: S^T = K Q^T and dP^T = V dO^T,
//                  P^T = exp(S^T scale - lse), dS^T = P^T (dP^T - delta); dV += P^T dO, dK += dS^T Q.
//   backward_query block: 64 queries; over key tiles 0..own: S, dP, P, dS likewise; dQ += dS K.
// The weights P and dS are rounded to T as products' operands (as FlashAttention's are); every sum
// is in an order fixed by the code (mma's, then key or query tiles in order), with no atomics, so
// every result is the same every run.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "replica/core/config.hpp"
#include "replica/core/number.hpp"

namespace REPLICA_NAMESPACE::backend::cuda::kernels::tc {

inline constexpr int kThreads = 128;   // 4 warps
inline constexpr int kRows = 64;       // a tile's rows: queries or keys
inline constexpr int kMaxHead = 64;

template <int HD>
inline constexpr int kStride = HD + 8;   // a shared tile's row, in 16-bit values

// Shared memory of a kernel holding `tiles` tiles of (kRows, HD) and `floats` floats.
template <int HD>
constexpr std::size_t shared_bytes(int tiles, int floats)
{
    return std::size_t(tiles) * kRows * kStride<HD> * 2 + std::size_t(floats) * sizeof(float);
}

__device__ inline std::uint32_t shared_address(const void* p)
{
    return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 matrices of 16-bit values from shared memory; lane l gives the address of row l % 8 of
// matrix l / 8, and receives in r[m] row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1 of matrix m (of
// its transpose, with .trans).
__device__ inline void load_matrices(std::uint32_t (&r)[4], const std::uint16_t* p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(p)));
}
__device__ inline void load_matrices_transposed(std::uint32_t (&r)[4], const std::uint16_t* p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(shared_address(p)));
}

// c (16 x 8, float) += a (16 x 16) b (16 x 8), operands of T. Fragments (lane l, g = l / 4, q = l % 4):
// a[0] row g columns 2q, 2q+1; a[1] row g + 8; a[2] row g, columns + 8; a[3] row g + 8, columns + 8;
// b0 rows 2q, 2q+1 of column g, b1 rows + 8; c[0], c[1] row g, columns 2q, 2q+1; c[2], c[3] row g + 8.
template <class T>
__device__ inline void mma(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1)
{
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    if constexpr (std::is_same_v<T, core::bf16>)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// Two floats rounded to T (to nearest, ties to even) as one 32-bit operand register, lo in the low half.
template <class T>
__device__ inline std::uint32_t pack(float lo, float hi)
{
    std::uint32_t r = 0;
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    if constexpr (std::is_same_v<T, core::bf16>)
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    else
        asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
}

// The m16k16 operand of rows 16 of the accumulators c[2k] and c[2k + 1] (columns 16k to 16k + 15).
template <class T, int N>
__device__ inline void operand_of(std::uint32_t (&a)[4], const float (&c)[N][4], int k)
{
    a[0] = pack<T>(c[2 * k][0], c[2 * k][1]);
    a[1] = pack<T>(c[2 * k][2], c[2 * k][3]);
    a[2] = pack<T>(c[2 * k + 1][0], c[2 * k + 1][1]);
    a[3] = pack<T>(c[2 * k + 1][2], c[2 * k + 1][3]);
}

// 16 bytes from global to shared memory, asynchronously; zeros where !valid (src is then not read).
__device__ inline void copy_async(std::uint16_t* dst, const std::uint16_t* src, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}
// The copies this thread issued since the last commit, as one group.
__device__ inline void commit_copies() { asm volatile("cp.async.commit_group;\n" ::); }
// Until at most `pending` of this thread's groups are in flight.
template <int pending>
__device__ inline void wait_copies()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(pending));
}

// Rows [first, first + kRows) of one head's q, k, v or do (base: the sample's first row at the part
// and head; stride: a row's values) into a shared tile; rows at or past t and columns at or past hd
// are zeros, so that masked products are finite. wide: hd, the stride and base are multiples of 8
// values (16 bytes), and each row's eight values are one asynchronous copy (the caller commits and
// waits); otherwise the values are stored at once.
template <int HD, class T>
__device__ inline void load_tile(std::uint16_t* tile, const T* base, std::size_t stride, unsigned first, unsigned t,
                                 unsigned hd, bool wide)
{
    constexpr int chunks = HD / 8;
    const auto* src = reinterpret_cast<const std::uint16_t*>(base);
    for (unsigned e = threadIdx.x; e < unsigned(kRows * chunks); e += kThreads) {
        const unsigned r = e / chunks, c = e % chunks * 8;
        std::uint16_t* dst = tile + r * kStride<HD> + c;
        const bool in = first + r < t;
        const std::uint16_t* p = src + (in ? (first + r) * stride + c : 0);
        if (wide) {
            copy_async(dst, p, in && c < hd);
            continue;
        }
        std::uint16_t x[8];
#pragma unroll
        for (unsigned k = 0; k < 8; ++k) x[k] = in && c + k < hd ? p[k] : std::uint16_t(0);
        *reinterpret_cast<uint4*>(dst) = uint4{x[0] | std::uint32_t(x[1]) << 16, x[2] | std::uint32_t(x[3]) << 16,
                                               x[4] | std::uint32_t(x[5]) << 16, x[6] | std::uint32_t(x[7]) << 16};
    }
}

// A warp's m16k16 operands over all HD columns of its 16 rows of a shared tile.
template <int HD>
__device__ inline void load_rows(std::uint32_t (&a)[HD / 16][4], const std::uint16_t* tile, unsigned warp, unsigned lane)
{
#pragma unroll
    for (int k = 0; k < HD / 16; ++k)
        load_matrices(a[k], tile + (warp * 16 + lane % 8 + 8 * (lane / 8 % 2)) * kStride<HD> + k * 16 + 8 * (lane / 16));
}

// c[n] (16 x 8 per n, n over the tile's 64 rows taken as columns) += a x tile^T: the warp's 16 rows
// times every row of the shared tile, over HD columns.
template <class T, int HD>
__device__ inline void times_rows(float (&c)[kRows / 8][4], const std::uint32_t (&a)[HD / 16][4],
                                  const std::uint16_t* tile, unsigned lane)
{
#pragma unroll
    for (int k = 0; k < HD / 16; ++k)
#pragma unroll
        for (int n = 0; n < kRows / 16; ++n) {
            std::uint32_t b[4];
            load_matrices(b, tile + (n * 16 + lane % 8 + 8 * (lane / 16)) * kStride<HD> + k * 16 + 8 * (lane / 8 % 2));
            mma<T>(c[2 * n], a[k], b[0], b[1]);
            mma<T>(c[2 * n + 1], a[k], b[2], b[3]);
        }
}

// c[m] (16 x 8 per m, over HD columns) += w x tile: the warp's 16 rows of weights w (16 x 64,
// accumulators) times the shared tile (64 rows, HD columns).
template <class T, int HD>
__device__ inline void times_tile(float (&c)[HD / 8][4], const float (&w)[kRows / 8][4], const std::uint16_t* tile,
                                  unsigned lane)
{
#pragma unroll
    for (int k = 0; k < kRows / 16; ++k) {
        std::uint32_t a[4];
        operand_of<T>(a, w, k);
#pragma unroll
        for (int m = 0; m < HD / 16; ++m) {
            std::uint32_t b[4];
            load_matrices_transposed(b, tile + (k * 16 + lane % 8 + 8 * (lane / 8 % 2)) * kStride<HD> + m * 16 +
                                            8 * (lane / 16));
            mma<T>(c[2 * m], a, b[0], b[1]);
            mma<T>(c[2 * m + 1], a, b[2], b[3]);
        }
    }
}

// Row `row` of out (a row of T, at the part and head) from a warp's accumulators: columns 8m + 2q and
// 8m + 2q + 1 of its half `half` (0: c[m][0..1], row g; 1: c[m][2..3], row g + 8), times `factor`.
template <int HD, class T>
__device__ inline void store_row(T* out, const float (&c)[HD / 8][4], int half, float factor, unsigned hd, unsigned lane)
{
#pragma unroll
    for (int m = 0; m < HD / 8; ++m) {
        const unsigned col = 8 * m + 2 * (lane % 4);
        if (col < hd) out[col] = core::from_float<T>(c[m][2 * half] * factor);
        if (col + 1 < hd) out[col + 1] = core::from_float<T>(c[m][2 * half + 1] * factor);
    }
}

// Stage x of two in shared memory, each a pair of tiles: (k, v) or (q, do).
template <int HD>
__device__ inline std::uint16_t* stage(std::uint16_t* stages, unsigned x)
{
    return stages + 2 * x * kRows * kStride<HD>;
}

// Key tile kt's keys and values (rows of one head at base + d and base + 2d) into stage (kt + 1) % 2
// (tile 0 in stage 1: stage 0 holds the block's own rows first), as one group of copies.
template <int HD, class T>
__device__ inline void load_keys(std::uint16_t* stages, const T* base, std::size_t row, unsigned d, unsigned kt,
                                 unsigned t, unsigned hd, bool wide)
{
    std::uint16_t* to = stage<HD>(stages, (kt + 1) % 2);
    load_tile<HD>(to, base + d, row, kt * kRows, t, hd, wide);
    load_tile<HD>(to + kRows * kStride<HD>, base + 2 * std::size_t(d), row, kt * kRows, t, hd, wide);
    commit_copies();
}

// The top of a loop over tiles: every warp has read the tiles of the last round (or the block's own
// rows), the next tile's copies are issued where there is one (issue), and the current one has landed.
template <class Issue>
__device__ inline void next_round(bool more, Issue&& issue)
{
    __syncthreads();
    if (more) {
        issue();
        wait_copies<1>();
    } else {
        wait_copies<0>();
    }
    __syncthreads();
}

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// Block: query tile (the last first) of (sample, head) blockIdx.x / tiles. Shared: two stages of a
// key tile and a value tile, the first holding q until it is in registers; the next tiles are copied
// while the current ones are used.
template <class T, int HD>
__global__ void __launch_bounds__(kThreads)
    attention_forward(const T* qkv, T* o, float* lse, unsigned t, unsigned d, unsigned heads, unsigned hd,
                      float scale, bool wide)
{
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    constexpr int S = kStride<HD>, N = kRows / 8, M = HD / 8;
    extern __shared__ uint4 shared_tc[];
    auto* stages = reinterpret_cast<std::uint16_t*>(shared_tc);   // stage x: k at 2x, v at 2x + 1 tiles
    const unsigned tiles = (t + kRows - 1) / kRows, tile = tiles - 1 - blockIdx.x % tiles, sh = blockIdx.x / tiles;
    const unsigned h = sh % heads, warp = threadIdx.x / 32, lane = threadIdx.x % 32, first = tile * kRows;
    const std::size_t s = sh / heads, row = 3 * std::size_t(d);
    const T* base = qkv + s * t * row + h * hd;
    const float c = scale * kLog2e;
    load_tile<HD>(stages, base, row, first, t, hd, wide);
    commit_copies();
    load_keys<HD>(stages, base, row, d, 0, t, hd, wide);
    wait_copies<1>();
    __syncthreads();
    std::uint32_t qa[HD / 16][4];
    load_rows<HD>(qa, stages, warp, lane);
    const unsigned i0 = first + warp * 16 + lane / 4;   // this thread's rows: i0, i0 + 8
    float most[2] = {-INFINITY, -INFINITY}, sum[2] = {0.0f, 0.0f}, acc[M][4] = {};
    for (unsigned kt = 0; kt <= tile; ++kt) {   // the causal mask: later key tiles are never read
        next_round(kt < tile, [&] { load_keys<HD>(stages, base, row, d, kt + 1, t, hd, wide); });
        const std::uint16_t* k = stage<HD>(stages, (kt + 1) % 2);
        const std::uint16_t* v = k + kRows * S;
        const unsigned key0 = kt * kRows;
        float w[N][4] = {};
        times_rows<T, HD>(w, qa, k, lane);
        float tile_most[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < N; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const unsigned j = key0 + 8 * n + 2 * (lane % 4) + e % 2, i = i0 + 8 * (e / 2);
                w[n][e] = kt < tile || (j <= i && j < t) ? w[n][e] * c : -INFINITY;   // only the diagonal tile masks
                tile_most[e / 2] = fmaxf(tile_most[e / 2], w[n][e]);
            }
        float alpha[2], top[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            tile_most[r] = fmaxf(tile_most[r], __shfl_xor_sync(0xffffffffu, tile_most[r], 1));
            tile_most[r] = fmaxf(tile_most[r], __shfl_xor_sync(0xffffffffu, tile_most[r], 2));
            const float next = fmaxf(most[r], tile_most[r]);
            top[r] = next == -INFINITY ? 0.0f : next;   // a row that sees no key yet: its weights are zeros
            alpha[r] = exp2f(most[r] - top[r]);
            most[r] = next;
            sum[r] *= alpha[r];
        }
#pragma unroll
        for (int n = 0; n < N; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                w[n][e] = exp2f(w[n][e] - top[e / 2]);
                sum[e / 2] += w[n][e];
            }
#pragma unroll
        for (int m = 0; m < M; ++m)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[m][e] *= alpha[e / 2];
        times_tile<T, HD>(acc, w, v, lane);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
        sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
        const unsigned i = i0 + 8 * r;
        if (i >= t) continue;
        store_row<HD>(o + (s * t + i) * d + h * hd, acc, r, 1.0f / sum[r], hd, lane);
        if (lane % 4 == 0) lse[std::size_t(sh) * t + i] = (most[r] + log2f(sum[r])) * kLn2;
    }
#endif
}

// dk_j = scale sum_{i >= j} ds_ij q_i, dv_j = sum_{i >= j} p_ij do_i, over query tiles in order.
// Block: key tile blockIdx.x % tiles of (sample, head) blockIdx.x / tiles. Shared: two stages of a
// query tile, a tile of do, and their rows' lse (base 2) and delta; the first stage holds k and v
// until they are in registers. The next tiles are copied while the current ones are used.
template <class T, int HD>
__global__ void __launch_bounds__(kThreads)
    attention_backward_key(const T* qkv, const T* d_o, const float* lse, const float* delta, T* dqkv, unsigned t,
                           unsigned d, unsigned heads, unsigned hd, float scale, bool wide)
{
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    constexpr int S = kStride<HD>, N = kRows / 8, M = HD / 8;
    extern __shared__ uint4 shared_tc[];
    auto* stages = reinterpret_cast<std::uint16_t*>(shared_tc);   // stage x: q at 2x, do at 2x + 1 tiles
    auto* rows_of = reinterpret_cast<float*>(stages + 4 * kRows * S);   // stage x: lse at 2x, delta at 2x + 1
    const unsigned tiles = (t + kRows - 1) / kRows, tile = blockIdx.x % tiles, sh = blockIdx.x / tiles;
    const unsigned h = sh % heads, warp = threadIdx.x / 32, lane = threadIdx.x % 32, key0 = tile * kRows;
    const std::size_t s = sh / heads, row = 3 * std::size_t(d);
    const T* base = qkv + s * t * row + h * hd;
    const T* grad = d_o + s * t * d + h * hd;
    const float c = scale * kLog2e;
    auto load_queries = [&](unsigned qt) {   // stage (qt - tile + 1) % 2: k and v are in stage 0 at first
        const unsigned x = (qt - tile + 1) % 2, q0 = qt * kRows;
        std::uint16_t* to = stage<HD>(stages, x);
        load_tile<HD>(to, base, row, q0, t, hd, wide);
        load_tile<HD>(to + kRows * S, grad, d, q0, t, hd, wide);
        commit_copies();
        float* l = rows_of + 2 * x * kRows;
        for (unsigned e = threadIdx.x; e < unsigned(kRows); e += kThreads) {
            l[e] = q0 + e < t ? lse[std::size_t(sh) * t + q0 + e] * kLog2e : 0.0f;
            l[kRows + e] = q0 + e < t ? delta[std::size_t(sh) * t + q0 + e] : 0.0f;
        }
    };
    load_tile<HD>(stages, base + d, row, key0, t, hd, wide);
    load_tile<HD>(stages + kRows * S, base + 2 * std::size_t(d), row, key0, t, hd, wide);
    commit_copies();
    load_queries(tile);
    wait_copies<1>();
    __syncthreads();
    std::uint32_t ka[HD / 16][4], va[HD / 16][4];
    load_rows<HD>(ka, stages, warp, lane);
    load_rows<HD>(va, stages + kRows * S, warp, lane);
    const unsigned j0 = key0 + warp * 16 + lane / 4;   // this thread's keys: j0, j0 + 8
    float dk[M][4] = {}, dv[M][4] = {};
    for (unsigned qt = tile; qt < tiles; ++qt) {   // the causal mask: earlier query tiles see none of these keys
        next_round(qt + 1 < tiles, [&] { load_queries(qt + 1); });
        const unsigned x = (qt - tile + 1) % 2, q0 = qt * kRows;
        const std::uint16_t* q = stage<HD>(stages, x);
        const std::uint16_t* g = q + kRows * S;
        const float* l = rows_of + 2 * x * kRows;
        const float* dl = l + kRows;
        float p[N][4] = {}, ds[N][4] = {};
        times_rows<T, HD>(p, ka, q, lane);    // S^T
        times_rows<T, HD>(ds, va, g, lane);   // dP^T
#pragma unroll
        for (int n = 0; n < N; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const unsigned at = 8 * n + 2 * (lane % 4) + e % 2, i = q0 + at, j = j0 + 8 * (e / 2);
                p[n][e] = j <= i && i < t ? exp2f(p[n][e] * c - l[at]) : 0.0f;
                ds[n][e] = p[n][e] * (ds[n][e] - dl[at]);
            }
        times_tile<T, HD>(dv, p, g, lane);
        times_tile<T, HD>(dk, ds, q, lane);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const unsigned j = j0 + 8 * r;
        if (j >= t) continue;
        T* out = dqkv + (s * t + j) * row + h * hd;
        store_row<HD>(out + d, dk, r, scale, hd, lane);
        store_row<HD>(out + 2 * std::size_t(d), dv, r, 1.0f, hd, lane);
    }
#endif
}

// dq_i = scale sum_{j <= i} ds_ij k_j, over key tiles in order. Block: query tile (the last first) of
// (sample, head) blockIdx.x / tiles. Shared: two stages of a key tile and a value tile, the first
// holding q and do until they are in registers; the next tiles are copied while the current ones are used.
template <class T, int HD>
__global__ void __launch_bounds__(kThreads)
    attention_backward_query(const T* qkv, const T* d_o, const float* lse, const float* delta, T* dqkv, unsigned t,
                             unsigned d, unsigned heads, unsigned hd, float scale, bool wide)
{
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    constexpr int S = kStride<HD>, N = kRows / 8, M = HD / 8;
    extern __shared__ uint4 shared_tc[];
    auto* stages = reinterpret_cast<std::uint16_t*>(shared_tc);   // stage x: k at 2x, v at 2x + 1 tiles
    const unsigned tiles = (t + kRows - 1) / kRows, tile = tiles - 1 - blockIdx.x % tiles, sh = blockIdx.x / tiles;
    const unsigned h = sh % heads, warp = threadIdx.x / 32, lane = threadIdx.x % 32, first = tile * kRows;
    const std::size_t s = sh / heads, row = 3 * std::size_t(d);
    const T* base = qkv + s * t * row + h * hd;
    const float c = scale * kLog2e;
    load_tile<HD>(stages, base, row, first, t, hd, wide);
    load_tile<HD>(stages + kRows * S, d_o + s * t * d + h * hd, d, first, t, hd, wide);
    commit_copies();
    load_keys<HD>(stages, base, row, d, 0, t, hd, wide);
    wait_copies<1>();
    __syncthreads();
    std::uint32_t qa[HD / 16][4], ga[HD / 16][4];
    load_rows<HD>(qa, stages, warp, lane);
    load_rows<HD>(ga, stages + kRows * S, warp, lane);
    const unsigned i0 = first + warp * 16 + lane / 4;   // this thread's rows: i0, i0 + 8
    float l[2], dl[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const bool in = i0 + 8 * r < t;
        l[r] = in ? lse[std::size_t(sh) * t + i0 + 8 * r] * kLog2e : 0.0f;
        dl[r] = in ? delta[std::size_t(sh) * t + i0 + 8 * r] : 0.0f;
    }
    float dq[M][4] = {};
    for (unsigned kt = 0; kt <= tile; ++kt) {   // the causal mask
        next_round(kt < tile, [&] { load_keys<HD>(stages, base, row, d, kt + 1, t, hd, wide); });
        const std::uint16_t* k = stage<HD>(stages, (kt + 1) % 2);
        const std::uint16_t* v = k + kRows * S;
        const unsigned key0 = kt * kRows;
        float p[N][4] = {}, ds[N][4] = {};
        times_rows<T, HD>(p, qa, k, lane);    // S
        times_rows<T, HD>(ds, ga, v, lane);   // dP
#pragma unroll
        for (int n = 0; n < N; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const unsigned j = key0 + 8 * n + 2 * (lane % 4) + e % 2, i = i0 + 8 * (e / 2);
                const float pij = j <= i && i < t ? exp2f(p[n][e] * c - l[e / 2]) : 0.0f;
                ds[n][e] = pij * (ds[n][e] - dl[e / 2]);
            }
        times_tile<T, HD>(dq, ds, k, lane);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const unsigned i = i0 + 8 * r;
        if (i < t) store_row<HD>(dqkv + (s * t + i) * row + h * hd, dq, r, scale, hd, lane);
    }
#endif
}

} // namespace replica::backend::cuda::kernels::tc
