#pragma once
// Convolutions on the CPU: im2col + one GEMM per chunk of samples, or, for float convolutions and
// bf16 ones on a CPU with bf16 products in builds with oneDNN (REPLICA_ONEDNN), oneDNN's primitives
// where cpu::conv_path() and the choice it makes per layer say so (cpu/onednn/choice.hpp); the two
// agree within float rounding (in bf16: of the float sums, before the one rounding to bf16).
// Weights are (cout, c, kh, kw) for a convolution and (c, cout, kh, kw) for a transposed one, as in
// PyTorch. The batch is cut into chunks so that the im2col buffer stays below kChunkFloats. A null bias
// b (and then a null bias gradient db) is a convolution without bias.
//
// Activations x, y, dy, dx and the weights w are T (core::Storage); bias, gradients dw, db and the
// scratch are float. For bf16/fp16 the T operands are converted to float (im2col and the layout changes
// read T; the weights are copied to scratch), the same float GEMMs as for float run on them, and each
// stored output is rounded once, after the bias, the ReLU and col2im's sums, which stay float. The
// chunks are those of float, so a bf16/fp16 call gives round_through<T> of what the float call on the
// im2col path (ConvPath::blas) gives on the same (T-valued) inputs, bit for bit; its scratch (the
// *_scratch_size<g, T>) is float's plus the float weights and one chunk of the input-side tensor.
// oneDNN's bf16 convolutions keep the rule (bf16 operands, float sums, the one rounding after the
// bias, the ReLU and an added dx's sum) in their own order of sums.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <type_traits>

#include "replica/backend/cpu/context.hpp"
#include "replica/backend/cpu/elementwise.hpp"
#include "replica/backend/cpu/ops.hpp"
#include "replica/core/config.hpp"

#if defined(REPLICA_ONEDNN)
#include "replica/backend/cpu/onednn/choice.hpp"
#endif

namespace REPLICA_NAMESPACE::backend::cpu {

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

// Scratch past float's chunk that a T convolution needs: `weights` floats for the weights, then a
// chunk of m samples of the window's input side (g.in_size() each) where col2im sums in float.
template <Window g, class T>
std::size_t conversion_size(std::size_t m, std::size_t weights)
{
    static_assert(core::Storage<T>, "activations are float, core::bf16 or core::fp16");
    if constexpr (std::same_as<T, float>) return 0;
    else return weights + m * g.in_size();
}

} // namespace detail

// ---- convolution: x (n, c, h, w) -> y (n, cout, oh, ow) ----

template <Window g, class T = float>
std::size_t conv_scratch_size(const Context&, int cout, std::size_t n)
{
    const std::size_t per = detail::conv_per_sample<g>(cout);
    const std::size_t m = detail::chunk(n, per);
    return m * per + detail::conversion_size<g, T>(m, std::size_t(cout) * g.col_rows());
}

namespace detail {
template <Window g, core::Storage T>
void blas_conv_forward(int cout, const T* w, const float* b, const T* x, T* y, std::size_t n, float* scratch,
                       bool relu)
{
    const std::size_t m = detail::chunk(n, detail::conv_per_sample<g>(cout));
    const int p = g.out_pixels(), k = g.col_rows();
    const float* wf = as_float(w, std::size_t(cout) * k, scratch + m * detail::conv_per_sample<g>(cout));
    for (std::size_t s0 = 0; s0 < n; s0 += m) {
        const int mm = int(std::min(m, n - s0));
        float* col = scratch;                                   // (k, mm*p)
        float* out = scratch + std::size_t(k) * mm * p;         // (cout, mm*p)
        im2col<g>(x + s0 * g.in_size(), mm, col);
        gemm(false, false, cout, mm * p, k, 1.0f, wf, k, col, mm * p, 0.0f, out, mm * p);
        if constexpr (std::same_as<T, float>) to_sample_major(out, mm, cout, p, b, y + s0 * std::size_t(cout) * p);
        else to_sample_major(out, mm, cout, p, b, y + s0 * std::size_t(cout) * p, relu);
    }
    if constexpr (std::same_as<T, float>)
        if (relu)   // the ReLU op's own rule, so that fusing changes no bit
            for (std::size_t i = 0, count = n * std::size_t(cout) * p; i < count; ++i) y[i] = y[i] > 0.0f ? y[i] : 0.0f;
}

template <Window g, core::Storage T>
void blas_conv_backward(int cout, const T* w, const T* x, const T* dy, T* dx, float* dw, float* db, std::size_t n,
                        float* scratch, bool accumulate)
{
    const std::size_t m = detail::chunk(n, detail::conv_per_sample<g>(cout));
    const int p = g.out_pixels(), k = g.col_rows();
    float* tail = scratch + m * detail::conv_per_sample<g>(cout);
    const float* wf = dx ? as_float(w, std::size_t(cout) * k, tail) : nullptr;
    if constexpr (std::same_as<T, float>)
        if (dx && !accumulate) std::fill(dx, dx + n * g.in_size(), 0.0f);
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
            gemm(true, false, k, mm * p, cout, 1.0f, wf, k, dyt, mm * p, 0.0f, col, mm * p);
            if constexpr (std::same_as<T, float>) {
                col2im<g>(col, mm, dx + s0 * g.in_size());
            } else {
                float* dxf = tail + std::size_t(cout) * k;       // (mm, c, h, w) summed in float
                if (accumulate) load_float(dx + s0 * g.in_size(), std::size_t(mm) * g.in_size(), dxf);
                else std::fill(dxf, dxf + std::size_t(mm) * g.in_size(), 0.0f);
                col2im<g>(col, mm, dxf);
                store_float(dxf, std::size_t(mm) * g.in_size(), dx + s0 * g.in_size());
            }
        }
    }
}
} // namespace detail

template <Window g, core::Storage T>
void conv_forward(const Context& ctx, int cout, const T* w, const float* b, const T* x, T* y, std::size_t n,
                  float* scratch, bool relu)
{
    auto run_blas = [&] { detail::blas_conv_forward<g>(cout, w, b, x, y, n, scratch, relu); };
#if defined(REPLICA_ONEDNN)
    if (onednn::conv_forward<T>(ctx.onednn(), g, cout, w, b, x, y, n, relu, run_blas)) return;
#else
    (void)ctx;
#endif
    run_blas();
}

// dw, db (null without a bias) are assigned; dx (may be null) is assigned, or with `accumulate` the
// input gradient is added to it (summed in float onto dx's values, rounded to T once).
template <Window g, core::Storage T>
void conv_backward(const Context& ctx, int cout, const T* w, const T* x, const T* dy, std::type_identity_t<T>* dx,
                   float* dw, float* db, std::size_t n, float* scratch, bool accumulate = false)
{
    auto run_blas = [&] { detail::blas_conv_backward<g>(cout, w, x, dy, dx, dw, db, n, scratch, accumulate); };
#if defined(REPLICA_ONEDNN)
    if (onednn::conv_backward<T>(ctx.onednn(), g, cout, w, x, dy, dx, dw, db, n, accumulate, run_blas)) return;
#else
    (void)ctx;
#endif
    run_blas();
}

// A convolution followed by a ReLU whose output is relu_y and whose output gradient is dy: dz (the
// convolution output's gradient, n x cout x oh x ow) = the ReLU's backward, then conv_backward from dz.
template <Window g, core::Storage T>
void conv_backward_relu(const Context& ctx, int cout, const T* w, const T* x, const T* relu_y, const T* dy, T* dz,
                        std::type_identity_t<T>* dx, float* dw, float* db, std::size_t n, float* scratch,
                        bool accumulate = false)
{
    relu_backward(ctx, relu_y, dy, dz, n * std::size_t(cout) * g.out_pixels());
    conv_backward<g>(ctx, cout, w, x, dz, dx, dw, db, n, scratch, accumulate);
}

// ---- transposed convolution: x (n, c, h, w) -> y (n, cout, oh, ow) ----
// It is the adjoint of the convolution y -> x with window `g` taken over y: g.c = cout, (g.h, g.w) =
// (oh, ow), (g.oh, g.ow) = (h, w).

template <Window g, class T = float>
std::size_t conv_transpose_scratch_size(const Context&, int c, std::size_t n)
{
    const std::size_t per = detail::conv_per_sample<g>(c);
    const std::size_t m = detail::chunk(n, per);
    return m * per + detail::conversion_size<g, T>(m, std::size_t(c) * g.col_rows());
}

namespace detail {
template <Window g, core::Storage T>
void blas_conv_transpose_forward(int c, const T* w, const float* b, const T* x, T* y, std::size_t n, float* scratch)
{
    const std::size_t m = detail::chunk(n, detail::conv_per_sample<g>(c));
    const int p = g.out_pixels(), k = g.col_rows();        // p = h*w of x, k = cout*kh*kw
    const int planes = g.h * g.w;
    if constexpr (std::same_as<T, float>) {
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
        for (std::size_t s = 0; s < n; ++s)
            for (int co = 0; co < g.c; ++co) {
                float* d = y + (s * g.c + co) * planes;
                for (int i = 0; i < planes; ++i) d[i] += b[co];
            }
    } else {
        float* tail = scratch + m * detail::conv_per_sample<g>(c);
        const float* wf = as_float(w, std::size_t(c) * k, tail);
        float* yf = tail + std::size_t(c) * k;                    // (mm, cout, oh, ow) in float
        for (std::size_t s0 = 0; s0 < n; s0 += m) {
            const int mm = int(std::min(m, n - s0));
            float* col = scratch;
            float* xt = scratch + std::size_t(k) * mm * p;
            to_channel_major(x + s0 * std::size_t(c) * p, mm, c, p, xt);
            gemm(true, false, k, mm * p, c, 1.0f, wf, k, xt, mm * p, 0.0f, col, mm * p);
            std::fill(yf, yf + std::size_t(mm) * g.in_size(), 0.0f);
            col2im<g>(col, mm, yf);
            if (b)
                for (int s = 0; s < mm; ++s)
                    for (int co = 0; co < g.c; ++co) {
                        float* d = yf + (std::size_t(s) * g.c + co) * planes;
                        for (int i = 0; i < planes; ++i) d[i] += b[co];
                    }
            store_float(yf, std::size_t(mm) * g.in_size(), y + s0 * g.in_size());
        }
    }
}

template <Window g, core::Storage T>
void blas_conv_transpose_backward(int c, const T* w, const T* x, const T* dy, T* dx, float* dw, float* db, std::size_t n,
                                  float* scratch)
{
    const std::size_t m = detail::chunk(n, detail::conv_per_sample<g>(c));
    const int p = g.out_pixels(), k = g.col_rows();
    const int planes = g.h * g.w;
    const float* wf =
        dx ? as_float(w, std::size_t(c) * k, scratch + m * detail::conv_per_sample<g>(c)) : nullptr;
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
            gemm(false, false, c, mm * p, k, 1.0f, wf, k, col, mm * p, 0.0f, xt, mm * p);
            to_sample_major(xt, mm, c, p, nullptr, dx + s0 * std::size_t(c) * p);
        }
    }
}
} // namespace detail

// y = the transposed convolution of x (n, c, oh, ow) with w (c, g.c, kh, kw), plus b (g.c; null: no bias).
template <Window g, core::Storage T>
void conv_transpose_forward(const Context& ctx, int c, const T* w, const float* b, const T* x, T* y, std::size_t n,
                            float* scratch)
{
    auto run_blas = [&] { detail::blas_conv_transpose_forward<g>(c, w, b, x, y, n, scratch); };
#if defined(REPLICA_ONEDNN)
    if (onednn::conv_forward<T>(ctx.onednn(), g, c, w, b, x, y, n, false, run_blas, true)) return;
#else
    (void)ctx;
#endif
    run_blas();
}

// dw, db (null without a bias) and dx (may be null) assigned.
template <Window g, core::Storage T>
void conv_transpose_backward(const Context& ctx, int c, const T* w, const T* x, const T* dy, std::type_identity_t<T>* dx,
                             float* dw, float* db, std::size_t n, float* scratch)
{
    auto run_blas = [&] { detail::blas_conv_transpose_backward<g>(c, w, x, dy, dx, dw, db, n, scratch); };
#if defined(REPLICA_ONEDNN)
    if (onednn::conv_backward<T>(ctx.onednn(), g, c, w, x, dy, dx, dw, db, n, false, run_blas, true)) return;
#else
    (void)ctx;
#endif
    run_blas();
}

} // namespace replica::backend::cpu
