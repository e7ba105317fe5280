#pragma once
// Per-channel passes over channels-last activations (layout.hpp), a (rows, c) matrix whose channels are
// the contiguous axis. column_sums: the matrix summed down its columns, the first stage of BatchNorm's
// statistics and of a convolution's bias gradient. column_map: an elementwise pass whose rule depends on
// the channel (BatchNorm's normalisation and its gradient); a thread keeps one group of channels, so it
// reads their coefficients once, not once a value.
//
// column_sums: Rows fall into parts of a fixed size (column_parts); within a
// part, row r goes to lane (r - first) % kLanes, each lane adds its rows in order in float (the loads
// of kRowsInFlight rows issued before their adds, which keeps that order), and the lanes' totals are
// then added in order in the partial sums' type Acc (double for BatchNorm): the order depends on the
// shape only, never on how values are read (a move of V = 8 channels, or one), so the sums have the
// same bits every run. A lane adds a part's rows / kLanes values in float: about 32 (parts hold about
// 1024 rows, more only in columns longer than kColumnParts * 1024 rows), so a lane's rounding is that
// of a few dozen float additions, and beyond the lane everything is added in Acc. A block
// takes Gb groups of V channels and kLanes lanes; partial[(channel * parts + part) * S + k] receives
// sum k of a part.
// Only under nvcc.

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/launch.hpp"
#include "replica/backend/cuda/packed.hpp"
#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::backend::cuda {

namespace detail {
inline constexpr unsigned kLanes = 32, kGroupsPerBlock = 8;
// Rows a lane of column_sums loads before it adds the first of them.
inline constexpr int kRowsInFlight = 4;
// The most parts a column is summed in (the partial sums' room per channel).
inline constexpr std::size_t kColumnParts = 1024;
// Parts of about 1024 rows; smaller ones (down to 64 rows) where c channels' parts of 1024 would make
// fewer than kFillBlocks blocks (a small layer's activations, which would leave most of the device
// idle); at most kColumnParts. The count depends on the shape only.
inline std::size_t column_parts(std::size_t rows, std::size_t c)
{
    constexpr std::size_t kFillBlocks = 512;
    const std::size_t across = std::max<std::size_t>((c / 8 + kGroupsPerBlock - 1) / kGroupsPerBlock, 1);
    const std::size_t fill = std::min((kFillBlocks + across - 1) / across, (rows + 63) / 64);
    return std::clamp<std::size_t>(std::max((rows + 1023) / 1024, fill), 1, kColumnParts);
}
// Warps that add one channel's parts in fold_parts: about four parts a lane, up to a block's eight
// warps (a power of two, so that it divides them). It depends on the parts only.
REPLICA_HOST_DEVICE unsigned fold_warps(std::size_t parts)
{
    unsigned w = 1;
    while (w < kThreads / 32 && parts > 128 * std::size_t(w)) w *= 2;
    return w;
}
} // namespace detail

namespace kernels {
// Op::load<V>(offset) reads one row's inputs of a group of V channels (offset: of the row's first
// value in the group), raw, not yet used, so that several rows' loads are in flight; Op::group<V>(first
// channel) gives, once a thread (so each channel's constants are read once), a callable add(offset,
// what load read, sums[S][V]) that adds them to the lane's float sums (and writes what the Op writes).
// column_map's Ops take the same two. Grid (groups / Gb rounded up, parts); block Gb * kLanes threads;
// dynamic shared memory kLanes * Gb * S * V floats.
template <int S, int V, class Acc, class Op>
__global__ void column_partial_sums(Op op, std::size_t rows, unsigned c, std::size_t per_part, unsigned gb, Acc* partial)
{
    constexpr std::size_t L = detail::kLanes, U = detail::kRowsInFlight;
    extern __shared__ unsigned char raw[];
    float* lanes = reinterpret_cast<float*>(raw);
    const unsigned local = threadIdx.x % gb, lane = threadIdx.x / gb, groups = c / V;
    const unsigned group = blockIdx.x * gb + local;
    const std::size_t first = std::size_t(blockIdx.y) * per_part, last = min(rows, first + per_part);
    float s[S][V];
#pragma unroll
    for (int k = 0; k < S; ++k)
#pragma unroll
        for (int j = 0; j < V; ++j) s[k][j] = 0.0f;
    if (group < groups) {
        const auto add = op.template group<V>(group * V);
        const std::size_t column = std::size_t(group) * V;
        std::size_t r = first + lane;
        for (; r + (U - 1) * L < last; r += U * L) {
            decltype(op.template load<V>(column)) in[U];
#pragma unroll
            for (std::size_t u = 0; u < U; ++u) in[u] = op.template load<V>((r + u * L) * c + column);
#pragma unroll
            for (std::size_t u = 0; u < U; ++u) add((r + u * L) * c + column, in[u], s);
        }
        for (; r < last; r += L) add(r * c + column, op.template load<V>(r * c + column), s);
    }
    float* mine = lanes + (std::size_t(lane) * gb + local) * (S * V);
#pragma unroll
    for (int k = 0; k < S; ++k)
#pragma unroll
        for (int j = 0; j < V; ++j) mine[k * V + j] = s[k][j];
    __syncthreads();
    for (unsigned t = threadIdx.x; t < gb * S * V; t += blockDim.x) {
        const unsigned l = t / (S * V), kj = t % (S * V), g = blockIdx.x * gb + l;
        if (g >= groups) continue;
        Acc total = Acc(0);
        for (unsigned ln = 0; ln < L; ++ln) total += Acc(lanes[(std::size_t(ln) * gb + l) * (S * V) + kj]);
        const unsigned ch = g * V + kj % V, k = kj / V;
        partial[(std::size_t(ch) * gridDim.y + blockIdx.y) * S + k] = total;
    }
}
// Stage two: a channel's parts partial[(ch * parts + p) * S + k] are added by W = fold_warps(parts)
// warps of one block; lane l of the channel's warp v takes the parts p = 32 v + l, 32 v + l + 32 W, ...
// in order, the lanes are added in a fixed tree (shuffles), then the warps in order, so the order
// depends on the shape only. done(ch, sums) receives the S totals (in one thread). Block: kThreads
// threads, kThreads / 32 / fold_warps(parts) channels (fold_blocks).
template <int S, class Acc, class Done>
__device__ inline void fold_parts(const Acc* partial, std::size_t parts, std::size_t c, Done&& done)
{
    constexpr unsigned kWarps = detail::kThreads / 32;
    __shared__ Acc warps[kWarps][S];
    const unsigned w = detail::fold_warps(parts), warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const std::size_t ch = (std::size_t(blockIdx.x) * kWarps + warp) / w;
    const unsigned mine = warp % w;   // the channel's warps are neighbours in one block (w divides kWarps)
    Acc s[S];
#pragma unroll
    for (int k = 0; k < S; ++k) s[k] = Acc(0);
    if (ch < c)
        for (std::size_t p = 32 * mine + lane; p < parts; p += 32 * w)
#pragma unroll
            for (int k = 0; k < S; ++k) s[k] += partial[(ch * parts + p) * S + k];
#pragma unroll
    for (int k = 0; k < S; ++k)
        for (int d = 16; d > 0; d /= 2) s[k] += __shfl_down_sync(0xffffffffu, s[k], d);
    if (lane == 0)
#pragma unroll
        for (int k = 0; k < S; ++k) warps[warp][k] = s[k];
    __syncthreads();
    if (ch >= c || mine != 0 || lane != 0) return;
#pragma unroll
    for (int k = 0; k < S; ++k) {
        s[k] = warps[warp][k];
        for (unsigned v = 1; v < w; ++v) s[k] += warps[warp + v][k];
    }
    done(ch, s);
}

// Op::load<V>(offset) reads the V values of one row's inputs at offset (of the row's first value in
// a group of V channels), raw; Op::group<V>(first channel) gives, once a thread, a callable f(offset,
// what load read) that maps them and writes the row's outputs. Block (groups across, rows down); the
// rows are visited in a grid-stride loop down the column, each row's inputs read before the row
// above is mapped, and the first row's before the channels' coefficients: their loads are in
// flight while the thread works.
template <int V, class I, class Op>
__global__ void column_map(Op op, I rows, I c)
{
    const I group = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x), column = group * V;
    const I step = I(blockDim.y) * I(gridDim.y);
    I r = I(blockIdx.y) * I(blockDim.y) + I(threadIdx.y);
    if (group >= c / V || r >= rows) return;
    auto in = op.template load<V>(r * c + column);
    const auto f = op.template group<V>(column);
    for (I next = r + step; next < rows; r = next, next += step) {
        const auto ahead = op.template load<V>(next * c + column);
        f(r * c + column, in);
        in = ahead;
    }
    f(r * c + column, in);
}
} // namespace kernels

namespace detail {
// f(std::integral_constant<int, V>{}) with the channels a thread takes: V = 8 (one 16-byte move) where
// c % 8 == 0 and every pointer in `aligned` is 16-byte aligned, else 1.
template <class F, class... P>
void by_column_width(std::size_t c, F&& f, const P*... aligned)
{
    if (c % 8 == 0 && ((reinterpret_cast<std::uintptr_t>(aligned) % 16 == 0) && ...)) f(std::integral_constant<int, 8>{});
    else f(std::integral_constant<int, 1>{});
}

// Blocks of fold_parts for c channels of `parts` parts.
inline unsigned fold_blocks(std::size_t c, std::size_t parts)
{
    const std::size_t per_block = kThreads / 32 / fold_warps(parts);
    return unsigned((c + per_block - 1) / per_block);
}

// Queues column_partial_sums over rows x c values with `parts` parts, V channels a move
// (by_column_width); make_op(V) gives the Op for a width V.
template <int S, class Acc, class MakeOp, class... P>
void column_sums(const Context& ctx, std::size_t rows, std::size_t c, std::size_t parts, Acc* partial, MakeOp&& make_op,
                 const P*... aligned)
{
    if (rows == 0 || c == 0) return;
    const auto launch = [&](auto v) {
        constexpr int V = decltype(v)::value;
        const unsigned groups = unsigned(c / V), gb = std::min(groups, kGroupsPerBlock);
        const std::size_t per_part = (rows + parts - 1) / parts;
        const dim3 grid((groups + gb - 1) / gb, unsigned(parts));
        const std::size_t shared = std::size_t(kLanes) * gb * S * V * sizeof(float);
        kernels::column_partial_sums<S, V, Acc><<<grid, gb * kLanes, shared, ctx.stream()>>>(make_op(v), rows, unsigned(c),
                                                                                            per_part, gb, partial);
        check_launch("column_partial_sums");
    };
    by_column_width(c, launch, aligned...);
}

// Queues column_map over rows x c values, V channels a thread (by_column_width); make_op(V) gives the
// Op for a width V. A block holds up to kThreads threads: the groups of a row across (up to kThreads of
// them), as many rows down as fit. A thread reads its channels' coefficients before its first row, so
// it should walk several rows: the grid gives each thread about kMapRowsPerThread rows, but has at
// least a wave of blocks (every multiprocessor full) where the rows allow, so that small activations
// still fill the device. The grid depends on the device; the values never do.
template <class MakeOp, class... P>
void column_map(const Context& ctx, std::size_t rows, std::size_t c, MakeOp&& make_op, const char* what,
                const P*... aligned)
{
    constexpr std::size_t kMapRowsPerThread = 12, kThreadsPerMultiprocessor = 2048;
    if (rows == 0 || c == 0) return;
    const auto launch = [&](auto v) {
        constexpr int V = decltype(v)::value;
        const std::size_t groups = c / V, across = std::min<std::size_t>(groups, kThreads), down = kThreads / across;
        const std::size_t columns = (groups + across - 1) / across, most = (rows + down - 1) / down;
        const std::size_t wave = ctx.multiprocessors() * (kThreadsPerMultiprocessor / kThreads);
        const std::size_t row_blocks = std::clamp<std::size_t>(
            std::max((rows + down * kMapRowsPerThread - 1) / (down * kMapRowsPerThread), (wave + columns - 1) / columns), 1,
            std::min<std::size_t>(most, 65535));
        const dim3 grid{unsigned(columns), unsigned(row_blocks)};
        indexed(rows * c, [&](auto index) {
            using I = decltype(index);
            kernels::column_map<V, I><<<grid, dim3(unsigned(across), unsigned(down)), 0, ctx.stream()>>>(make_op(v), I(rows),
                                                                                                         I(c));
        });
        check_launch(what);
    };
    by_column_width(c, launch, aligned...);
}
} // namespace detail

} // namespace replica::backend::cuda
