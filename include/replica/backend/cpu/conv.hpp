#pragma once
// Convolutions on the CPU: im2col + one GEMM per chunk of samples.
// Weights are (cout, c, kh, kw) for a convolution and (c, cout, kh, kw) for a transposed one, as in
// PyTorch. The batch is cut into chunks so that the im2col buffer stays below kChunkFloats. A null bias
// b (and then a null bias gradient db) is a convolution without bias.

#include <algorithm>
#include <cstddef>

#include "replica/backend/cpu/context.hpp"
#include "replica/backend/cpu/elementwise.hpp"
#include "replica/backend/cpu/ops.hpp"

namespace replica::backend::cpu {

namespace detail {
inline constexpr std::size_t kChunkFloats = std::size_t{1} << 22;   // 16 MiB of im2col per chunk

// Samples per chunk for a window whose per-sample scratch is `per_sample` floats.
inline std::size_t chunk(std::size_t n, std::size_t per_sample)
{
    return std::clamp<std::size_t>(kChunkFloats / std::max<std::size_t>(per_sample, 1), 1, std::max<std::size_t>(n, 1));
}
template <Window g>
std::size_t conv_per_sample(int cout)
{
    return std::size_t(g.col_rows() + cout) * g.out_pixels();
}
} // namespace detail

// ---- convolution: x (n, c, h, w) -> y (n, cout, oh, ow) ----

template <Window g, class T = float>
std::size_t conv_scratch_size(const Context&, int cout, std::size_t n)
{
    const std::size_t per = detail::conv_per_sample<g>(cout);
    return detail::chunk(n, per) * per;
}

template <Window g>
void conv_forward(const Context&, int cout, const float* w, const float* b,
                         const float* x, float* y, std::size_t n, float* scratch, bool relu)
{
    const std::size_t m = detail::chunk(n, detail::conv_per_sample<g>(cout));
    const int p = g.out_pixels(), k = g.col_rows();
    for (std::size_t s0 = 0; s0 < n; s0 += m) {
        const int mm = int(std::min(m, n - s0));
        float* col = scratch;                                   // (k, mm*p)
        float* out = scratch + std::size_t(k) * mm * p;         // (cout, mm*p)
        im2col<g>(x + s0 * g.in_size(), mm, col);
        gemm(false, false, cout, mm * p, k, 1.0f, w, k, col, mm * p, 0.0f, out, mm * p);
        to_sample_major(out, mm, cout, p, b, y + s0 * std::size_t(cout) * p);
    }
    if (relu)   // the ReLU op's own rule, so that fusing changes no bit
        for (std::size_t i = 0, count = n * std::size_t(cout) * p; i < count; ++i) y[i] = y[i] > 0.0f ? y[i] : 0.0f;
}

// dw, db (null without a bias) are assigned; dx (may be null) is assigned.
template <Window g>
void conv_backward(const Context&, int cout, const float* w, const float* x,
                          const float* dy, float* dx, float* dw, float* db, std::size_t n, float* scratch)
{
    const std::size_t m = detail::chunk(n, detail::conv_per_sample<g>(cout));
    const int p = g.out_pixels(), k = g.col_rows();
    if (dx) std::fill(dx, dx + n * g.in_size(), 0.0f);
    for (std::size_t s0 = 0; s0 < n; s0 += m) {
        const int mm = int(std::min(m, n - s0));
        const float beta = s0 == 0 ? 0.0f : 1.0f;
        float* col = scratch;
        float* dyt = scratch + std::size_t(k) * mm * p;          // (cout, mm*p)
        to_channel_major(dy + s0 * std::size_t(cout) * p, mm, cout, p, dyt);
        im2col<g>(x + s0 * g.in_size(), mm, col);
        gemm(false, true, cout, k, mm * p, 1.0f, dyt, mm * p, col, mm * p, beta, dw, k);
        if (db) sum_cols(dyt, cout, mm * p, db, s0 != 0);
        if (dx) {
            gemm(true, false, k, mm * p, cout, 1.0f, w, k, dyt, mm * p, 0.0f, col, mm * p);
            col2im<g>(col, mm, dx + s0 * g.in_size());
        }
    }
}

// A convolution followed by a ReLU whose output is relu_y and whose output gradient is dy: dz (the
// convolution output's gradient, n x cout x oh x ow) = the ReLU's backward, then conv_backward from dz.
template <Window g>
void conv_backward_relu(const Context& ctx, int cout, const float* w, const float* x, const float* relu_y,
                        const float* dy, float* dz, float* dx, float* dw, float* db, std::size_t n, float* scratch)
{
    relu_backward(ctx, relu_y, dy, dz, n * std::size_t(cout) * g.out_pixels());
    conv_backward<g>(ctx, cout, w, x, dz, dx, dw, db, n, scratch);
}

// ---- transposed convolution: x (n, c, h, w) -> y (n, cout, oh, ow) ----
// It is the adjoint of the convolution y -> x with window `g` taken over y: g.c = cout, (g.h, g.w) =
// (oh, ow), (g.oh, g.ow) = (h, w).

template <Window g, class T = float>
std::size_t conv_transpose_scratch_size(const Context&, int c, std::size_t n)
{
    const std::size_t per = detail::conv_per_sample<g>(c);
    return detail::chunk(n, per) * per;
}

template <Window g>
void conv_transpose_forward(const Context&, int c, const float* w, const float* b,
                                   const float* x, float* y, std::size_t n, float* scratch)
{
    const std::size_t m = detail::chunk(n, detail::conv_per_sample<g>(c));
    const int p = g.out_pixels(), k = g.col_rows();        // p = h*w of x, k = cout*kh*kw
    std::fill(y, y + n * g.in_size(), 0.0f);
    for (std::size_t s0 = 0; s0 < n; s0 += m) {
        const int mm = int(std::min(m, n - s0));
        float* col = scratch;                                 // (k, mm*p)
        float* xt = scratch + std::size_t(k) * mm * p;        // (c, mm*p)
        to_channel_major(x + s0 * std::size_t(c) * p, mm, c, p, xt);
        gemm(true, false, k, mm * p, c, 1.0f, w, k, xt, mm * p, 0.0f, col, mm * p);
        col2im<g>(col, mm, y + s0 * g.in_size());
    }
    if (!b) return;
    const int planes = g.h * g.w;
    for (std::size_t s = 0; s < n; ++s)
        for (int co = 0; co < g.c; ++co) {
            float* d = y + (s * g.c + co) * planes;
            for (int i = 0; i < planes; ++i) d[i] += b[co];
        }
}

template <Window g>
void conv_transpose_backward(const Context&, int c, const float* w, const float* x,
                                    const float* dy, float* dx, float* dw, float* db, std::size_t n,
                                    float* scratch)
{
    const std::size_t m = detail::chunk(n, detail::conv_per_sample<g>(c));
    const int p = g.out_pixels(), k = g.col_rows();
    const int planes = g.h * g.w;
    if (db) {
        std::fill(db, db + g.c, 0.0f);
        for (std::size_t s = 0; s < n; ++s) sum_cols(dy + s * g.in_size(), g.c, planes, db, true);
    }
    for (std::size_t s0 = 0; s0 < n; s0 += m) {
        const int mm = int(std::min(m, n - s0));
        const float beta = s0 == 0 ? 0.0f : 1.0f;
        float* col = scratch;
        float* xt = scratch + std::size_t(k) * mm * p;
        im2col<g>(dy + s0 * g.in_size(), mm, col);                  // (k, mm*p)
        to_channel_major(x + s0 * std::size_t(c) * p, mm, c, p, xt);
        gemm(false, true, c, k, mm * p, 1.0f, xt, mm * p, col, mm * p, beta, dw, k);
        if (dx) {
            gemm(false, false, c, mm * p, k, 1.0f, w, k, col, mm * p, 0.0f, xt, mm * p);
            to_sample_major(xt, mm, c, p, nullptr, dx + s0 * std::size_t(c) * p);
        }
    }
}

} // namespace replica::backend::cpu
