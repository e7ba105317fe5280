#pragma once
// Convolutions on the GPU through cuDNN. A plan (descriptors and algorithms) is made once per
// geometry and batch size and cached in the context; algorithms are cuDNN's candidates timed as a
// step runs them (Options::benchmark, timing.hpp), or cuDNN's own choice, deterministic on request
// (Options::deterministic). A transposed convolution runs the adjoint passes of the convolution
// from its output to its input. Bias gradients are our own two-pass channel sums: cuDNN's
// cudnnConvolutionBackwardBias took 2.1 of AlexNet's 10.2 ms per step on an H200 (FCN: 1.8 of 5.1).
// A null bias b (and then a null bias gradient db) is a convolution without bias: nothing is added or
// summed for it; a fused ReLU, and its rule in backward, run where they would with a bias (on cuDNN's
// path, the pass that adds the bias or sums its gradient becomes a ReLU pass of its own).

#include <cudnn.h>

#include <algorithm>
#include <cstddef>
#include <map>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/elementwise.hpp"
#include "replica/backend/cuda/launch.hpp"
#include "replica/backend/cuda/linear.hpp"
#include "replica/backend/cuda/timing.hpp"

namespace replica::backend::cuda {

namespace kernels {
// One unit of W consecutive floats (W = 1 or 4) of the bias-gradient pass: their sum, in an order
// fixed by W (never by alignment: `aligned` picks a float4 load or four scalar ones); with Relu, the
// ReLU's rule is applied first and the result written to dz.
template <bool Relu, unsigned W>
__device__ inline float unit_sum(const float* dy, const float* y, float* dz, bool aligned)
{
    if constexpr (W == 1) {
        float v = *dy;
        if constexpr (Relu) {
            v = relu_grad(*y, v);
            *dz = v;
        }
        return v;
    } else {
        float4 d = aligned ? *reinterpret_cast<const float4*>(dy) : make_float4(dy[0], dy[1], dy[2], dy[3]);
        if constexpr (Relu) {
            const float4 a = aligned ? *reinterpret_cast<const float4*>(y) : make_float4(y[0], y[1], y[2], y[3]);
            d = make_float4(relu_grad(a.x, d.x), relu_grad(a.y, d.y), relu_grad(a.z, d.z), relu_grad(a.w, d.w));
            if (aligned) *reinterpret_cast<float4*>(dz) = d;
            else {
                dz[0] = d.x;
                dz[1] = d.y;
                dz[2] = d.z;
                dz[3] = d.w;
            }
        }
        return (d.x + d.y) + (d.z + d.w);
    }
}

// Pass 1 of db[c] = sum over i < n, j < s of dy[i][c][j]: block (part, c) sums the units (of W floats;
// s and per_part count units) [part * per_part, (part + 1) * per_part) of channel c's n * s in a
// fixed order (threads stride along the contiguous rows, then a tree in shared memory), so the result
// is the same every run. Relu: dy is the gradient of relu(z), y = relu(z); the pass also writes
// dz = y > 0 ? dy : 0 and sums dz (a convolution's backward with the ReLU after it: one pass over
// memory instead of two).
template <bool Relu, unsigned W>
__global__ void channel_partial_sums(const float* dy, const float* y, float* dz, float* partial, unsigned channels,
                                     unsigned n, unsigned s, unsigned per_part, bool aligned)
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
            sum += unit_sum<Relu, W>(dy + at, y + at, dz + at, aligned);
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

// Pass 2: db[c] = the sum of channel c's parts, in order.
__global__ void channel_totals(const float* partial, float* db, unsigned channels, unsigned parts)
{
    REPLICA_GRID_LOOP(c, channels)
    {
        float sum = 0.0f;
        for (unsigned p = 0; p < parts; ++p) sum += partial[c * parts + p];
        db[c] = sum;
    }
}

// The filter gradient of a convolution with few weights per filter (direct_conv<g>), pass 1:
// block (f * g.c + ci, part) takes filter f, input channel ci and samples [part * per_part, ...): each
// thread keeps the kh x kw sums of its output pixels in registers (the window unrolled), the warps add
// them by shuffles and the block in shared memory, in a fixed order; pass 2 (filter_grad_totals) adds
// the parts in order. So the result depends on the shape only. cuDNN's choice for LeNet's first layer
// (wgrad_alg0_engine) took 42 us of a 0.24 ms step on an H200.
// (The window comes as integers: nvcc's kernel stubs take no class-type template arguments.)
template <int C, int H, int W, int KH, int KW, int SH, int SW, int PH, int PW, int OH, int OW>
__global__ void filter_grad_parts(const float* x, const float* dz, float* partial, unsigned cout, unsigned n,
                                  unsigned per_part)
{
    constexpr core::Window g{C, H, W, KH, KW, SH, SW, PH, PW, OH, OW};
    constexpr int K = g.kh * g.kw;
    constexpr unsigned pixels = unsigned(g.oh) * unsigned(g.ow);
    constexpr unsigned warps = detail::kThreads / 32;
    __shared__ float by_warp[warps][K];
    const unsigned fc = blockIdx.x, f = fc / unsigned(g.c), ci = fc % unsigned(g.c);
    const unsigned first = blockIdx.y * per_part, last = min(n, first + per_part);
    float acc[K];
#pragma unroll
    for (int k = 0; k < K; ++k) acc[k] = 0.0f;
    for (unsigned s = first; s < last; ++s) {
        const float* xs = x + (std::size_t(s) * g.c + ci) * std::size_t(g.h) * g.w;
        const float* ds = dz + (std::size_t(s) * cout + f) * pixels;
        for (unsigned p = threadIdx.x; p < pixels; p += detail::kThreads) {
            const int oh = int(p / unsigned(g.ow)), ow = int(p % unsigned(g.ow));
            const float d = ds[p];
#pragma unroll
            for (int i = 0; i < g.kh; ++i) {
                const int ih = oh * g.sh - g.ph + i;
#pragma unroll
                for (int j = 0; j < g.kw; ++j) {
                    const int iw = ow * g.sw - g.pw + j;
                    const bool inside = ih >= 0 && ih < g.h && iw >= 0 && iw < g.w;
                    acc[i * g.kw + j] = fmaf(d, inside ? xs[ih * g.w + iw] : 0.0f, acc[i * g.kw + j]);
                }
            }
        }
    }
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
    for (int k = 0; k < K; ++k) {
        float v = acc[k];
        for (unsigned offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
        if (lane == 0) by_warp[warp][k] = v;
    }
    __syncthreads();
    for (unsigned k = threadIdx.x; k < unsigned(K); k += detail::kThreads) {
        float v = 0.0f;
        for (unsigned w = 0; w < warps; ++w) v += by_warp[w][k];
        partial[(std::size_t(fc) * gridDim.y + blockIdx.y) * K + k] = v;
    }
}

// The forward pass of the same convolutions (direct_conv<g>): a thread per output pixel of a
// sample reads its window once into registers and writes every filter's output, bias added (none
// where b is null) and the ReLU applied when it follows (the filters and biases in shared memory).
// cuDNN's forward and our bias pass took 8.5 + 2.6 us for LeNet's first layer on an H200.
template <int C, int H, int W, int KH, int KW, int SH, int SW, int PH, int PW, int OH, int OW, bool Relu>
__global__ void conv_forward_direct(const float* w, const float* b, const float* x, float* y, unsigned cout, unsigned n)
{
    constexpr core::Window g{C, H, W, KH, KW, SH, SW, PH, PW, OH, OW};
    constexpr int K = g.c * g.kh * g.kw;
    constexpr unsigned pixels = unsigned(g.oh) * unsigned(g.ow);
    extern __shared__ float filters[];   // cout * K weights, then cout biases
    for (unsigned i = threadIdx.x; i < cout * K; i += blockDim.x) filters[i] = w[i];
    for (unsigned i = threadIdx.x; i < cout; i += blockDim.x) filters[cout * K + i] = b ? b[i] : 0.0f;
    __syncthreads();
    const std::size_t t = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= std::size_t(n) * pixels) return;
    const std::size_t s = t / pixels;
    const unsigned p = unsigned(t % pixels);
    const int oh = int(p / unsigned(g.ow)), ow = int(p % unsigned(g.ow));
    float window[K];
#pragma unroll
    for (int c = 0; c < g.c; ++c)
#pragma unroll
        for (int i = 0; i < g.kh; ++i)
#pragma unroll
            for (int j = 0; j < g.kw; ++j) {
                const int ih = oh * g.sh - g.ph + i, iw = ow * g.sw - g.pw + j;
                const bool inside = ih >= 0 && ih < g.h && iw >= 0 && iw < g.w;
                window[(c * g.kh + i) * g.kw + j] = inside ? x[((s * g.c + c) * g.h + ih) * g.w + iw] : 0.0f;
            }
    for (unsigned f = 0; f < cout; ++f) {
        float v = filters[cout * K + f];
#pragma unroll
        for (int k = 0; k < K; ++k) v = fmaf(filters[f * K + k], window[k], v);
        if constexpr (Relu) v = fmaxf(v, 0.0f);
        y[(s * cout + f) * pixels + p] = v;
    }
}

// Pass 2: dw[fc * K + k] = the sum over parts, in order.
__global__ void filter_grad_totals(const float* partial, float* dw, unsigned weights_per_fc, unsigned fcs, unsigned parts)
{
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= fcs * weights_per_fc) return;
    const unsigned fc = i / weights_per_fc, k = i % weights_per_fc;
    float v = 0.0f;
    for (unsigned part = 0; part < parts; ++part) v += partial[(std::size_t(fc) * parts + part) * weights_per_fc + k];
    dw[i] = v;
}

// The product path (ConvPath::gemm). im2row: row (s, p) of `rows` holds what output pixel p of
// sample s reads, in the filter's order (channel, row, column), zeros where it reads padding; count =
// n * oh * ow * c * kh * kw. A thread writes four consecutive values (a float4 where `rows` is
// 16-byte aligned): it splits its first index into (sample, pixel, channel, row, column) once and
// steps the others from it. (A thread per value, each index split by divisions: 505 us for AlexNet's
// first layer at batch 128, 562 MB, on an H200, about 120 instructions a value; at LeNet's size,
// 8.2 MB, 6.2 us, where a thread per filter row took 8.2.)
template <class I, int... G>
__global__ void im2row(const float* x, float* rows, I count, bool aligned)
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
            v[j] = iy >= 0 && iy < g.h && ix >= 0 && ix < g.w ? __ldg(x + (s * I(g.c) + I(c)) * I(g.h * g.w) + iy * g.w + ix)
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
        if (aligned && first + 4 <= count) *reinterpret_cast<float4*>(rows + first) = make_float4(v[0], v[1], v[2], v[3]);
        else
#pragma unroll
            for (int j = 0; j < 4; ++j)
                if (first + I(j) < count) rows[first + I(j)] = v[j];
    }
}

// dx (n, c, h, w) from the rows' gradient, stored by filter position (c kh kw rows of `pixels` = n oh
// ow values, so that neighbouring threads read neighbouring values): each input element sums the
// entries that read it, in the filter's rows then columns (a gather: the same bits every run);
// count = n * c * h * w.
template <class I, int... G>
__global__ void row2im(const float* drows, float* dx, I count, I pixels)
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
        dx[i] = sum;
    }
}

// dst (batch, cols, rows) = src (batch, rows, cols) transposed, by tiles of 32 x 32 in shared memory;
// with a mask (src's layout), the ReLU's backward too: 0 where the mask is not above 0.
__global__ void transpose(const float* src, const float* mask, float* dst, unsigned rows, unsigned cols, unsigned batch)
{
    __shared__ float tile[32][33];
    const unsigned r0 = blockIdx.y * 32, c0 = blockIdx.x * 32;
    for (unsigned b = blockIdx.z; b < batch; b += gridDim.z) {
        const std::size_t off = std::size_t(b) * rows * cols;
        for (unsigned j = threadIdx.y; j < 32; j += blockDim.y) {
            const unsigned r = r0 + j, c = c0 + threadIdx.x;
            if (r < rows && c < cols) {
                const std::size_t at = off + std::size_t(r) * cols + c;
                tile[j][threadIdx.x] = mask ? relu_grad(mask[at], src[at]) : src[at];
            }
        }
        __syncthreads();
        for (unsigned j = threadIdx.y; j < 32; j += blockDim.y) {
            const unsigned c = c0 + j, r = r0 + threadIdx.x;
            if (r < rows && c < cols) dst[off + std::size_t(c) * rows + r] = tile[threadIdx.x][j];
        }
        __syncthreads();
    }
}
} // namespace kernels

namespace detail {
// The product path's workspace for n samples: the rows (n oh ow x c kh kw), then the output or its
// gradient pixel-major (n oh ow x cout).
inline std::size_t gemm_workspace(const core::Window& g, int cout, std::size_t n)
{
    return sizeof(float) * n * std::size_t(g.oh) * g.ow * (std::size_t(g.c) * g.kh * g.kw + std::size_t(cout));
}

// Whether the workspace still holds the rows of input x for window g over n samples (State::workspace_rows).
inline bool rows_kept(const Context& ctx, const core::Window& g, const float* x, std::size_t n)
{
    const auto& r = ctx.state().workspace_rows;
    const core::Window& h = r.g;
    return r.x == x && r.n == n && h.c == g.c && h.h == g.h && h.w == g.w && h.kh == g.kh && h.kw == g.kw && h.sh == g.sh &&
           h.sw == g.sw && h.ph == g.ph && h.pw == g.pw && h.oh == g.oh && h.ow == g.ow;
}

inline void transpose(const Context& ctx, const float* src, const float* mask, float* dst, std::size_t batch,
                      std::size_t rows, std::size_t cols)
{
    if (batch == 0 || rows == 0 || cols == 0) return;
    const dim3 grid(unsigned((cols + 31) / 32), unsigned((rows + 31) / 32), unsigned(std::min<std::size_t>(batch, 65535)));
    kernels::transpose<<<grid, dim3(32, 8), 0, ctx.stream()>>>(src, mask, dst, unsigned(rows), unsigned(cols), unsigned(batch));
    check_launch("transpose");
}

template <core::Window g>
void im2row(const Context& ctx, const float* x, float* rows, std::size_t n)
{
    const std::size_t count = n * std::size_t(g.oh) * g.ow * g.c * g.kh * g.kw;
    indexed(count + 4, [&](auto index) {   // + 4: the last thread's first index + 4 does not wrap
        using I = decltype(index);
        kernels::im2row<I, REPLICA_WINDOW_INTS(g)>
            <<<blocks_for((count + 3) / 4), kThreads, 0, ctx.stream()>>>(x, rows, I(count), quad_aligned(rows));
    });
    check_launch("im2row");
}

// The convolution as a fully connected layer (linear.hpp) over its windows: in = c kh kw, out = cout,
// a "sample" per output pixel, its output pixel-major (n, oh ow, cout) and transposed to the layer's
// (n, cout, oh ow); the bias (if b is not null) and ReLU in the product's epilogue. `work`:
// gemm_workspace's bytes.
template <core::Window g>
void conv_forward_gemm(const Context& ctx, int cout, const float* w, const float* b, const float* x, float* y,
                       std::size_t n, bool relu, float* work)
{
    constexpr int K = g.c * g.kh * g.kw;
    const std::size_t pixels = n * std::size_t(g.oh) * g.ow;
    float* rows = work;
    float* out = work + pixels * K;
    im2row<g>(ctx, x, rows, n);
    linear_forward(ctx, K, cout, w, b, rows, out, pixels, relu, ctx.options().allow_tf32);
    transpose(ctx, out, nullptr, y, n, std::size_t(g.oh) * g.ow, std::size_t(cout));
}

// Backward of the same: dy (n, cout, oh ow) transposed to pixel-major into dz (with the ReLU's rule
// where relu_y, its output, is given), then the layer's products (db null: no bias gradient). The
// rows are made again unless `kept` (forward left them in `work` and nothing used it since:
// rows_kept); they hold the rows' gradient after.
template <core::Window g>
void conv_backward_gemm(const Context& ctx, int cout, const float* w, const float* x, const float* relu_y,
                        const float* dy, float* dz, float* dx, float* dw, float* db, std::size_t n, float* work, bool kept)
{
    constexpr int K = g.c * g.kh * g.kw;
    const std::size_t pixels = n * std::size_t(g.oh) * g.ow;
    transpose(ctx, dy, relu_y, dz, n, std::size_t(cout), std::size_t(g.oh) * g.ow);
    float* rows = work;
    if (!kept) im2row<g>(ctx, x, rows, n);
    const bool tf32 = ctx.options().allow_tf32;
    linear_backward(ctx, K, cout, w, rows, dz, nullptr, dw, db, pixels, tf32);
    if (!dx) return;
    // The rows' gradient by filter position (GemmKey::input_grad_t), over the rows (read above).
    run(ctx, linear_gemm(ctx, GemmKey::input_grad_t, K, cout, pixels, dz, w, rows, tf32), dz, w, rows);
    const std::size_t inputs = n * std::size_t(g.c) * g.h * g.w;
    indexed(std::max(inputs, pixels * K), [&](auto index) {
        using I = decltype(index);
        kernels::row2im<I, REPLICA_WINDOW_INTS(g)><<<blocks_for(inputs), kThreads, 0, ctx.stream()>>>(rows, dx, I(inputs), I(pixels));
    });
    check_launch("row2im");
}
} // namespace detail

namespace detail {
// Parts per channel for the bias gradient: about 2048 blocks in all, none with fewer than 1024 values
// (with 512 and 4096, the pass that also applies the ReLU's backward waited on memory: 12.5 us a
// call on GoogLeNet-32 where the float4 ReLU backward alone took 5.8). It depends on the shape only
// (never on the GPU), so every device sums in the same order.
inline unsigned bias_parts(std::size_t channels, std::size_t per_channel)
{
    const std::size_t wanted = (2048 + channels - 1) / channels, most = (per_channel + 1023) / 1024;
    return unsigned(std::clamp<std::size_t>(std::min(wanted, most), 1, 65535));
}

// Convolutions whose filters have few weights per input channel and few input channels, over small
// images (LeNet's first layer: 1 x 5 x 5 over 24 x 24 output pixels) run forward and get their filter
// gradient by our kernels (conv_forward_direct, filter_grad_parts) rather than cuDNN's: a window stays
// in registers. One H200: LeNet 0.237 -> 0.211 ms a step with the filter gradient. Over large images
// (FCN's first layer, 3 x 3 x 3) a block per filter, channel and part of the batch was too little
// parallelism for the filter gradient: FCN 2.59 -> 3.32 ms, so those stay with cuDNN.
template <core::Window g>
inline constexpr bool direct_conv = g.kh * g.kw <= 25 && g.c * g.kh * g.kw <= 32 && g.oh * g.ow <= 1024;

// Parts of the batch for filter_grad_parts: about 256 blocks in all, from the shape alone.
inline unsigned filter_grad_part_count(unsigned fcs, std::size_t n)
{
    return unsigned(std::clamp<std::size_t>((256 + fcs - 1) / fcs, 1, std::max<std::size_t>(n, 1)));
}

// db (channels) = dy (n, channels, s) summed over n and s; `partial` holds channels * bias_parts(..).
// With relu_y (the output of the ReLU that dy is the gradient of), dz = relu_y > 0 ? dy : 0 is written
// and summed instead.
inline void channel_sums(const Context& ctx, const float* dy, float* db, std::size_t channels, std::size_t n,
                         std::size_t s, float* partial, const float* relu_y = nullptr, float* dz = nullptr)
{
    core::require(n * s < (std::size_t(1) << 31), "a bias gradient over 2^31 values or more per channel: use a smaller batch");
    // Units of four floats where rows hold whole quads (one H200: GoogLeNet-32 7.84 -> 7.72 ms a step):
// the order depends on the shape only.
    const unsigned w = s % 4 == 0 ? 4 : 1, units = unsigned(n * s / w);
    const unsigned parts = bias_parts(channels, n * s), per_part = (units + parts - 1) / parts;
    const bool aligned = w == 4 && quad_aligned(dy) && (!relu_y || quad_aligned(relu_y, dz));
    const dim3 grid(parts, unsigned(channels));
    const auto c = unsigned(channels), nn = unsigned(n), sw = unsigned(s / w);
    if (relu_y && w == 4)
        kernels::channel_partial_sums<true, 4><<<grid, kThreads, 0, ctx.stream()>>>(dy, relu_y, dz, partial, c, nn, sw, per_part, aligned);
    else if (relu_y)
        kernels::channel_partial_sums<true, 1><<<grid, kThreads, 0, ctx.stream()>>>(dy, relu_y, dz, partial, c, nn, sw, per_part, false);
    else if (w == 4)
        kernels::channel_partial_sums<false, 4><<<grid, kThreads, 0, ctx.stream()>>>(dy, nullptr, nullptr, partial, c, nn, sw, per_part, aligned);
    else
        kernels::channel_partial_sums<false, 1><<<grid, kThreads, 0, ctx.stream()>>>(dy, nullptr, nullptr, partial, c, nn, sw, per_part, false);
    check_launch("channel_partial_sums");
    kernels::channel_totals<<<blocks_for(channels), kThreads, 0, ctx.stream()>>>(partial, db, c, parts);
    check_launch("channel_totals");
}
} // namespace detail

namespace detail {
template <class Perf>
int pick(const Perf* perf, int found, bool deterministic)
{
    for (int i = 0; i < found; ++i)
        if (perf[i].status == CUDNN_STATUS_SUCCESS && (!deterministic || perf[i].determinism == CUDNN_DETERMINISTIC))
            return i;
    throw Error("cuDNN offers no usable convolution algorithm for this layer" +
                std::string(deterministic ? " among its deterministic ones: turn deterministic mode off" : ""));
}

// Options::benchmark: cuDNN's candidates timed as a step runs them (timing.hpp), with scratch
// tensors of the layer's sizes. cudnnFind* is not used: on an H200 its times were 1.3 to 6 times the
// replayed ones and ranked the candidates differently (GoogLeNet-32 took 9.3 instead of 7.7 ms a step
// with its choices).
class AlgorithmTimer {
public:
    // Scratch for tensors x, y, w of these sizes (floats) and for the candidates' workspaces (up to
    // 1 GiB; larger candidates are left out).
    template <class F, class D, class B>
    AlgorithmTimer(const Context& ctx, std::size_t x, std::size_t y, std::size_t w, const F* f, int nf, const D* d,
                   int nd, const B* b, int nb)
        : limit_(workspace_limit(std::size_t{1} << 30)),
          scratch_(ctx, {x * sizeof(float), y * sizeof(float), w * sizeof(float), most(f, nf, d, nd, b, nb)}),
          timer_(ctx)
    {
    }
    float* x() const { return scratch_.floats(0); }
    float* y() const { return scratch_.floats(1); }
    float* w() const { return scratch_.floats(2); }

    // The chosen one of perf[0, found): run(algo, workspace, bytes) queues one call of a candidate.
    // Adds its seconds per call to `seconds` (CallTimer::never if none could be timed).
    template <class Perf, class Run>
    auto choose(const Perf* perf, int found, Run&& run, double& seconds)
    {
        std::vector<int> usable;
        for (int i = 0; i < found; ++i)
            if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= limit_) usable.push_back(i);
        if (usable.empty()) {
            seconds = CallTimer::never;
            return perf[pick(perf, found, false)].algo;
        }
        std::vector<double> took(usable.size(), -1.0);
        auto time = [&](int i, double give_up) {
            const Perf& c = perf[usable[std::size_t(i)]];
            return took[std::size_t(i)] = timer_.seconds(
                       [&] { return run(c.algo, scratch_.bytes(3), c.memory) == CUDNN_STATUS_SUCCESS; }, give_up);
        };
        const int k = CallTimer::fastest(int(usable.size()), time);
        seconds += took[std::size_t(k)] >= 0.0 ? took[std::size_t(k)] : time(k, CallTimer::never);
        return perf[usable[std::size_t(k)]].algo;
    }

private:
    template <class F, class D, class B>
    std::size_t most(const F* f, int nf, const D* d, int nd, const B* b, int nb) const
    {
        std::size_t m = 0;
        auto fit = [&](const auto* perf, int found) {
            for (int i = 0; i < found; ++i)
                if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= limit_) m = std::max(m, perf[i].memory);
        };
        fit(f, nf);
        fit(d, nd);
        fit(b, nb);
        return m;
    }

    std::size_t limit_;
    TimingScratch scratch_;
    CallTimer timer_;
};

// Seconds per call of a convolution's forward pass and of its backward (both gradients).
struct PassSeconds {
    double forward = 0.0, backward = 0.0;
};

// Timed choices (Options::benchmark), process-wide: by kind of GPU, shape and the options that
// change what is timed.
struct MeasuredConvKey {
    std::string device;   // device_kind()
    ConvKey conv;
    bool tf32, graphs;
    friend bool operator<(const MeasuredConvKey& a, const MeasuredConvKey& b)
    {
        if (a.device != b.device) return a.device < b.device;
        if (a.conv < b.conv) return true;
        if (b.conv < a.conv) return false;
        return std::tie(a.tf32, a.graphs) < std::tie(b.tf32, b.graphs);
    }
};
struct ConvAlgorithms {
    cudnnConvolutionFwdAlgo_t fwd{};
    cudnnConvolutionBwdDataAlgo_t bwd_data{};
    cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
    PassSeconds seconds;   // per call: the forward algorithm; the two gradients' together
    // ConvPath::timed: the product path's passes, and whether they are faster; not timed yet while
    // `products_timed` is false.
    PassSeconds products;
    bool products_timed = false, gemm_forward = false, gemm_backward = false;
};

// One line of Options::log: a timed choice, the layer named input -> output (a transposed
// convolution's window maps its output to its input: conv_transpose_forward). The algorithms are
// those of the cuDNN convolution; a transposed layer runs its forward pass by backward data.
inline void log_choice(std::ostream& out, const std::string& device, const ConvKey& key, const ConvAlgorithms& a)
{
    const core::Window& g = key.g;
    auto us = [](double s) { return s >= CallTimer::never ? std::string("-") : std::to_string(int(s * 1e6 + 0.5)) + " us"; };
    const std::string conv_in = std::to_string(g.c) + "x" + std::to_string(g.h) + "x" + std::to_string(g.w),
                      conv_out = std::to_string(key.cout) + "x" + std::to_string(g.oh) + "x" + std::to_string(g.ow);
    const bool transposed = key.use == ConvKey::transposed;
    out << "replica: " << device << (transposed ? ": transposed convolution " : ": convolution ")
        << (transposed ? conv_out : conv_in) << " -> " << (transposed ? conv_in : conv_out) << " (" << g.kh << "x" << g.kw
        << ", stride " << g.sh << "x" << g.sw << ", pad " << g.ph << "x" << g.pw << "), batch " << key.n
        << ": cuDNN forward algorithm " << int(a.fwd) << " " << us(a.seconds.forward) << ", gradients (data " << int(a.bwd_data)
        << ", filter " << int(a.bwd_filter) << ") " << us(a.seconds.backward);
    if (a.products_timed)
        out << "; products forward " << us(a.products.forward) << ", gradients " << us(a.products.backward) << ": forward by "
            << (a.gemm_forward ? "products" : "cuDNN") << ", gradients by " << (a.gemm_backward ? "products" : "cuDNN");
    out << std::endl;
}
inline std::map<MeasuredConvKey, ConvAlgorithms>& measured_conv_choices()
{
    static std::map<MeasuredConvKey, ConvAlgorithms> choices;
    return choices;
}

// The plan for a convolution of window g with `cout` filters over n samples: x (n, g.c, g.h, g.w),
// w (cout, g.c, g.kh, g.kw), y (n, cout, g.oh, g.ow). For a plain convolution (use), gemm_seconds
// times its product path's passes (gemm_seconds<g> below), so that ConvPath::timed can choose them.
inline const ConvPlan& conv_plan(const Context& ctx, const core::Window& g, int cout, std::size_t n,
                                 ConvKey::Use use = ConvKey::convolution,
                                 PassSeconds (*gemm_seconds)(const Context&, int, std::size_t) = nullptr)
{
    auto& plans = ctx.state().conv_plans;
    const ConvKey key{g, cout, n, use};
    if (auto it = plans.find(key); it != plans.end()) return it->second;

    ConvPlan p;
    REPLICA_CHECK(cudnnCreateTensorDescriptor(&p.x));
    REPLICA_CHECK(cudnnCreateTensorDescriptor(&p.y));
    REPLICA_CHECK(cudnnCreateFilterDescriptor(&p.w));
    REPLICA_CHECK(cudnnCreateConvolutionDescriptor(&p.conv));
    REPLICA_CHECK(cudnnSetTensor4dDescriptor(p.x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, int(n), g.c, g.h, g.w));
    REPLICA_CHECK(cudnnSetTensor4dDescriptor(p.y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, int(n), cout, g.oh, g.ow));
    REPLICA_CHECK(cudnnSetFilter4dDescriptor(p.w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, cout, g.c, g.kh, g.kw));
    REPLICA_CHECK(cudnnSetConvolution2dDescriptor(p.conv, g.ph, g.pw, g.sh, g.sw, 1, 1, CUDNN_CROSS_CORRELATION,
                                                  CUDNN_DATA_FLOAT));
    REPLICA_CHECK(cudnnSetConvolutionMathType(p.conv, ctx.options().allow_tf32 ? CUDNN_DEFAULT_MATH : CUDNN_FMA_MATH));

    const bool det = ctx.options().deterministic;
    constexpr int kMax = 16;
    int found = 0;
    cudnnHandle_t h = ctx.cudnn();
    cudnnConvolutionFwdAlgoPerf_t f[kMax];
    REPLICA_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, p.x, p.w, p.conv, p.y, kMax, &found, f));
    const int found_fwd = found;
    cudnnConvolutionBwdDataAlgoPerf_t d[kMax];
    REPLICA_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, p.w, p.y, p.conv, p.x, kMax, &found, d));
    const int found_data = found;
    cudnnConvolutionBwdFilterAlgoPerf_t b[kMax];
    REPLICA_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, p.x, p.y, p.conv, p.w, kMax, &found, b));
    const int found_filter = found;
    // Deterministic mode: cuDNN's choice, the same in every context and every run.
    const bool timed = ctx.options().benchmark && !det;
    const MeasuredConvKey measured{device_kind(ctx), key, ctx.options().allow_tf32, ctx.options().graphs};
    bool fresh = false;   // this call timed something (Options::log)
    if (!timed) {
        p.fwd = f[pick(f, found_fwd, det)].algo;
        p.bwd_data = d[pick(d, found_data, det)].algo;
        p.bwd_filter = b[pick(b, found_filter, det)].algo;
    } else {
        // Timed once per kind of GPU and shape in the process: a model's replicas on identical GPUs
        // run the same algorithms (and hold the same workspace), and a second model reuses the times.
        std::lock_guard lock(measured_mutex());
        auto& choices = measured_conv_choices();
        auto it = choices.find(measured);
        if (it == choices.end()) {
            AlgorithmTimer timer(ctx, n * g.c * g.h * g.w, n * std::size_t(cout) * g.oh * g.ow,
                                 std::size_t(cout) * g.c * g.kh * g.kw, f, found_fwd, d, found_data, b, found_filter);
            float *x = timer.x(), *y = timer.y(), *w = timer.w();
            const float one = 1.0f, zero = 0.0f;
            ConvAlgorithms a;
            a.fwd = timer.choose(f, found_fwd, [&](cudnnConvolutionFwdAlgo_t algo, void* ws, std::size_t bytes) {
                return cudnnConvolutionForward(h, &one, p.x, x, p.w, w, p.conv, algo, ws, bytes, &zero, p.y, y);
            }, a.seconds.forward);
            a.bwd_data = timer.choose(d, found_data, [&](cudnnConvolutionBwdDataAlgo_t algo, void* ws, std::size_t bytes) {
                return cudnnConvolutionBackwardData(h, &one, p.w, w, p.y, y, p.conv, algo, ws, bytes, &zero, p.x, x);
            }, a.seconds.backward);
            a.bwd_filter = timer.choose(b, found_filter, [&](cudnnConvolutionBwdFilterAlgo_t algo, void* ws, std::size_t bytes) {
                return cudnnConvolutionBackwardFilter(h, &one, p.x, x, p.y, y, p.conv, algo, ws, bytes, &zero, p.w, w);
            }, a.seconds.backward);
            it = choices.emplace(measured, a).first;
            fresh = true;
        }
        p.fwd = it->second.fwd;
        p.bwd_data = it->second.bwd_data;
        p.bwd_filter = it->second.bwd_filter;
    }
    if (use == ConvKey::convolution && gemm_seconds) {
        const ConvPath path = ctx.options().conv_path;
        if (path == ConvPath::timed && timed) {   // timed once per kind of GPU and shape, as the algorithms
            auto take_choice = [&] {   // the process-wide choice into this plan; false while not timed yet
                std::lock_guard lock(measured_mutex());
                const ConvAlgorithms& a = measured_conv_choices().at(measured);
                p.gemm_forward = a.gemm_forward;
                p.gemm_backward = a.gemm_backward;
                return a.products_timed;
            };
            if (!take_choice()) {
                // Not under the lock: the path's products are planned (and timed) under it first. A
                // path that cannot run here (no cuBLASLt algorithm, no memory) is not chosen.
                PassSeconds t{CallTimer::never, CallTimer::never};
                try {
                    t = gemm_seconds(ctx, cout, n);
                } catch (const Error&) {
                    cudaGetLastError();
                }
                std::lock_guard lock(measured_mutex());
                ConvAlgorithms& a = measured_conv_choices().at(measured);
                if (!a.products_timed) {   // each pass separately; near ties stay with cuDNN, as in CallTimer
                    a.products = t;
                    a.gemm_forward = t.forward * 1.03 < a.seconds.forward;
                    a.gemm_backward = t.backward * 1.03 < a.seconds.backward;
                    a.products_timed = true;
                    fresh = true;
                }
            }
            take_choice();
        } else {
            p.gemm_forward = path == ConvPath::gemm || path == ConvPath::gemm_forward;
            p.gemm_backward = path == ConvPath::gemm || path == ConvPath::gemm_backward;
        }
    }
    std::size_t s1 = 0, s2 = 0, s3 = 0;
    REPLICA_CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, p.x, p.w, p.conv, p.y, p.fwd, &s1));
    REPLICA_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(h, p.w, p.y, p.conv, p.x, p.bwd_data, &s2));
    REPLICA_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, p.x, p.y, p.conv, p.w, p.bwd_filter, &s3));
    p.workspace = std::max({s1, s2, s3, p.gemm_forward || p.gemm_backward ? gemm_workspace(g, cout, n) : 0});
    if (fresh && ctx.options().log) {
        std::lock_guard lock(measured_mutex());
        log_choice(*ctx.options().log, measured.device, key, measured_conv_choices().at(measured));
    }
    ctx.workspace(p.workspace);   // grow now, not inside a step
    return plans.emplace(key, p).first->second;
}

// Seconds per call of the product path's forward and of its backward (both gradients, the rows made
// again) over n samples, as a step runs them (CallTimer::never where its workspace is over the limit
// of cuDNN's candidates).
template <core::Window g>
PassSeconds gemm_seconds(const Context& ctx, int cout, std::size_t n)
{
    constexpr std::size_t K = std::size_t(g.c) * g.kh * g.kw, f = sizeof(float);
    const std::size_t work = gemm_workspace(g, cout, n);
    if (work > workspace_limit(std::size_t{1} << 30)) return {CallTimer::never, CallTimer::never};
    const std::size_t in = n * g.c * g.h * g.w, out = n * std::size_t(cout) * g.oh * g.ow, weights = K * std::size_t(cout);
    const TimingScratch s(ctx, {in * f, out * f, weights * f, cout * f, in * f, weights * f, cout * f, work, out * f});
    auto forward = [&] {
        conv_forward_gemm<g>(ctx, cout, s.floats(2), s.floats(3), s.floats(0), s.floats(1), n, false, s.floats(7));
        return true;
    };
    auto backward = [&] {
        conv_backward_gemm<g>(ctx, cout, s.floats(2), s.floats(0), nullptr, s.floats(1), s.floats(8), s.floats(4),
                              s.floats(5), s.floats(6), n, s.floats(7), false);
        return true;
    };
    forward();   // plans (and times) its products first: none is planned while a pass is captured
    backward();
    CallTimer timer(ctx);
    const double forward_seconds = timer.seconds(forward, CallTimer::never);
    return {forward_seconds, timer.seconds(backward, CallTimer::never)};
}

// The plan of a convolution layer (conv_forward and conv_backward below).
template <core::Window g>
const ConvPlan& plan_of(const Context& ctx, int cout, std::size_t n)
{
    if constexpr (direct_conv<g>) return conv_plan(ctx, g, cout, n, ConvKey::direct);
    else return conv_plan(ctx, g, cout, n, ConvKey::convolution, &gemm_seconds<g>);
}
} // namespace detail

// Scratch: the bias gradient's partial sums (channel_sums), over the output's channels and pixels.
template <core::Window g>
std::size_t conv_scratch_size(const Context&, int cout, std::size_t n)
{
    const std::size_t bias = std::size_t(cout) * detail::bias_parts(cout, n * g.oh * g.ow);
    if constexpr (!detail::direct_conv<g>) return bias;
    else {   // the filter gradient's partial sums use the same scratch after the bias's
        const unsigned fcs = unsigned(cout) * unsigned(g.c);
        return std::max(bias, std::size_t(fcs) * detail::filter_grad_part_count(fcs, n) * g.kh * g.kw);
    }
}
template <core::Window g>
std::size_t conv_transpose_scratch_size(const Context&, int, std::size_t n)
{
    return std::size_t(g.c) * detail::bias_parts(g.c, n * g.h * g.w);
}

template <core::Window g>
void conv_forward(const Context& ctx, int cout, const float* w, const float* b, const float* x, float* y,
                  std::size_t n, float*, bool relu)
{
    if constexpr (detail::direct_conv<g>) {
        constexpr std::size_t K = std::size_t(g.c) * g.kh * g.kw, pixels = std::size_t(g.oh) * g.ow;
        const std::size_t shared = std::size_t(cout) * (K + 1) * sizeof(float);
        if (shared <= 48 * 1024) {   // the filters fit the default shared memory
            const auto blocks = unsigned((n * pixels + detail::kThreads - 1) / detail::kThreads);
            if (relu)
                kernels::conv_forward_direct<g.c, g.h, g.w, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.oh, g.ow, true>
                    <<<blocks, detail::kThreads, shared, ctx.stream()>>>(w, b, x, y, unsigned(cout), unsigned(n));
            else
                kernels::conv_forward_direct<g.c, g.h, g.w, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.oh, g.ow, false>
                    <<<blocks, detail::kThreads, shared, ctx.stream()>>>(w, b, x, y, unsigned(cout), unsigned(n));
            detail::check_launch("conv_forward_direct");
            return;
        }
    }
    const ConvPlan& p = detail::plan_of<g>(ctx, cout, n);
    if (p.gemm_forward) {
        detail::conv_forward_gemm<g>(ctx, cout, w, b, x, y, n, relu, static_cast<float*>(ctx.workspace(0)));
        ctx.state().workspace_rows = {x, g, n};   // for backward, unless something else uses the workspace first
        return;
    }
    const float one = 1.0f, zero = 0.0f;
    REPLICA_CHECK(cudnnConvolutionForward(ctx.cudnn(), &one, p.x, x, p.w, w, p.conv, p.fwd, ctx.workspace(0), p.workspace,
                                          &zero, p.y, y));
    if (b) add_channel_bias(ctx, b, y, n, std::size_t(cout), std::size_t(g.oh) * g.ow, relu);
    else if (relu) relu_forward(ctx, y, y, n * std::size_t(cout) * g.oh * g.ow);
}

namespace detail {
// The filter and input gradients from the output's gradient dz (scratch: conv_scratch_size's).
template <core::Window g>
void conv_backward_filter_data(const Context& ctx, const ConvPlan& p, int cout, std::size_t n, const float* w,
                               const float* x, const float* dz, float* dx, float* dw, float* scratch)
{
    const float one = 1.0f, zero = 0.0f;
    void* ws = ctx.workspace(0);
    if constexpr (direct_conv<g>) {
        const unsigned fcs = unsigned(cout) * unsigned(g.c), parts = filter_grad_part_count(fcs, n);
        const unsigned per_part = unsigned((n + parts - 1) / parts);
        kernels::filter_grad_parts<g.c, g.h, g.w, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.oh, g.ow>
            <<<dim3(fcs, parts), kThreads, 0, ctx.stream()>>>(x, dz, scratch, unsigned(cout), unsigned(n), per_part);
        check_launch("filter_grad_parts");
        constexpr unsigned K = unsigned(g.kh * g.kw);
        kernels::filter_grad_totals<<<blocks_for(fcs * K), kThreads, 0, ctx.stream()>>>(scratch, dw, K, fcs, parts);
        check_launch("filter_grad_totals");
    } else {
        REPLICA_CHECK(cudnnConvolutionBackwardFilter(ctx.cudnn(), &one, p.x, x, p.y, dz, p.conv, p.bwd_filter, ws,
                                                     p.workspace, &zero, p.w, dw));
    }
    if (dx)
        REPLICA_CHECK(cudnnConvolutionBackwardData(ctx.cudnn(), &one, p.w, w, p.y, dz, p.conv, p.bwd_data, ws, p.workspace,
                                                   &zero, p.x, dx));
}
} // namespace detail

template <core::Window g>
void conv_backward(const Context& ctx, int cout, const float* w, const float* x, const float* dy, float* dx,
                   float* dw, float* db, std::size_t n, float* scratch)
{
    const ConvPlan& p = detail::plan_of<g>(ctx, cout, n);
    if (p.gemm_backward) {   // the output's gradient, pixel-major, in the workspace after the rows
        const bool kept = detail::rows_kept(ctx, g, x, n);
        auto* work = static_cast<float*>(ctx.workspace(0));
        float* dz = work + n * std::size_t(g.oh) * g.ow * g.c * g.kh * g.kw;
        detail::conv_backward_gemm<g>(ctx, cout, w, x, nullptr, dy, dz, dx, dw, db, n, work, kept);
        return;
    }
    if (db) detail::channel_sums(ctx, dy, db, std::size_t(cout), n, std::size_t(g.oh) * g.ow, scratch);
    detail::conv_backward_filter_data<g>(ctx, p, cout, n, w, x, dy, dx, dw, scratch);
}

// The backward of a convolution followed by a ReLU whose output is relu_y and whose output gradient
// is dy: the ReLU's backward runs in the bias-gradient pass (without a bias, in a pass of its own),
// which writes the convolution output's gradient to dz (n x cout x oh x ow).
template <core::Window g>
void conv_backward_relu(const Context& ctx, int cout, const float* w, const float* x, const float* relu_y,
                        const float* dy, float* dz, float* dx, float* dw, float* db, std::size_t n, float* scratch)
{
    const ConvPlan& p = detail::plan_of<g>(ctx, cout, n);
    if (p.gemm_backward) {   // dz holds the output's gradient pixel-major
        const bool kept = detail::rows_kept(ctx, g, x, n);
        detail::conv_backward_gemm<g>(ctx, cout, w, x, relu_y, dy, dz, dx, dw, db, n, static_cast<float*>(ctx.workspace(0)),
                                      kept);
        return;
    }
    if (db) detail::channel_sums(ctx, dy, db, std::size_t(cout), n, std::size_t(g.oh) * g.ow, scratch, relu_y, dz);
    else relu_backward(ctx, relu_y, dy, dz, n * std::size_t(cout) * g.oh * g.ow);
    detail::conv_backward_filter_data<g>(ctx, p, cout, n, w, x, dz, dx, dw, scratch);
}

// Window g maps the transposed convolution's OUTPUT (g.c = cout channels, g.h x g.w) to its input
// (c channels, g.oh x g.ow); the weight (c, cout, kh, kw) is that convolution's filter.
template <core::Window g>
void conv_transpose_forward(const Context& ctx, int c, const float* w, const float* b, const float* x, float* y,
                            std::size_t n, float*)
{
    const ConvPlan& p = detail::conv_plan(ctx, g, c, n, ConvKey::transposed);
    const float one = 1.0f, zero = 0.0f;
    REPLICA_CHECK(cudnnConvolutionBackwardData(ctx.cudnn(), &one, p.w, w, p.y, x, p.conv, p.bwd_data, ctx.workspace(0),
                                               p.workspace, &zero, p.x, y));
    // Bias over the output's channels: the output is the plan's "x" tensor.
    if (b) add_channel_bias(ctx, b, y, n, std::size_t(g.c), std::size_t(g.h) * g.w, false);
}

template <core::Window g>
void conv_transpose_backward(const Context& ctx, int c, const float* w, const float* x, const float* dy, float* dx,
                             float* dw, float* db, std::size_t n, float* scratch)
{
    const ConvPlan& p = detail::conv_plan(ctx, g, c, n, ConvKey::transposed);
    const float one = 1.0f, zero = 0.0f;
    void* ws = ctx.workspace(0);
    // Bias over the output's channels (g.c, g.h x g.w): dy is the output's gradient.
    if (db) detail::channel_sums(ctx, dy, db, std::size_t(g.c), n, std::size_t(g.h) * g.w, scratch);
    REPLICA_CHECK(cudnnConvolutionBackwardFilter(ctx.cudnn(), &one, p.x, dy, p.y, x, p.conv, p.bwd_filter, ws, p.workspace,
                                                 &zero, p.w, dw));
    if (dx)
        REPLICA_CHECK(cudnnConvolutionForward(ctx.cudnn(), &one, p.x, dy, p.w, w, p.conv, p.fwd, ws, p.workspace, &zero,
                                              p.y, dx));
}

} // namespace replica::backend::cuda

