#pragma once
// The products candidate (conv/candidate.hpp; ConvPath::gemm): a convolution as a fully connected
// layer over its windows. im2row writes, per output pixel, the values its window reads; cuBLASLt
// multiplies them by the filters (linear.hpp, TF32 where Options::allow_tf32) with the bias and
// ReLU in the product's epilogue. The rows that forward leaves in the context's workspace are reused
// by backward when nothing used the workspace in between.
// - (channels, pixels) activations: the rows follow the filter's order (channel, row, column); a
//   transpose puts the pixel-major output in the layer's layout. Backward runs the same products'
//   gradients and gathers the rows' gradient back to the input (row2im).
// - channels-last activations (layout.hpp): the rows follow (row, column, channel), padded with
//   zeros to a multiple of 8 values so that every row is 16-byte aligned as cuBLASLt's tensor-core
//   kernels want, and the filters are copied into that order (filter_rows); the product's
//   pixel-major output is the layer's layout as it is. Backward takes the bias gradient and the
//   ReLU's rule from our channel sums (as cuDNN's path does) and the filter gradient from the
//   product; the input gradient, where one is asked for, is cuDNN's (conv/cudnn.hpp), whose
//   channels-last kernels serve it without rows.
// For T = bf16 or fp16 the rows, the products' inputs and the outputs are T (products in FP32); the
// filter gradient and the rows' gradient come out of their products in float. Only under nvcc.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <string>

#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/conv/bias.hpp"
#include "replica/backend/cuda/conv/candidate.hpp"
#include "replica/backend/cuda/conv/cudnn.hpp"
#include "replica/backend/cuda/conv/storage.hpp"
#include "replica/backend/cuda/elementwise.hpp"
#include "replica/backend/cuda/launch.hpp"
#include "replica/backend/cuda/layout.hpp"
#include "replica/backend/cuda/linear.hpp"
#include "replica/backend/cuda/timing.hpp"
#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::backend::cuda {

namespace kernels {
// im2row: row (s, p) of `rows` holds what output pixel p of
// sample s reads, in the filter's order (channel, row, column), zeros where it reads padding; count =
// n * oh * ow * c * kh * kw. A thread writes four consecutive values (one vector store where `rows`
// allows it: detail::vector_aligned): it splits its first index into (sample, pixel, channel, row,
// column) once and steps the others from it (splitting every index by divisions made the kernel
// instruction-bound).
template <class I, class T, int... G>
__global__ void im2row(const T* x, T* rows, I count, bool aligned)
{
    constexpr core::Window g{G...};
    constexpr int K = g.c * g.kh * g.kw, P = g.oh * g.ow;
    REPLICA_GRID_LOOP_AS(I, t, (count + 3) / 4)
    {
        const I first = t * 4, r = first / I(K);
        I s = r / I(P);
        const int k = int(first - r * I(K)), p = int(r - s * I(P));
        int oy = p / g.ow, ox = p % g.ow, c = k / (g.kh * g.kw), a = k / g.kw % g.kh, b = k % g.kw;
        float v[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int iy = oy * g.sh - g.ph + a, ix = ox * g.sw - g.pw + b;
            v[j] = iy >= 0 && iy < g.h && ix >= 0 && ix < g.w
                       ? kernels::load_ldg(x + (s * I(g.c) + I(c)) * I(g.h * g.w) + iy * g.w + ix)
                       : 0.0f;
            if (++b == g.kw) {
                b = 0;
                if (++a == g.kh) {
                    a = 0;
                    if (++c == g.c) {
                        c = 0;
                        if (++ox == g.ow) {
                            ox = 0;
                            if (++oy == g.oh) {
                                oy = 0;
                                ++s;
                            }
                        }
                    }
                }
            }
        }
        if (aligned && first + 4 <= count) detail::store4(rows + first, make_float4(v[0], v[1], v[2], v[3]), true);
        else
#pragma unroll
            for (int j = 0; j < 4; ++j)
                if (first + I(j) < count) rows[first + I(j)] = kernels::narrow<T>(v[j]);
    }
}

// im2row for channels-last activations, x (n, h, w, c): row (s, p) of `rows` holds what output pixel
// p of sample s reads, in the order (filter row, column, channel), zeros where it reads padding and
// after the window's K = c kh kw values up to the row's length KP (a multiple of 8); count = n oh ow
// rows. A block of R threads makes R consecutive rows: each thread builds one row in shared memory,
// its window's bounds tested once per filter row and column and every value's place a constant of
// the unrolled loops, its values moved as their 16-bit patterns (a value's index split at run time
// costs dozens of instructions, and this kernel is bound by its instructions); then the block stores
// its rows, which are contiguous in `rows`, as 16-byte moves of neighbouring threads (a thread's own
// row stored from registers would scatter every warp's stores over 32 rows).
template <class I, class T, int KP, int R, int... G>
__global__ void __launch_bounds__(R) im2row_last(const T* x, T* rows, I count)
{
    constexpr core::Window g{G...};
    constexpr int K = g.c * g.kh * g.kw, P = g.oh * g.ow;
    // A row's stride in shared memory, in 16-bit values: an odd number of 4-byte words, so that the
    // threads' rows start in different banks.
    constexpr int S = KP + 2;
    static_assert(KP % 8 == 0 && KP >= K && sizeof(T) == 2, "channels-last rows: 16-bit values, KP a multiple of 8");
    __shared__ std::uint16_t tile[R * S];
    for (I first = I(blockIdx.x) * I(R); first < count; first += I(gridDim.x) * I(R)) {
        if (const I r = first + I(threadIdx.x); r < count) {
            const I s = r / I(P);
            const int p = int(r - s * I(P)), y0 = p / g.ow * g.sh - g.ph, x0 = p % g.ow * g.sw - g.pw;
            bool in_y[g.kh], in_x[g.kw];
#pragma unroll
            for (int a = 0; a < g.kh; ++a) in_y[a] = unsigned(y0 + a) < unsigned(g.h);
#pragma unroll
            for (int b = 0; b < g.kw; ++b) in_x[b] = unsigned(x0 + b) < unsigned(g.w);
            // The window's first value: outside x where the window starts in the padding, read only
            // at the offsets the tests above let through.
            const std::uint16_t* corner =
                reinterpret_cast<const std::uint16_t*>(x) + s * I(g.h * g.w * g.c) + (y0 * g.w + x0) * g.c;
            std::uint16_t* row = tile + threadIdx.x * S;
#pragma unroll
            for (int k = 0; k < KP; ++k) {
                const int c = k % g.c, b = k / g.c % g.kw, a = k / g.c / g.kw;
                row[k] = k < K && in_y[a] && in_x[b] ? __ldg(corner + (a * g.w + b) * g.c + c) : std::uint16_t(0);
            }
        }
        __syncthreads();
        const unsigned here = unsigned(count - first < I(R) ? count - first : I(R)), moves = KP / 8;
        uint4* to = reinterpret_cast<uint4*>(rows + first * I(KP));
        for (unsigned m = threadIdx.x; m < here * moves; m += R) {
            const unsigned rr = m / moves;
            const unsigned* from = reinterpret_cast<const unsigned*>(tile + rr * S + (m - rr * moves) * 8);   // S, 8 even
            to[m] = make_uint4(from[0], from[1], from[2], from[3]);
        }
        __syncthreads();   // the tile is made again for the next rows
    }
}

// The filters w (cout, c, kh, kw) as rows of KP values in im2row_last's order (kh, kw, c), zeros
// after the first K (exact: values are moved); count = cout * KP.
template <class T, int KP, int... G>
__global__ void filter_rows(const T* w, T* rows, unsigned count)
{
    constexpr core::Window g{G...};
    constexpr int K = g.c * g.kh * g.kw;
    REPLICA_GRID_LOOP_AS(unsigned, i, count)
    {
        const unsigned o = i / KP;
        const int k = int(i - o * KP);
        rows[i] = k < K ? w[(o * g.c + unsigned(k % g.c)) * (g.kh * g.kw) + unsigned(k / g.c)] : narrow<T>(0.0f);
    }
}

// dw (cout, c, kh, kw) from the filter rows' gradient (cout rows of KP floats, filter_rows' order);
// count = cout * K.
template <int KP, int... G>
__global__ void filter_gradient_from_rows(const float* drows, float* dw, unsigned count)
{
    constexpr core::Window g{G...};
    constexpr int K = g.c * g.kh * g.kw, window = g.kh * g.kw;
    REPLICA_GRID_LOOP_AS(unsigned, i, count)
    {
        const unsigned o = i / K;
        const int k = int(i - o * K), c = k / window, at = k % window;
        dw[i] = drows[o * KP + unsigned(at * g.c + c)];
    }
}

// dx (n, c, h, w) from the rows' gradient (float), stored by filter position (c kh kw rows of
// `pixels` = n oh ow values, so that neighbouring threads read neighbouring values): each input
// element sums the entries that read it, in the filter's rows then columns (a gather: the same bits
// every run), onto dx's value where `accumulate`, rounded to T once; count = n * c * h * w.
template <class I, class T, int... G>
__global__ void row2im(const float* drows, T* dx, I count, I pixels, bool accumulate)
{
    constexpr core::Window g{G...};
    constexpr int P = g.oh * g.ow;
    REPLICA_GRID_LOOP_AS(I, i, count)
    {
        const I plane = i / I(g.h * g.w), s = plane / I(g.c);
        const int at = int(i - plane * I(g.h * g.w)), c = int(plane - s * I(g.c));
        const float* d = drows + I(c * g.kh * g.kw) * pixels + s * I(P);
        float sum = 0.0f;
#pragma unroll 4
        for (int a = 0; a < g.kh; ++a) {
            const int ty = at / g.w + g.ph - a, oy = ty / g.sh;
            if (ty < 0 || ty != oy * g.sh || oy >= g.oh) continue;
#pragma unroll 4
            for (int b = 0; b < g.kw; ++b) {
                const int tx = at % g.w + g.pw - b, ox = tx / g.sw;
                if (tx >= 0 && tx == ox * g.sw && ox < g.ow) sum += __ldg(d + I(a * g.kw + b) * pixels + oy * g.ow + ox);
            }
        }
        dx[i] = kernels::narrow<T>(accumulate ? widen(dx[i]) + sum : sum);
    }
}

// dst (batch, cols, rows) = src (batch, rows, cols) transposed, by tiles of 32 x 32 in shared memory;
// with a mask (src's layout), the ReLU's backward too: 0 where the mask is not above 0. Exact for
// every T (a value or 0 is moved).
template <class T>
__global__ void transpose(const T* src, const T* mask, T* dst, unsigned rows, unsigned cols, unsigned batch)
{
    __shared__ float tile[32][33];
    const unsigned r0 = blockIdx.y * 32, c0 = blockIdx.x * 32;
    for (unsigned b = blockIdx.z; b < batch; b += gridDim.z) {
        const std::size_t off = std::size_t(b) * rows * cols;
        for (unsigned j = threadIdx.y; j < 32; j += blockDim.y) {
            const unsigned r = r0 + j, c = c0 + threadIdx.x;
            if (r < rows && c < cols) {
                const std::size_t at = off + std::size_t(r) * cols + c;
                tile[j][threadIdx.x] = mask ? relu_grad(kernels::widen(mask[at]), kernels::widen(src[at])) : kernels::widen(src[at]);
            }
        }
        __syncthreads();
        for (unsigned j = threadIdx.y; j < 32; j += blockDim.y) {
            const unsigned c = c0 + j, r = r0 + threadIdx.x;
            if (r < rows && c < cols) dst[off + std::size_t(c) * rows + r] = kernels::narrow<T>(tile[threadIdx.x][j]);
        }
        __syncthreads();
    }
}
} // namespace kernels

namespace detail {
// The length of a channels-last row: the window's c kh kw values, padded to a multiple of 8.
constexpr int rows_last_length(const core::Window& g) { return (g.c * g.kh * g.kw + 7) / 8 * 8; }

// The channels-last products' workspace for window g, cout filters and n samples, each region
// 256-byte aligned: the filters as rows (cout x KP, T), their gradient (cout x KP, float), then the
// rows (n oh ow x KP, T).
template <core::Storage T>
struct RowsLast {
    T* filters;
    float* filter_gradient;
    T* rows;
    RowsLast(void* work, const core::Window& g, int cout)
    {
        auto* at = static_cast<char*>(work);
        filters = reinterpret_cast<T*>(at);
        filter_gradient = reinterpret_cast<float*>(at + filters_bytes(g, cout));
        rows = reinterpret_cast<T*>(at + filters_bytes(g, cout) + gradient_bytes(g, cout));
    }
    static std::size_t bytes(const core::Window& g, int cout, std::size_t n)
    {
        return filters_bytes(g, cout) + gradient_bytes(g, cout) +
               n * std::size_t(g.oh) * g.ow * std::size_t(rows_last_length(g)) * sizeof(T);
    }

private:
    static std::size_t aligned(std::size_t bytes) { return (bytes + 255) / 256 * 256; }
    static std::size_t filters_bytes(const core::Window& g, int cout)
    {
        return aligned(std::size_t(cout) * std::size_t(rows_last_length(g)) * sizeof(T));
    }
    static std::size_t gradient_bytes(const core::Window& g, int cout)
    {
        return aligned(std::size_t(cout) * std::size_t(rows_last_length(g)) * sizeof(float));
    }
};

// The product path's workspace for n samples. Channels-first: the rows (n oh ow x c kh kw; room for
// them in float, which their gradient is), then the output or its gradient pixel-major (n oh ow x
// cout, T). Channels-last (`last`): RowsLast's.
template <core::Storage T = float>
std::size_t gemm_workspace(const core::Window& g, int cout, std::size_t n, bool last = false)
{
    if (last) return RowsLast<T>::bytes(g, cout, n);
    const std::size_t pixels = n * std::size_t(g.oh) * g.ow;
    return sizeof(float) * pixels * (std::size_t(g.c) * g.kh * g.kw) + sizeof(T) * pixels * std::size_t(cout);
}

// Whether the workspace still holds the rows of input x (of type T) for window g over n samples
// (PlanCache::workspace_rows).
template <core::Storage T>
bool rows_kept(const Context& ctx, const core::Window& g, const T* x, std::size_t n)
{
    const auto& r = ctx.plan_cache().workspace_rows;
    const core::Window& h = r.g;
    return r.x == x && r.storage == storage_of<T> && r.n == n && h.c == g.c && h.h == g.h && h.w == g.w && h.kh == g.kh &&
           h.kw == g.kw && h.sh == g.sh && h.sw == g.sw && h.ph == g.ph && h.pw == g.pw && h.oh == g.oh && h.ow == g.ow;
}

template <core::Storage T>
void transpose(const Context& ctx, const T* src, const T* mask, T* dst, std::size_t batch, std::size_t rows, std::size_t cols)
{
    if (batch == 0 || rows == 0 || cols == 0) return;
    const dim3 grid(unsigned((cols + 31) / 32), unsigned((rows + 31) / 32), unsigned(std::min<std::size_t>(batch, 65535)));
    kernels::transpose<T><<<grid, dim3(32, 8), 0, ctx.stream()>>>(src, mask, dst, unsigned(rows), unsigned(cols), unsigned(batch));
    check_launch("transpose");
}

template <core::Window g, core::Storage T>
void im2row(const Context& ctx, const T* x, T* rows, std::size_t n)
{
    const std::size_t count = n * std::size_t(g.oh) * g.ow * g.c * g.kh * g.kw;
    indexed(count + 4, [&](auto index) {   // + 4: the last thread's first index + 4 does not wrap
        using I = decltype(index);
        kernels::im2row<I, T, REPLICA_WINDOW_INTS(g)>
            <<<blocks_for((count + 3) / 4), kThreads, 0, ctx.stream()>>>(x, rows, I(count), vector_aligned<T>(rows));
    });
    check_launch("im2row");
}

// The convolution as a fully connected layer (linear.hpp) over its windows: in = c kh kw, out = cout,
// a "sample" per output pixel, its output pixel-major (n, oh ow, cout) and transposed to the layer's
// (n, cout, oh ow); the bias (if b is not null) and ReLU in the product's epilogue. `work`:
// gemm_workspace<T>'s bytes.
template <core::Window g, core::Storage T>
void conv_forward_gemm(const Context& ctx, int cout, const T* w, const float* b, const T* x, T* y, std::size_t n, bool relu,
                       float* work)
{
    constexpr int K = g.c * g.kh * g.kw;
    const std::size_t pixels = n * std::size_t(g.oh) * g.ow;
    T* rows = reinterpret_cast<T*>(work);
    T* out = reinterpret_cast<T*>(work + pixels * K);
    im2row<g>(ctx, x, rows, n);
    linear_forward<T>(ctx, K, cout, w, b, rows, out, pixels, relu, ctx.options().allow_tf32);
    transpose<T>(ctx, out, nullptr, y, n, std::size_t(g.oh) * g.ow, std::size_t(cout));
}

// Backward of the same: dy (n, cout, oh ow) transposed to pixel-major into dz (with the ReLU's rule
// where relu_y, its output, is given), then the layer's products (db null: no bias gradient). The
// rows are made again unless `kept` (forward left them in `work` and nothing used it since:
// rows_kept); the rows' gradient (float) takes their place after, and is gathered into dx (added to
// it where `accumulate`).
template <core::Window g, core::Storage T>
void conv_backward_gemm(const Context& ctx, int cout, const T* w, const T* x, const T* relu_y, const T* dy, T* dz, T* dx,
                        float* dw, float* db, std::size_t n, float* work, bool kept, bool accumulate = false)
{
    constexpr int K = g.c * g.kh * g.kw;
    const std::size_t pixels = n * std::size_t(g.oh) * g.ow;
    transpose<T>(ctx, dy, relu_y, dz, n, std::size_t(cout), std::size_t(g.oh) * g.ow);
    T* rows = reinterpret_cast<T*>(work);
    if (!kept) im2row<g>(ctx, x, rows, n);
    const bool tf32 = ctx.options().allow_tf32;
    linear_backward<T>(ctx, K, cout, w, rows, dz, nullptr, dw, db, pixels, tf32);
    if (!dx) return;
    // The rows' gradient by filter position (GemmKey::input_grad_t), over the rows (read above).
    float* drows = work;
    run(ctx, linear_gemm(ctx, GemmKey::input_grad_t, K, cout, pixels, dz, w, drows, tf32, storage_of<T>), dz, w, drows);
    const std::size_t inputs = n * std::size_t(g.c) * g.h * g.w;
    indexed(std::max(inputs, pixels * K), [&](auto index) {
        using I = decltype(index);
        kernels::row2im<I, T, REPLICA_WINDOW_INTS(g)>
            <<<blocks_for(inputs), kThreads, 0, ctx.stream()>>>(drows, dx, I(inputs), I(pixels), accumulate);
    });
    check_launch("row2im");
}

template <core::Window g, core::Storage T>
void im2row_last(const Context& ctx, const T* x, T* rows, std::size_t n)
{
    // Rows a block makes: 128, fewer where their tile would outgrow 48 KiB of shared memory (long
    // rows: a forced ConvPath on a wide layer); none fits past 24,574 values.
    constexpr int KP = rows_last_length(g), fit = 48 * 1024 / (2 * (KP + 2));
    constexpr int R = fit >= 128 ? 128 : fit >= 32 ? fit / 32 * 32 : fit;
    if constexpr (R < 1) {
        throw Error("channels-last products: a row of " + std::to_string(KP) +
                    " values does not fit a block's shared memory (at most 24574): leave this layer's path to the timing "
                    "(ConvPath::timed), which then keeps it on cuDNN");
    } else {
        const std::size_t count = n * std::size_t(g.oh) * g.ow;   // rows
        const unsigned blocks = unsigned(std::clamp<std::size_t>((count + R - 1) / R, 1, 65535u * 8u));
        indexed(count * KP, [&](auto index) {
            using I = decltype(index);
            kernels::im2row_last<I, T, KP, R, REPLICA_WINDOW_INTS(g)><<<blocks, R, 0, ctx.stream()>>>(x, rows, I(count));
        });
        check_launch("im2row_last");
    }
}

// The channels-last forward: the filters into rows, the input's rows, their product with the bias
// and the ReLU in its epilogue straight into y (n oh ow, cout). `work`: gemm_workspace's bytes.
template <core::Window g, core::Storage T>
void conv_forward_rows_last(const Context& ctx, int cout, const T* w, const float* b, const T* x, T* y, std::size_t n,
                            bool relu, void* work)
{
    constexpr int KP = rows_last_length(g);
    const RowsLast<T> ws(work, g, cout);
    const unsigned filters = unsigned(cout) * KP;
    kernels::filter_rows<T, KP, REPLICA_WINDOW_INTS(g)><<<blocks_for(filters), kThreads, 0, ctx.stream()>>>(w, ws.filters, filters);
    check_launch("filter_rows");
    im2row_last<g>(ctx, x, ws.rows, n);
    linear_forward<T>(ctx, KP, cout, ws.filters, b, ws.rows, y, n * std::size_t(g.oh) * g.ow, relu);
}

// The channels-last backward's products (ProductConv::backward adds cuDNN's input gradient): the
// bias gradient and the ReLU's rule (into dz) by our channel sums, the rows made again unless `kept`
// (rows_kept), then the filter gradient.
template <core::Window g, core::Storage T>
void conv_backward_rows_last(const Context& ctx, const ConvBackward<T>& a, void* work, bool kept)
{
    constexpr int K = g.c * g.kh * g.kw, KP = rows_last_length(g);
    const std::size_t pixels = std::size_t(g.oh) * g.ow;
    bias_backward(ctx, a.dy, a.db, std::size_t(a.cout), a.n, pixels, a.scratch, a.relu_y, a.dz);
    const T* dz = a.relu_y ? a.dz : a.dy;
    const RowsLast<T> ws(work, g, a.cout);
    if (!kept) im2row_last<g>(ctx, a.x, ws.rows, a.n);
    linear_backward<T>(ctx, KP, a.cout, ws.filters, ws.rows, dz, nullptr, ws.filter_gradient, nullptr, a.n * pixels);
    const unsigned weights = unsigned(a.cout) * K;
    kernels::filter_gradient_from_rows<KP, REPLICA_WINDOW_INTS(g)>
        <<<blocks_for(weights), kThreads, 0, ctx.stream()>>>(ws.filter_gradient, a.dw, weights);
    check_launch("filter_gradient_from_rows");
}

// Seconds per call of the product path's forward and of its backward over n samples, as a step runs
// them (CallTimer::never where its workspace is over the limit of cuDNN's candidates): channels-first,
// both gradients with the rows made again; channels-last, without the bias, the ReLU and the input
// gradient, which cuDNN's path runs as well (the autotuner adds cuDNN's input gradient).
template <core::Window g, core::Storage T>
PassSeconds gemm_seconds(const Context& ctx, int cout, std::size_t n)
{
    constexpr std::size_t K = std::size_t(g.c) * g.kh * g.kw, f = sizeof(float);
    constexpr bool sixteen = sizeof(T) == 2;   // float is never channels-last (layout.hpp)
    const bool last = channels_last<T>(ctx);
    const std::size_t work = gemm_workspace<T>(g, cout, n, last);
    if (work > workspace_limit(std::size_t{1} << 30)) return {CallTimer::never, CallTimer::never};
    const std::size_t in = n * g.c * g.h * g.w, out = n * std::size_t(cout) * g.oh * g.ow, weights = K * std::size_t(cout);
    const TimingScratch s(ctx, {in * f, out * f, weights * f, cout * f, in * f, weights * f, cout * f, work, out * f});
    auto t = [&](std::size_t i) { return static_cast<T*>(s.bytes(i)); };   // float-sized: room for any T
    auto forward = [&] {
        if constexpr (sixteen)
            if (last) {
                conv_forward_rows_last<g, T>(ctx, cout, t(2), nullptr, t(0), t(1), n, false, s.bytes(7));
                return true;
            }
        conv_forward_gemm<g, T>(ctx, cout, t(2), s.floats(3), t(0), t(1), n, false, s.floats(7));
        return true;
    };
    auto backward = [&] {
        if constexpr (sixteen)
            if (last) {
                conv_backward_rows_last<g, T>(
                    ctx, {cout, t(2), t(0), nullptr, t(1), nullptr, nullptr, s.floats(5), nullptr, n, nullptr}, s.bytes(7), false);
                return true;
            }
        conv_backward_gemm<g, T>(ctx, cout, t(2), t(0), nullptr, t(1), t(8), t(4), s.floats(5), s.floats(6), n, s.floats(7),
                                 false);
        return true;
    };
    forward();   // plans (and times) its products first: none is planned while a pass is captured
    backward();
    CallTimer timer(ctx);
    const double forward_seconds = timer.seconds(forward, CallTimer::never);
    return {forward_seconds, timer.seconds(backward, CallTimer::never)};
}

} // namespace detail

template <core::Window g>
struct ProductConv {
    // Needs no plan of its own: its cuBLASLt products are planned (and timed) as they first run.
    template <core::Storage T>
    static void forward(const Context& ctx, const ConvPlan*, const ConvForward<T>& a)
    {
        void* work = ctx.workspace(0);
        if constexpr (sizeof(T) == 2)   // float is never channels-last (layout.hpp): no such kernels for it
            if (channels_last<T>(ctx)) {
                detail::conv_forward_rows_last<g>(ctx, a.cout, a.w, a.b, a.x, a.y, a.n, a.relu, work);
                ctx.plan_cache().workspace_rows = {a.x, g, a.n, storage_of<T>};
                return;
            }
        detail::conv_forward_gemm<g>(ctx, a.cout, a.w, a.b, a.x, a.y, a.n, a.relu, static_cast<float*>(work));
        // For backward, unless something else uses the workspace first.
        ctx.plan_cache().workspace_rows = {a.x, g, a.n, storage_of<T>};
    }

    // Channels-first: without relu_y, the output's gradient goes pixel-major to the workspace after
    // the rows; with it, to dz. Channels-last: the products' filter gradient, then cuDNN's input
    // gradient by the plan's algorithm where dx is asked for.
    template <core::Storage T>
    static void backward(const Context& ctx, const ConvPlan* plan, const ConvBackward<T>& a)
    {
        const bool kept = detail::rows_kept(ctx, g, a.x, a.n);   // before workspace() forgets them
        void* work = ctx.workspace(0);
        if constexpr (sizeof(T) == 2)
            if (channels_last<T>(ctx)) {
                detail::conv_backward_rows_last<g>(ctx, a, work, kept);
                if (a.dx) CudnnConv<g>::input_gradient(ctx, *plan, a);
                return;
            }
        auto* floats = static_cast<float*>(work);
        T* dz = a.relu_y ? a.dz : reinterpret_cast<T*>(floats + a.n * std::size_t(g.oh) * g.ow * g.c * g.kh * g.kw);
        detail::conv_backward_gemm<g>(ctx, a.cout, a.w, a.x, a.relu_y, a.dy, dz, a.dx, a.dw, a.db, a.n, floats, kept,
                                      a.accumulate);
    }

    // Seconds per call of each pass as a step runs them (detail::gemm_seconds).
    template <core::Storage T = float>
    static PassSeconds time(const Context& ctx, int cout, std::size_t n)
    {
        return detail::gemm_seconds<g, T>(ctx, cout, n);
    }

    // The workspace its passes need (`last`: on channels-last activations).
    template <core::Storage T = float>
    static std::size_t workspace(int cout, std::size_t n, bool last = false)
    {
        return detail::gemm_workspace<T>(g, cout, n, last);
    }
};

} // namespace replica::backend::cuda
