#pragma once
// Causal attention on tensor cores, for bf16 and fp16 activations with heads of at most 64 features
// (attention.hpp chooses these kernels there and keeps its float kernels for the rest); the contract,
// layouts and passes are attention.hpp's, the order of work FlashAttention-2's.
//
// A block is 4 warps, 128 rows of one (sample, head); a warp owns 32 of them, two m16 tiles, so that
// each operand read from shared memory serves the products of both. Products are mma.sync m16n8k16
// with float sums; their operands come from shared memory through ldmatrix (tiles of rows of HD
// values, each row padded by 8 so that ldmatrix's eight rows fall on distinct banks) or, for the
// weights, from the previous product's accumulators, rounded to T: the layout of an m16n8
// accumulator pair is that of an m16k16 operand, so the weights never pass through shared memory.
// Each kernel reads the other side in rounds of R rows (a template argument), copied one round ahead.
//   forward        block: 128 queries; over rounds of keys up to its last row (online softmax in
//                  base 2: a running maximum and a sum per thread and row, the sums of a row's four
//                  threads added once at the end); o = (P V) / sum, lse = (max + log2 sum) ln 2.
//   backward_key   block: 128 keys; over rounds of queries from its first key: S^T = K Q^T and
//                  dP^T = V dO^T, P^T = exp(S^T scale - lse), dS^T = P^T (dP^T - delta);
//                  dV += P^T dO, dK += dS^T Q.
//   backward_query block: 128 queries; over rounds of keys up to its last row: S, dP, P, dS
//                  likewise; dQ += dS K.
// A warp skips a round that its causal mask hides wholly, and the forward masks only the rounds that
// cross its rows' diagonal.
// The weights P and dS are rounded to T as products' operands (as FlashAttention's are); every sum
// is in an order fixed by the code (mma's over 16 rows at a time, in order, whatever R), with no
// atomics, so every result is the same every run.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "replica/core/config.hpp"
#include "replica/core/number.hpp"

namespace REPLICA_NAMESPACE::backend::cuda::kernels::tc {

inline constexpr int kThreads = 128;                // 4 warps
inline constexpr int kWarpTiles = 2;                // m16 tiles of rows a warp owns
inline constexpr int kWarpRows = 16 * kWarpTiles;   // 32
inline constexpr int kBlockRows = kThreads / 32 * kWarpRows;   // a block's own rows, queries or keys: 128
inline constexpr int kMaxHead = 64;

template <int HD>
inline constexpr int kStride = HD + 8;   // a shared row, in 16-bit values

// Shared memory of a kernel holding `rows` rows of HD values and `floats` floats.
template <int HD>
constexpr std::size_t shared_bytes(int rows, int floats)
{
    return std::size_t(rows) * kStride<HD> * 2 + std::size_t(floats) * sizeof(float);
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

// Rows [first, first + R) of one head's q, k, v or do (base: the sample's first row at the part and
// head; stride: a row's values) into a shared tile of R rows; rows at or past t and columns at or past
// hd are zeros, so that masked products are finite. wide: hd, the stride and base are multiples of 8
// values (16 bytes), and each row's eight values are one asynchronous copy (the caller commits and
// waits); otherwise the values are stored at once.
template <int HD, int R, class T>
__device__ inline void load_tile(std::uint16_t* tile, const T* base, std::size_t stride, unsigned first, unsigned t,
                                 unsigned hd, bool wide)
{
    constexpr int chunks = HD / 8;
    const auto* src = reinterpret_cast<const std::uint16_t*>(base);
    for (unsigned e = threadIdx.x; e < unsigned(R * chunks); e += kThreads) {
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

// A warp's m16k16 operands over all HD columns of its kWarpRows rows of a shared tile of the block's
// kBlockRows rows: a[m] for rows 16 m of them.
template <int HD>
__device__ inline void load_rows(std::uint32_t (&a)[kWarpTiles][HD / 16][4], const std::uint16_t* tile, unsigned warp,
                                 unsigned lane)
{
#pragma unroll
    for (int m = 0; m < kWarpTiles; ++m)
#pragma unroll
        for (int k = 0; k < HD / 16; ++k)
            load_matrices(a[m][k], tile + (warp * kWarpRows + 16 * m + lane % 8 + 8 * (lane / 8 % 2)) * kStride<HD> +
                                       k * 16 + 8 * (lane / 16));
}

// c[m][n] (16 x 8 each; m over the warp's row tiles, n over the tile's R rows taken as columns)
// += a x tile^T: the warp's rows times every row of the shared tile, over HD columns. Each of the
// tile's operands, read once, serves all the warp's row tiles.
template <class T, int HD, int R>
__device__ inline void times_rows(float (&c)[kWarpTiles][R / 8][4], const std::uint32_t (&a)[kWarpTiles][HD / 16][4],
                                  const std::uint16_t* tile, unsigned lane)
{
#pragma unroll
    for (int k = 0; k < HD / 16; ++k)
#pragma unroll
        for (int n = 0; n < R / 16; ++n) {
            std::uint32_t b[4];
            load_matrices(b, tile + (n * 16 + lane % 8 + 8 * (lane / 16)) * kStride<HD> + k * 16 + 8 * (lane / 8 % 2));
#pragma unroll
            for (int m = 0; m < kWarpTiles; ++m) {
                mma<T>(c[m][2 * n], a[m][k], b[0], b[1]);
                mma<T>(c[m][2 * n + 1], a[m][k], b[2], b[3]);
            }
        }
}

// c[m][j] (16 x 8 each, j over HD columns) += w x tile: the warp's rows of weights w (accumulators,
// 16 x R a row tile) times the shared tile (R rows, HD columns).
template <class T, int HD, int R>
__device__ inline void times_tile(float (&c)[kWarpTiles][HD / 8][4], const float (&w)[kWarpTiles][R / 8][4],
                                  const std::uint16_t* tile, unsigned lane)
{
#pragma unroll
    for (int k = 0; k < R / 16; ++k) {
        std::uint32_t a[kWarpTiles][4];
#pragma unroll
        for (int m = 0; m < kWarpTiles; ++m) operand_of<T>(a[m], w[m], k);
#pragma unroll
        for (int j = 0; j < HD / 16; ++j) {
            std::uint32_t b[4];
            load_matrices_transposed(b, tile + (k * 16 + lane % 8 + 8 * (lane / 8 % 2)) * kStride<HD> + j * 16 +
                                            8 * (lane / 16));
#pragma unroll
            for (int m = 0; m < kWarpTiles; ++m) {
                mma<T>(c[m][2 * j], a[m], b[0], b[1]);
                mma<T>(c[m][2 * j + 1], a[m], b[2], b[3]);
            }
        }
    }
}

// Row `row` of out (a row of T, at the part and head) from a row tile's accumulators: columns 8j + 2q
// and 8j + 2q + 1 of its half `half` (0: c[j][0..1], row g; 1: c[j][2..3], row g + 8), times `factor`.
template <int HD, class T>
__device__ inline void store_row(T* out, const float (&c)[HD / 8][4], int half, float factor, unsigned hd, unsigned lane)
{
#pragma unroll
    for (int j = 0; j < HD / 8; ++j) {
        const unsigned col = 8 * j + 2 * (lane % 4);
        if (col < hd) out[col] = core::from_float<T>(c[j][2 * half] * factor);
        if (col + 1 < hd) out[col + 1] = core::from_float<T>(c[j][2 * half + 1] * factor);
    }
}

// Round kr's R keys and R values (rows of one head at base + d and base + 2d) into stage kr % 2 of
// stages (a stage: R rows of keys, then R of values), as one group of copies.
template <int HD, int R, class T>
__device__ inline void load_keys(std::uint16_t* stages, const T* base, std::size_t row, unsigned d, unsigned kr,
                                 unsigned t, unsigned hd, bool wide)
{
    std::uint16_t* to = stages + 2 * (kr % 2) * R * kStride<HD>;
    load_tile<HD, R>(to, base + d, row, kr * R, t, hd, wide);
    load_tile<HD, R>(to + R * kStride<HD>, base + 2 * std::size_t(d), row, kr * R, t, hd, wide);
    commit_copies();
}

// The top of a loop over rounds: every warp has read the tiles of the last round (or the block's own
// rows), the next round's copies are issued where there is one (issue), and the current one has landed.
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

// Block: kBlockRows queries (the last first) of (sample, head) blockIdx.x / tiles, over rounds of R
// keys from the first to the last any of its rows sees. Shared: the block's queries, then two stages
// of R keys and R values; the next round's are copied while the current ones are used. A warp skips
// a round none of its rows sees and masks only a round that crosses its rows' diagonal.
template <class T, int HD, int R>
__global__ void __launch_bounds__(kThreads)
    attention_forward(const T* qkv, T* o, float* lse, unsigned t, unsigned d, unsigned heads, unsigned hd, float scale,
                      bool wide)
{
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    constexpr int S = kStride<HD>, W = kWarpTiles, N = R / 8, M = HD / 8;
    extern __shared__ uint4 shared_tc[];
    auto* queries = reinterpret_cast<std::uint16_t*>(shared_tc);
    std::uint16_t* stages = queries + kBlockRows * S;   // stage x: keys at 2x R rows, values after them
    const unsigned tiles = (t + kBlockRows - 1) / kBlockRows, tile = tiles - 1 - blockIdx.x % tiles;
    const unsigned sh = blockIdx.x / tiles, h = sh % heads, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const unsigned first = tile * kBlockRows, own = first + warp * kWarpRows;   // the block's first row, the warp's
    const unsigned last = (min(first + kBlockRows, t) - 1) / R;                 // the last round any row sees
    const std::size_t s = sh / heads, row = 3 * std::size_t(d);
    const T* base = qkv + s * t * row + h * hd;
    const float c = scale * kLog2e;
    load_tile<HD, kBlockRows>(queries, base, row, first, t, hd, wide);
    commit_copies();
    load_keys<HD, R>(stages, base, row, d, 0, t, hd, wide);
    wait_copies<1>();
    __syncthreads();
    std::uint32_t qa[W][HD / 16][4];
    load_rows<HD>(qa, queries, warp, lane);
    float most[W][2], sum[W][2], acc[W][M][4] = {};
#pragma unroll
    for (int m = 0; m < W; ++m)
        for (int r = 0; r < 2; ++r) most[m][r] = -INFINITY, sum[m][r] = 0.0f;
    for (unsigned kr = 0; kr <= last; ++kr) {   // the causal mask: later rounds are never read
        next_round(kr < last, [&] { load_keys<HD, R>(stages, base, row, d, kr + 1, t, hd, wide); });
        const unsigned key0 = kr * R;
        if (key0 >= own + kWarpRows) continue;   // every key after every row of this warp
        const bool mask = key0 + R > own + 1 || key0 + R > t;
        const std::uint16_t* k = stages + 2 * (kr % 2) * R * S;
        const std::uint16_t* v = k + R * S;
        float w[W][N][4] = {};
        times_rows<T, HD, R>(w, qa, k, lane);
#pragma unroll
        for (int m = 0; m < W; ++m) {
            float tile_most[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int n = 0; n < N; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const unsigned j = key0 + 8 * n + 2 * (lane % 4) + e % 2, i = own + 16 * m + lane / 4 + 8 * (e / 2);
                    w[m][n][e] = !mask || (j <= i && j < t) ? w[m][n][e] * c : -INFINITY;
                    tile_most[e / 2] = fmaxf(tile_most[e / 2], w[m][n][e]);
                }
            float alpha[2], top[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                tile_most[r] = fmaxf(tile_most[r], __shfl_xor_sync(0xffffffffu, tile_most[r], 1));
                tile_most[r] = fmaxf(tile_most[r], __shfl_xor_sync(0xffffffffu, tile_most[r], 2));
                const float next = fmaxf(most[m][r], tile_most[r]);
                top[r] = next == -INFINITY ? 0.0f : next;   // a row that sees no key yet: its weights are zeros
                alpha[r] = exp2f(most[m][r] - top[r]);
                most[m][r] = next;
                sum[m][r] *= alpha[r];
            }
#pragma unroll
            for (int n = 0; n < N; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    w[m][n][e] = exp2f(w[m][n][e] - top[e / 2]);
                    sum[m][e / 2] += w[m][n][e];
                }
#pragma unroll
            for (int j = 0; j < M; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[m][j][e] *= alpha[e / 2];
        }
        times_tile<T, HD, R>(acc, w, v, lane);
    }
#pragma unroll
    for (int m = 0; m < W; ++m)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float total = sum[m][r];
            total += __shfl_xor_sync(0xffffffffu, total, 1);
            total += __shfl_xor_sync(0xffffffffu, total, 2);
            const unsigned i = own + 16 * m + lane / 4 + 8 * r;
            if (i >= t) continue;
            store_row<HD>(o + (s * t + i) * d + h * hd, acc[m], r, 1.0f / total, hd, lane);
            if (lane % 4 == 0) lse[std::size_t(sh) * t + i] = (most[m][r] + log2f(total)) * kLn2;
        }
#endif
}

// dk_j = scale sum_{i >= j} ds_ij q_i, dv_j = sum_{i >= j} p_ij do_i, over rounds of R queries in order.
// Block: kBlockRows keys of (sample, head) blockIdx.x / tiles, from the round of its first key to the
// last. Shared: the block's keys and values, then two stages of R queries, R rows of do, and their
// rows' lse (base 2) and delta; the next round's are copied while the current ones are used. A warp
// skips a round whose queries all come before its keys.
template <class T, int HD, int R>
__global__ void __launch_bounds__(kThreads)
    attention_backward_key(const T* qkv, const T* d_o, const float* lse, const float* delta, T* dqkv, unsigned t,
                           unsigned d, unsigned heads, unsigned hd, float scale, bool wide)
{
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    constexpr int S = kStride<HD>, W = kWarpTiles, N = R / 8, M = HD / 8;
    extern __shared__ uint4 shared_tc[];
    auto* keys = reinterpret_cast<std::uint16_t*>(shared_tc);   // keys, then values: kBlockRows rows each
    std::uint16_t* stages = keys + 2 * kBlockRows * S;          // stage x: q at 2x R rows, do after them
    auto* rows_of = reinterpret_cast<float*>(stages + 4 * R * S);   // stage x: lse at 2x R, delta after it
    const unsigned tiles = (t + kBlockRows - 1) / kBlockRows, tile = blockIdx.x % tiles, sh = blockIdx.x / tiles;
    const unsigned h = sh % heads, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const unsigned key0 = tile * kBlockRows, own = key0 + warp * kWarpRows;   // the block's first key, the warp's
    const unsigned first = key0 / R, last = (t - 1) / R;                      // the rounds of queries
    const std::size_t s = sh / heads, row = 3 * std::size_t(d);
    const T* base = qkv + s * t * row + h * hd;
    const T* grad = d_o + s * t * d + h * hd;
    const float c = scale * kLog2e;
    auto load_queries = [&](unsigned qr) {
        const unsigned x = (qr - first) % 2, q0 = qr * R;
        std::uint16_t* to = stages + 2 * x * R * S;
        load_tile<HD, R>(to, base, row, q0, t, hd, wide);
        load_tile<HD, R>(to + R * S, grad, d, q0, t, hd, wide);
        commit_copies();
        float* l = rows_of + 2 * x * R;
        for (unsigned e = threadIdx.x; e < unsigned(R); e += kThreads) {
            l[e] = q0 + e < t ? lse[std::size_t(sh) * t + q0 + e] * kLog2e : 0.0f;
            l[R + e] = q0 + e < t ? delta[std::size_t(sh) * t + q0 + e] : 0.0f;
        }
    };
    load_tile<HD, kBlockRows>(keys, base + d, row, key0, t, hd, wide);
    load_tile<HD, kBlockRows>(keys + kBlockRows * S, base + 2 * std::size_t(d), row, key0, t, hd, wide);
    commit_copies();
    load_queries(first);
    wait_copies<1>();
    __syncthreads();
    std::uint32_t ka[W][HD / 16][4], va[W][HD / 16][4];
    load_rows<HD>(ka, keys, warp, lane);
    load_rows<HD>(va, keys + kBlockRows * S, warp, lane);
    float dk[W][M][4] = {}, dv[W][M][4] = {};
    for (unsigned qr = first; qr <= last; ++qr) {   // the causal mask: earlier queries see none of these keys
        next_round(qr < last, [&] { load_queries(qr + 1); });
        const unsigned q0 = qr * R;
        if (q0 + R <= own) continue;   // every query of the round before every key of this warp
        const unsigned x = (qr - first) % 2;
        const std::uint16_t* q = stages + 2 * x * R * S;
        const std::uint16_t* g = q + R * S;
        const float* l = rows_of + 2 * x * R;
        const float* dl = l + R;
        float p[W][N][4] = {}, ds[W][N][4] = {};
        times_rows<T, HD, R>(p, ka, q, lane);    // S^T
        times_rows<T, HD, R>(ds, va, g, lane);   // dP^T
#pragma unroll
        for (int m = 0; m < W; ++m)
#pragma unroll
            for (int n = 0; n < N; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const unsigned at = 8 * n + 2 * (lane % 4) + e % 2, i = q0 + at;
                    const unsigned j = own + 16 * m + lane / 4 + 8 * (e / 2);
                    p[m][n][e] = j <= i && i < t ? exp2f(p[m][n][e] * c - l[at]) : 0.0f;
                    ds[m][n][e] = p[m][n][e] * (ds[m][n][e] - dl[at]);
                }
        times_tile<T, HD, R>(dv, p, g, lane);
        times_tile<T, HD, R>(dk, ds, q, lane);
    }
#pragma unroll
    for (int m = 0; m < W; ++m)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const unsigned j = own + 16 * m + lane / 4 + 8 * r;
            if (j >= t) continue;
            T* out = dqkv + (s * t + j) * row + h * hd;
            store_row<HD>(out + d, dk[m], r, scale, hd, lane);
            store_row<HD>(out + 2 * std::size_t(d), dv[m], r, 1.0f, hd, lane);
        }
#endif
}

// dq_i = scale sum_{j <= i} ds_ij k_j, over rounds of R keys in order. Block: kBlockRows queries (the
// last first) of (sample, head) blockIdx.x / tiles. Shared: the block's queries and rows of do, then two
// stages of R keys and R values; the next round's are copied while the current ones are used.
template <class T, int HD, int R>
__global__ void __launch_bounds__(kThreads)
    attention_backward_query(const T* qkv, const T* d_o, const float* lse, const float* delta, T* dqkv, unsigned t,
                             unsigned d, unsigned heads, unsigned hd, float scale, bool wide)
{
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    constexpr int S = kStride<HD>, W = kWarpTiles, N = R / 8, M = HD / 8;
    extern __shared__ uint4 shared_tc[];
    auto* queries = reinterpret_cast<std::uint16_t*>(shared_tc);   // queries, then do: kBlockRows rows each
    std::uint16_t* stages = queries + 2 * kBlockRows * S;          // stage x: keys at 2x R rows, values after
    const unsigned tiles = (t + kBlockRows - 1) / kBlockRows, tile = tiles - 1 - blockIdx.x % tiles;
    const unsigned sh = blockIdx.x / tiles, h = sh % heads, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const unsigned first = tile * kBlockRows, own = first + warp * kWarpRows;
    const unsigned last = (min(first + kBlockRows, t) - 1) / R;
    const std::size_t s = sh / heads, row = 3 * std::size_t(d);
    const T* base = qkv + s * t * row + h * hd;
    const float c = scale * kLog2e;
    load_tile<HD, kBlockRows>(queries, base, row, first, t, hd, wide);
    load_tile<HD, kBlockRows>(queries + kBlockRows * S, d_o + s * t * d + h * hd, d, first, t, hd, wide);
    commit_copies();
    load_keys<HD, R>(stages, base, row, d, 0, t, hd, wide);
    wait_copies<1>();
    __syncthreads();
    std::uint32_t qa[W][HD / 16][4], ga[W][HD / 16][4];
    load_rows<HD>(qa, queries, warp, lane);
    load_rows<HD>(ga, queries + kBlockRows * S, warp, lane);
    float l[W][2], dl[W][2];
#pragma unroll
    for (int m = 0; m < W; ++m)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const unsigned i = own + 16 * m + lane / 4 + 8 * r;
            l[m][r] = i < t ? lse[std::size_t(sh) * t + i] * kLog2e : 0.0f;
            dl[m][r] = i < t ? delta[std::size_t(sh) * t + i] : 0.0f;
        }
    float dq[W][M][4] = {};
    for (unsigned kr = 0; kr <= last; ++kr) {   // the causal mask
        next_round(kr < last, [&] { load_keys<HD, R>(stages, base, row, d, kr + 1, t, hd, wide); });
        const unsigned key0 = kr * R;
        if (key0 >= own + kWarpRows) continue;   // every key after every row of this warp
        const std::uint16_t* k = stages + 2 * (kr % 2) * R * S;
        const std::uint16_t* v = k + R * S;
        float p[W][N][4] = {}, ds[W][N][4] = {};
        times_rows<T, HD, R>(p, qa, k, lane);    // S
        times_rows<T, HD, R>(ds, ga, v, lane);   // dP
#pragma unroll
        for (int m = 0; m < W; ++m)
#pragma unroll
            for (int n = 0; n < N; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const unsigned j = key0 + 8 * n + 2 * (lane % 4) + e % 2, i = own + 16 * m + lane / 4 + 8 * (e / 2);
                    const float pij = j <= i && i < t ? exp2f(p[m][n][e] * c - l[m][e / 2]) : 0.0f;
                    ds[m][n][e] = pij * (ds[m][n][e] - dl[m][e / 2]);
                }
        times_tile<T, HD, R>(dq, ds, k, lane);
    }
#pragma unroll
    for (int m = 0; m < W; ++m)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const unsigned i = own + 16 * m + lane / 4 + 8 * r;
            if (i < t) store_row<HD>(dqkv + (s * t + i) * row + h * hd, dq[m], r, scale, hd, lane);
        }
#endif
}

} // namespace replica::backend::cuda::kernels::tc
