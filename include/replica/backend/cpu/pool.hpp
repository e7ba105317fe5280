#pragma once
// Pooling on the CPU. Windows are described by a Window (g.c channels pooled independently).
// Max pooling ignores padding and window parts past the input (ceil mode); forward records where each
// maximum came from (the first maximal element in scan order) for backward.

#include <algorithm>
#include <cstddef>
#include <limits>

#include "replica/backend/cpu/context.hpp"
#include "replica/backend/cpu/ops.hpp"

namespace replica::backend::cpu {

namespace detail {
template <Window g, class F>
void for_each_window(F&& f)
{
    for (int oy = 0; oy < g.oh; ++oy) {
        const int y0 = oy * g.sh - g.ph;
        const int ya = std::max(y0, 0), yb = std::min(y0 + g.kh, g.h);
        for (int ox = 0; ox < g.ow; ++ox) {
            const int x0 = ox * g.sw - g.pw;
            const int xa = std::max(x0, 0), xb = std::min(x0 + g.kw, g.w);
            f(oy * g.ow + ox, ya, yb, xa, xb);
        }
    }
}
} // namespace detail

// y = the maximum of each window; arg = its position in the input plane (the first maximum in scan
// order), as a float.
template <Window g>
void max_pool_forward(const Context&, const float* x, float* y, float* arg, std::size_t n)
{
    for (std::size_t plane = 0; plane < n * g.c; ++plane) {
        const float* xp = x + plane * g.h * g.w;
        float* yp = y + plane * g.out_pixels();
        float* ap = arg + plane * g.out_pixels();
        detail::for_each_window<g>([&](int o, int ya, int yb, int xa, int xb) {
            float best = -std::numeric_limits<float>::infinity();
            int at = ya * g.w + xa;
            for (int iy = ya; iy < yb; ++iy)
                for (int ix = xa; ix < xb; ++ix)
                    if (xp[iy * g.w + ix] > best) {
                        best = xp[iy * g.w + ix];
                        at = iy * g.w + ix;
                    }
            yp[o] = best;
            ap[o] = float(at);
        });
    }
}

// dx = each window's gradient routed to its maximum (windows are visited in order: deterministic).
template <Window g>
void max_pool_backward(const Context&, const float* arg, const float* dy, float* dx, std::size_t n)
{
    std::fill(dx, dx + n * g.in_size(), 0.0f);
    for (std::size_t plane = 0; plane < n * g.c; ++plane) {
        const float* ap = arg + plane * g.out_pixels();
        const float* dyp = dy + plane * g.out_pixels();
        float* dxp = dx + plane * g.h * g.w;
        for (int o = 0; o < g.out_pixels(); ++o) dxp[int(ap[o])] += dyp[o];
    }
}

// Average over kh*kw taps, padding counted as zeros (PyTorch's count_include_pad).
template <Window g>
void avg_pool_forward(const Context&, const float* x, float* y, std::size_t n)
{
    const float scale = 1.0f / float(g.kh * g.kw);
    for (std::size_t plane = 0; plane < n * g.c; ++plane) {
        const float* xp = x + plane * g.h * g.w;
        float* yp = y + plane * g.out_pixels();
        detail::for_each_window<g>([&](int o, int ya, int yb, int xa, int xb) {
            float s = 0.0f;
            for (int iy = ya; iy < yb; ++iy)
                for (int ix = xa; ix < xb; ++ix) s += xp[iy * g.w + ix];
            yp[o] = s * scale;
        });
    }
}

template <Window g>
void avg_pool_backward(const Context&, const float* dy, float* dx, std::size_t n)
{
    const float scale = 1.0f / float(g.kh * g.kw);
    std::fill(dx, dx + n * g.in_size(), 0.0f);
    for (std::size_t plane = 0; plane < n * g.c; ++plane) {
        const float* dyp = dy + plane * g.out_pixels();
        float* dxp = dx + plane * g.h * g.w;
        detail::for_each_window<g>([&](int o, int ya, int yb, int xa, int xb) {
            for (int iy = ya; iy < yb; ++iy)
                for (int ix = xa; ix < xb; ++ix) dxp[iy * g.w + ix] += dyp[o] * scale;
        });
    }
}

} // namespace replica::backend::cpu
