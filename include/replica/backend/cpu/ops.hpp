#pragma once
// CPU kernels the layers are built from: GEMM through BLAS, im2col/col2im, layout changes.
// All arrays are row-major. GEMM and its operands are float; the helpers that read or write
// activations take them in any core::Storage type T and convert on the way (to_float on load,
// from_float<T> on store), so a bf16/fp16 layer runs the same float products as a float one. For
// T = float they are the float code. Nothing here allocates.

#include <cblas.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "replica/backend/cpu/threads.hpp"
#include "replica/core/config.hpp"
#include "replica/core/number.hpp"
#include "replica/core/window.hpp"

namespace REPLICA_NAMESPACE::backend::cpu {

// C (m x n) = alpha * op(A) (m x k) * op(B) (k x n) + beta * C, row-major, leading dims as stored.
// On several threads (threads.hpp) the larger of C's dimensions is split into parts, in multiples of
// 16, each part one OpenBLAS call on its thread.
inline void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                 const float* b, int ldb, float beta, float* c, int ldc)
{
    const auto call = [&](int rows, int cols, const float* pa, const float* pb, float* pc) {
        cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, rows,
                    cols, k, alpha, pa, lda, pb, ldb, beta, pc, ldc);
    };
    // The work counted for parallel_rows as m n k / 16 values: a thread per half a million
    // multiply-adds at least, where a part is long enough to outweigh waking the team.
    constexpr int part = 16;
    const bool by_rows = m >= n;
    const int split = by_rows ? m : n;
    const auto parts = std::size_t((split + part - 1) / part);
    parallel_rows(parts, std::size_t(m) * std::size_t(n) * std::size_t(k) / 16, [&](std::size_t p0, std::size_t p1) {
        const int begin = int(p0) * part, count = std::min(int(p1) * part, split) - begin;
        if (by_rows)   // rows [begin, begin + count) of op(A) and C
            call(count, n, trans_a ? a + begin : a + std::size_t(begin) * lda, b, c + std::size_t(begin) * ldc);
        else           // columns [begin, begin + count) of op(B) and C
            call(m, count, a, trans_b ? b + std::size_t(begin) * ldb : b + begin, c + begin);
    });
}

using core::Window;

// exp(x) for x <= 0 in float, without a call or a branch, so that loops over it vectorise: x clamped
// to [-87.3, 0] through its bits (an integer min, which vectorises where a float compare under
// -ftrapping-math does not), x = n ln 2 + r with |r| <= ln 2 / 2, exp(r) by Cephes' degree-7
// polynomial, times 2^n built in the exponent bits. Within 2 ulp of std::exp on [-87.3, 0]; below,
// exp(-87.3) (about 1e-38). A positive x is read as -x.
inline float exp_nonpositive(float x)
{
    const std::int32_t magnitude =
        std::min(std::bit_cast<std::int32_t>(x) & 0x7fffffff, std::bit_cast<std::int32_t>(87.3f));
    const float xc = -std::bit_cast<float>(magnitude);
    const float n = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;   // round to nearest
    const float r = (xc - n * 0.693359375f) + n * 2.12194440e-4f;               // ln 2 in two parts
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = (p * r) * r + r + 1.0f;
    return p * std::bit_cast<float>(std::int32_t(std::uint32_t(std::int32_t(n) + 127) << 23));
}

// tanh(u) = sign(u) (1 - e) / (1 + e), e = exp(-2 |u|): within a few ulp of 1 - |tanh(u)| and of
// tanh(u) away from 0; near 0 within 1e-7 absolute (what 1 + tanh(u), GELU's use, keeps).
inline float tanh_approx(float u)
{
    const float e = exp_nonpositive(-2.0f * std::fabs(u));
    return std::copysign((1.0f - e) / (1.0f + e), u);
}

// dst[i] = to_float(src[i]): T values loaded as float (a copy for T = float).
template <core::Storage T>
void load_float(const T* src, std::size_t count, float* dst)
{
    if constexpr (std::same_as<T, float>) {
        if (count != 0) std::memcpy(dst, src, count * sizeof(float));
    } else {
        for (std::size_t i = 0; i < count; ++i) dst[i] = core::to_float(src[i]);
    }
}

// count T values at p as float: p itself for float, else loaded into `buffer` (count floats).
template <core::Storage T>
const float* as_float(const T* p, std::size_t count, float* buffer)
{
    if constexpr (std::same_as<T, float>) {
        return p;
    } else {
        load_float(p, count, buffer);
        return buffer;
    }
}

// dst[i] = from_float<T>(src[i]): float results stored as T, one rounding each.
template <core::Storage T>
void store_float(const float* src, std::size_t count, T* dst)
{
    if constexpr (std::same_as<T, float>) {
        if (count != 0) std::memcpy(dst, src, count * sizeof(float));
    } else {
        for (std::size_t i = 0; i < count; ++i) dst[i] = core::from_float<T>(src[i]);
    }
}

// col (c*kh*kw, m*oh*ow) <- patches of samples x[0..m) (m, c, h, w), as float. Row r = (ci, ki, kj),
// column s*oh*ow + p holds input pixel under kernel tap r for output pixel p of sample s. This, col2im
// and the layout changes below split the samples over the backend's threads (threads.hpp): each
// sample's values are computed as on one thread.
template <Window g, core::Storage T>
void im2col(const T* x, int m, float* col)
{
    const int pixels = g.out_pixels();
    const std::size_t ld = std::size_t(m) * pixels;
    parallel_rows(std::size_t(m), std::size_t(m) * g.col_rows() * pixels, [&](std::size_t s0, std::size_t s1) {
        for (int s = int(s0); s < int(s1); ++s) {
            const T* xs = x + std::size_t(s) * g.in_size();
            for (int ci = 0; ci < g.c; ++ci)
                for (int ki = 0; ki < g.kh; ++ki)
                    for (int kj = 0; kj < g.kw; ++kj) {
                        const int row = (ci * g.kh + ki) * g.kw + kj;
                        float* dst = col + row * ld + std::size_t(s) * pixels;
                        const T* plane = xs + std::size_t(ci) * g.h * g.w;
                        for (int oy = 0; oy < g.oh; ++oy) {
                            const int iy = oy * g.sh - g.ph + ki;
                            float* d = dst + oy * g.ow;
                            if (iy < 0 || iy >= g.h) {
                                std::fill(d, d + g.ow, 0.0f);
                                continue;
                            }
                            const T* src = plane + iy * g.w;
                            if (g.sw == 1) {
                                // ix = ox - pw + kj is in range for ox in [lo, hi)
                                const int lo = std::clamp(g.pw - kj, 0, g.ow);
                                const int hi = std::clamp(g.w + g.pw - kj, lo, g.ow);
                                std::fill(d, d + lo, 0.0f);
                                load_float(src + lo - g.pw + kj, std::size_t(hi - lo), d + lo);
                                std::fill(d + hi, d + g.ow, 0.0f);
                            } else {
                                for (int ox = 0; ox < g.ow; ++ox) {
                                    const int ix = ox * g.sw - g.pw + kj;
                                    d[ox] = (ix >= 0 && ix < g.w) ? core::to_float(src[ix]) : 0.0f;
                                }
                            }
                        }
                    }
        }
    });
}

// dx[0..m) += the patches in col: the adjoint of im2col. dx must be zeroed (or hold what to add to).
template <Window g>
void col2im(const float* col, int m, float* dx)
{
    const int pixels = g.out_pixels();
    const std::size_t ld = std::size_t(m) * pixels;
    parallel_rows(std::size_t(m), std::size_t(m) * g.col_rows() * pixels, [&](std::size_t s0, std::size_t s1) {
        for (int s = int(s0); s < int(s1); ++s) {
            float* xs = dx + std::size_t(s) * g.in_size();
            for (int ci = 0; ci < g.c; ++ci)
                for (int ki = 0; ki < g.kh; ++ki)
                    for (int kj = 0; kj < g.kw; ++kj) {
                        const int row = (ci * g.kh + ki) * g.kw + kj;
                        const float* srcrow = col + row * ld + std::size_t(s) * pixels;
                        float* plane = xs + std::size_t(ci) * g.h * g.w;
                        for (int oy = 0; oy < g.oh; ++oy) {
                            const int iy = oy * g.sh - g.ph + ki;
                            if (iy < 0 || iy >= g.h) continue;
                            const float* s_ = srcrow + oy * g.ow;
                            float* d = plane + iy * g.w;
                            for (int ox = 0; ox < g.ow; ++ox) {
                                const int ix = ox * g.sw - g.pw + kj;
                                if (ix >= 0 && ix < g.w) d[ix] += s_[ox];
                            }
                        }
                    }
        }
    });
}

// (m, c, p) sample-major -> (c, m*p) channel-major, and back. For batched GEMMs over samples.
// to_channel_major loads T as float; to_sample_major stores its float sums as T (relu: max(v, 0)
// first, as relu_forward does, so that fusing changes no bit).
template <core::Storage T>
void to_channel_major(const T* src, int m, int c, int p, float* dst)
{
    parallel_rows(std::size_t(m), std::size_t(m) * c * p, [&](std::size_t s0, std::size_t s1) {
        for (std::size_t s = s0; s < s1; ++s)
            for (int ci = 0; ci < c; ++ci)
                load_float(src + (s * c + ci) * p, std::size_t(p), dst + (std::size_t(ci) * m + s) * p);
    });
}

// dst (m, c, p) = src (c, m*p) + bias[c] (bias may be null), then max(., 0) when relu.
template <core::Storage T>
void to_sample_major(const float* src, int m, int c, int p, const float* bias, T* dst, bool relu = false)
{
    parallel_rows(std::size_t(m), std::size_t(m) * c * p, [&](std::size_t s0, std::size_t s1) {
        for (std::size_t s = s0; s < s1; ++s)
            for (int ci = 0; ci < c; ++ci) {
                const float* a = src + (std::size_t(ci) * m + s) * p;
                T* d = dst + (std::size_t(s) * c + ci) * p;
                const float b = bias ? bias[ci] : 0.0f;
                if (relu)
                    for (int i = 0; i < p; ++i) {
                        const float v = a[i] + b;
                        d[i] = core::from_float<T>(v > 0.0f ? v : 0.0f);
                    }
                else
                    for (int i = 0; i < p; ++i) d[i] = core::from_float<T>(a[i] + b);
            }
    });
}

// out[j] (+)= sum over rows of a (rows, cols).
inline void sum_rows(const float* a, int rows, int cols, float* out, bool accumulate)
{
    if (!accumulate) std::fill(out, out + cols, 0.0f);
    for (int r = 0; r < rows; ++r) {
        const float* row = a + std::size_t(r) * cols;
        for (int j = 0; j < cols; ++j) out[j] += row[j];
    }
}

// out[i] (+)= sum of a's row i (rows, cols), in float.
template <core::Storage T>
void sum_cols(const T* a, int rows, int cols, float* out, bool accumulate)
{
    for (int r = 0; r < rows; ++r) {
        const T* row = a + std::size_t(r) * cols;
        float s = 0.0f;
        for (int j = 0; j < cols; ++j) s += core::to_float(row[j]);
        out[r] = accumulate ? out[r] + s : s;
    }
}

} // namespace replica::backend::cpu
