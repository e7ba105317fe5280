#pragma once
// Token and position embeddings on the GPU, the CPU backend's contract (backend/cpu/embedding.hpp):
// activations T computed in float, tables and their gradients float, with no float atomics: the same
// bits as the CPU's every run.
//
// The token table's gradient scales with the ids, not with the vocabulary: the (id, position) pairs
// are sorted by id with a stable radix sort (positions stay in increasing order within an id), then
// one block a run of equal ids, a thread a column, adds the run's rows of dy in that order: the CPU's
// sum, term for term. Its scratch (the sorted pairs, the sort's digit counts) is the context's
// workspace, grown once to the largest request and kept, so a warm step allocates nothing. The sort is
// our own (8-bit digits, least significant first): CUB would bring libcu++'s global namespace `cuda`
// into every program that includes the library, where `cuda::` already names replica::cuda.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>

#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/launch.hpp"
#include "replica/core/config.hpp"
#include "replica/core/error.hpp"
#include "replica/core/number.hpp"

namespace REPLICA_NAMESPACE::backend::cuda {

namespace kernels {
template <class T>
__global__ void embedding_forward(const std::int32_t* ids, const float* table, T* y, std::size_t count, std::size_t dim)
{
    REPLICA_GRID_LOOP(k, count * dim)
    {
        const std::size_t i = k / dim, d = k % dim;
        y[k] = core::from_float<T>(table[std::size_t(ids[i]) * dim + d]);
    }
}

// The radix sort (detail::sort_ids): the keys in tiles of kSortTile, a pass a digit of 8 bits.
inline constexpr unsigned kSortTile = 256;

// counts[d * tiles + t]: how many of tile t's keys have digit d. Blocks of kSortTile threads, a tile each.
template <int = 0>
__global__ void radix_counts(const std::uint32_t* keys, std::size_t count, unsigned shift, std::uint32_t* counts,
                             unsigned tiles)
{
    __shared__ std::uint32_t c[256];
    c[threadIdx.x] = 0;
    __syncthreads();
    const std::size_t i = std::size_t(blockIdx.x) * kSortTile + threadIdx.x;
    if (i < count) atomicAdd(&c[(keys[i] >> shift) & 255u], 1u);   // integer counts: any order gives the same
    __syncthreads();
    counts[std::size_t(threadIdx.x) * tiles + blockIdx.x] = c[threadIdx.x];
}

// v[0..n) replaced by its exclusive prefix sums. One block of 1024 threads: each sums a contiguous part,
// the parts' sums are scanned in shared memory, then each part is rewritten.
template <int = 0>
__global__ void exclusive_scan_one_block(std::uint32_t* v, std::size_t n)
{
    __shared__ std::uint32_t part[1024];
    const std::size_t per = (n + 1023) / 1024;
    const std::size_t begin = min(n, std::size_t(threadIdx.x) * per), end = min(n, begin + per);
    std::uint32_t sum = 0;
    for (std::size_t i = begin; i < end; ++i) sum += v[i];
    part[threadIdx.x] = sum;
    __syncthreads();
    for (unsigned offset = 1; offset < 1024; offset *= 2) {
        const std::uint32_t add = threadIdx.x >= offset ? part[threadIdx.x - offset] : 0u;
        __syncthreads();
        part[threadIdx.x] += add;
        __syncthreads();
    }
    std::uint32_t run = threadIdx.x > 0 ? part[threadIdx.x - 1] : 0u;
    for (std::size_t i = begin; i < end; ++i) {
        const std::uint32_t x = v[i];
        v[i] = run;
        run += x;
    }
}

// One stable pass: tile t's keys with digit d go, in their order, to offsets[d * tiles + t] on (the
// exclusive prefix sums of radix_counts). One warp a tile, 32 keys at a time: a key's place is its
// digit's next free place plus the lanes before it with the same digit. values null: each key's value
// is its index.
template <int = 0>
__global__ void radix_scatter(const std::uint32_t* keys, const std::int32_t* values, std::size_t count, unsigned shift,
                              const std::uint32_t* offsets, unsigned tiles, std::uint32_t* keys_out,
                              std::int32_t* values_out)
{
    __shared__ std::uint32_t next[256];
    const unsigned lane = threadIdx.x;
    for (unsigned d = lane; d < 256; d += 32) next[d] = offsets[std::size_t(d) * tiles + blockIdx.x];
    __syncwarp();
    const std::size_t begin = std::size_t(blockIdx.x) * kSortTile, end = min(count, begin + kSortTile);
    for (std::size_t first = begin; first < end; first += 32) {
        const std::size_t i = first + lane;
        const unsigned active = __ballot_sync(0xffffffffu, i < end);
        if (i < end) {
            const std::uint32_t key = keys[i];
            const unsigned d = (key >> shift) & 255u;
            const unsigned peers = __match_any_sync(active, d);
            const unsigned before = __popc(peers & ((1u << lane) - 1u));
            const std::uint32_t at = next[d] + before;
            keys_out[at] = key;
            values_out[at] = values ? values[i] : std::int32_t(i);
            __syncwarp(active);   // every lane has read next[d] before the first of its group moves it
            if (before == 0) next[d] += unsigned(__popc(peers));
        }
        __syncwarp();
    }
}

// Block (j, c): where sorted entry j starts a run of equal ids (it is the first, or the entry before
// holds another id), columns [c blockDim.x, (c + 1) blockDim.x) of that id's row: the run's rows of dy
// (at positions order[j..end), increasing) added one after the other, from 0 or, with accumulate, from
// the row as it was. Every other block returns at once.
template <class T>
__global__ void embedding_backward_runs(const std::uint32_t* ids, const std::int32_t* order, const T* dy, float* dtable,
                                        std::size_t count, std::size_t dim, bool accumulate)
{
    const std::size_t j = blockIdx.x;
    const std::uint32_t id = ids[j];
    if (j > 0 && ids[j - 1] == id) return;
    const std::size_t d = std::size_t(blockIdx.y) * blockDim.x + threadIdx.x;
    if (d >= dim) return;
    std::size_t end = j + 1;
    while (end < count && ids[end] == id) ++end;
    float* row = dtable + std::size_t(id) * dim + d;
    float sum = accumulate ? *row : 0.0f;
    std::size_t i = j;
    constexpr std::size_t kAhead = 8;   // loads in flight before their adds, which stay in order
    for (; i + kAhead <= end; i += kAhead) {
        float v[kAhead];
#pragma unroll
        for (std::size_t u = 0; u < kAhead; ++u) v[u] = core::to_float(dy[std::size_t(order[i + u]) * dim + d]);
#pragma unroll
        for (std::size_t u = 0; u < kAhead; ++u) sum += v[u];
    }
    for (; i < end; ++i) sum += core::to_float(dy[std::size_t(order[i]) * dim + d]);
    *row = sum;
}

template <class T>
__global__ void position_embedding_forward(const T* x, const float* table, T* y, std::size_t n, std::size_t per)
{
    REPLICA_GRID_LOOP(k, n * per) y[k] = core::from_float<T>(core::to_float(x[k]) + table[k % per]);
}

// Element k of the (context, dim) table: the sum over samples of dy's element k (k < per), else 0.
template <class T>
__global__ void position_embedding_backward(const T* dy, float* dtable, std::size_t n, std::size_t per, std::size_t size)
{
    REPLICA_GRID_LOOP(k, size)
    {
        float sum = 0.0f;
        if (k < per)
            for (std::size_t s = 0; s < n; ++s) sum += core::to_float(dy[s * per + k]);
        dtable[k] = sum;
    }
}
} // namespace kernels

// y[i] = table[ids[i]] for `count` ids, rows of `dim`; ids in [0, vocabulary) (checked by the model).
template <core::Storage T>
void embedding_forward(const Context& ctx, const std::int32_t* ids, const float* table, T* y, std::size_t count,
                       std::size_t dim)
{
    if (count == 0) return;
    kernels::embedding_forward<<<detail::blocks_for(count * dim), detail::kThreads, 0, ctx.stream()>>>(ids, table, y,
                                                                                                     count, dim);
    detail::check_launch("embedding_forward");
}

namespace detail {
// The ids sorted (stably: equal ids in increasing position) and their positions in that order, in the
// context's workspace: valid until its next use.
struct SortedIds {
    const std::uint32_t* ids;
    const std::int32_t* order;
};

inline std::size_t aligned_256(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

// Sorts the count ids (each below `vocabulary`) with their positions: a least-significant-digit radix
// sort, a pass a digit of 8 bits of the ids' significant bits, each pass stable. On the context's stream.
inline SortedIds sort_ids(const Context& ctx, const std::int32_t* ids, std::size_t count, std::size_t vocabulary)
{
    core::require(count < (std::size_t{1} << 31), "embedding_backward: at most 2^31 - 1 ids a call");
    const unsigned bits = std::max(1u, unsigned(std::bit_width(vocabulary - 1)));
    const unsigned passes = (bits + 7) / 8;
    const unsigned tiles = unsigned((count + kernels::kSortTile - 1) / kernels::kSortTile);
    const std::size_t words = aligned_256(count * 4), table = std::size_t(256) * tiles;
    auto* base = static_cast<unsigned char*>(ctx.workspace(4 * words + table * 4));
    std::uint32_t* keys[2] = {reinterpret_cast<std::uint32_t*>(base), reinterpret_cast<std::uint32_t*>(base + words)};
    std::int32_t* values[2] = {reinterpret_cast<std::int32_t*>(base + 2 * words),
                               reinterpret_cast<std::int32_t*>(base + 3 * words)};
    auto* counts = reinterpret_cast<std::uint32_t*>(base + 4 * words);
    const auto* in_keys = reinterpret_cast<const std::uint32_t*>(ids);   // non-negative: the same order
    const std::int32_t* in_values = nullptr;                              // the positions
    for (unsigned p = 0; p < passes; ++p) {
        const unsigned shift = 8 * p, out = p % 2;
        kernels::radix_counts<<<tiles, kernels::kSortTile, 0, ctx.stream()>>>(in_keys, count, shift, counts, tiles);
        kernels::exclusive_scan_one_block<<<1, 1024, 0, ctx.stream()>>>(counts, table);
        kernels::radix_scatter<<<tiles, 32, 0, ctx.stream()>>>(in_keys, in_values, count, shift, counts, tiles,
                                                                keys[out], values[out]);
        check_launch("radix_scatter");
        in_keys = keys[out];
        in_values = values[out];
    }
    return {in_keys, in_values};
}
} // namespace detail

// dtable (vocabulary rows of dim) ASSIGNED: row r the sum of dy[i] over the i with ids[i] == r, in
// increasing i, from zero (a row no id names: zero) or, with accumulate, from the row as it was.
template <core::Storage T>
void embedding_backward(const Context& ctx, const std::int32_t* ids, const T* dy, float* dtable, std::size_t count,
                        std::size_t vocabulary, std::size_t dim, bool accumulate = false)
{
    if (!accumulate)
        REPLICA_CHECK(cudaMemsetAsync(dtable, 0, vocabulary * dim * sizeof(float), ctx.stream()));
    if (count == 0 || dim == 0) return;
    const detail::SortedIds sorted = detail::sort_ids(ctx, ids, count, vocabulary);
    const unsigned threads = unsigned(std::min<std::size_t>(std::size_t(detail::kThreads), (dim + 31) / 32 * 32));
    const dim3 grid(unsigned(count), unsigned((dim + threads - 1) / threads));
    kernels::embedding_backward_runs<<<grid, threads, 0, ctx.stream()>>>(sorted.ids, sorted.order, dy, dtable, count,
                                                                         dim, accumulate);
    detail::check_launch("embedding_backward_runs");
}

// y = x + the table's first `positions` rows, for each of n samples of (positions, dim).
template <core::Storage T>
void position_embedding_forward(const Context& ctx, const T* x, const float* table, T* y, std::size_t n,
                                std::size_t positions, std::size_t dim)
{
    if (n == 0) return;
    const std::size_t per = positions * dim;
    kernels::position_embedding_forward<<<detail::blocks_for(n * per), detail::kThreads, 0, ctx.stream()>>>(x, table, y,
                                                                                                           n, per);
    detail::check_launch("position_embedding_forward");
}

// dx = dy (unless null); dtable (context rows of dim) ASSIGNED: row t the sum of dy's position t over the
// samples in order, rows from `positions` on zero.
template <core::Storage T>
void position_embedding_backward(const Context& ctx, const T* dy, T* dx, float* dtable, std::size_t n,
                                 std::size_t positions, std::size_t context, std::size_t dim)
{
    const std::size_t per = positions * dim, size = context * dim;
    kernels::position_embedding_backward<<<detail::blocks_for(size), detail::kThreads, 0, ctx.stream()>>>(dy, dtable, n,
                                                                                                         per, size);
    detail::check_launch("position_embedding_backward");
    if (dx && n > 0)
        REPLICA_CHECK(cudaMemcpyAsync(dx, dy, n * per * sizeof(T), cudaMemcpyDeviceToDevice, ctx.stream()));
}

} // namespace replica::backend::cuda
