#pragma once
// Pooling on the CPU. Windows are described by a Window (g.c channels pooled independently).
// Max pooling ignores padding and window parts past the input (ceil mode); forward records where each
// maximum came from (the first maximal element in scan order) for backward.
//
// x, y, dy, dx are T (core::Storage), the maxima's positions core::pool_position_t<g>. Sums run in
// float; in bf16/fp16 each input-gradient plane is summed over its windows in a float plane allocated
// for the call, then rounded once: a bf16/fp16 result is round_through<T> of the float result on the
// same inputs.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <limits>

#include "replica/backend/cpu/context.hpp"
#include "replica/backend/cpu/ops.hpp"
#include "replica/backend/cpu/threads.hpp"
#include "replica/backend/cpu/vectorized.hpp"
#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::backend::cpu {

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

// dx planes (n * g.c of them, h*w each) = what `route(plane, dxp)` adds into a zeroed float plane
// dxp. Float sums into dx itself; T sums each plane in a float buffer, then rounds it into dx.
template <Window g, core::Storage T, class F>
void backward_planes(const Context& ctx, T* dx, std::size_t n, F&& route)
{
    const std::size_t planes = n * g.c, size = std::size_t(g.h) * g.w;
    if constexpr (std::same_as<T, float>) {
        parallel_rows(planes, planes * size, [&](std::size_t p0, std::size_t p1) {
            vectorized([&] {
                std::fill(dx + p0 * size, dx + p1 * size, 0.0f);
                for (std::size_t plane = p0; plane < p1; ++plane) route(plane, dx + plane * size);
            });
        });
    } else {   // one thread: the float plane is the context's
        vectorized([&] {
            float* buffer = ctx.workspace(size);
            for (std::size_t plane = 0; plane < planes; ++plane) {
                std::fill(buffer, buffer + size, 0.0f);
                route(plane, buffer);
                store_float(buffer, size, dx + plane * size);
            }
        });
    }
}
} // namespace detail

// y = the maximum of each window; arg = its position within the window (core::pool_position_t: the
// first maximum in scan order; the window's first element inside the input when no element exceeds
// -inf, NaN never does), n * g.c * g.oh * g.ow positions. The windows wholly inside the input are
// taken a row of them at a time, tap by tap, so that the loop over their columns vectorises; the
// comparisons are the scan's, in its order.
template <Window g, core::Storage T>
void max_pool_forward(const Context&, const T* x, T* y, core::pool_position_t<g>* arg, std::size_t n)
{
    using Position = core::pool_position_t<g>;
    // Columns [lo, hi) of output windows wholly inside the input's columns.
    constexpr int lo = std::min((g.pw + g.sw - 1) / g.sw, g.ow);
    constexpr int hi = g.w - g.kw + g.pw < 0 ? lo : std::clamp((g.w - g.kw + g.pw) / g.sw + 1, lo, g.ow);
    parallel_rows(n * g.c, n * g.in_size(), [&](std::size_t p0, std::size_t p1) {   // planes [p0, p1)
        vectorized([&] {
            for (std::size_t plane = p0; plane < p1; ++plane) {
                const T* xp = x + plane * g.h * g.w;
                T* yp = y + plane * g.out_pixels();
                Position* ap = arg + plane * g.out_pixels();
                auto scan = [&](int oy, int ox) {
                    const int y0 = oy * g.sh - g.ph, x0 = ox * g.sw - g.pw;
                    const int ya = std::max(y0, 0), yb = std::min(y0 + g.kh, g.h);
                    const int xa = std::max(x0, 0), xb = std::min(x0 + g.kw, g.w);
                    float best = -std::numeric_limits<float>::infinity();
                    int at_y = ya, at_x = xa;
                    for (int iy = ya; iy < yb; ++iy)
                        for (int ix = xa; ix < xb; ++ix)
                            if (core::to_float(xp[iy * g.w + ix]) > best) {
                                best = core::to_float(xp[iy * g.w + ix]);
                                at_y = iy;
                                at_x = ix;
                            }
                    const int o = oy * g.ow + ox;
                    yp[o] = core::from_float<T>(best);
                    ap[o] = Position((at_y - y0) * g.kw + at_x - x0);
                };
                for (int oy = 0; oy < g.oh; ++oy) {
                    const int y0 = oy * g.sh - g.ph;
                    if (y0 < 0 || y0 + g.kh > g.h || lo >= hi) {
                        for (int ox = 0; ox < g.ow; ++ox) scan(oy, ox);
                        continue;
                    }
                    for (int ox = 0; ox < lo; ++ox) scan(oy, ox);
                    float best[std::max(hi - lo, 1)];
                    Position at[std::max(hi - lo, 1)];
                    std::fill(best, best + (hi - lo), -std::numeric_limits<float>::infinity());
                    std::fill(at, at + (hi - lo), Position(0));
                    for (int ky = 0; ky < g.kh; ++ky)
                        for (int kx = 0; kx < g.kw; ++kx) {
                            const T* src = xp + (y0 + ky) * g.w + lo * g.sw - g.pw + kx;
                            const Position tap = Position(ky * g.kw + kx);
                            for (int i = 0; i < hi - lo; ++i) {
                                const float v = core::to_float(src[i * g.sw]);
                                const bool more = v > best[i];
                                best[i] = more ? v : best[i];
                                at[i] = more ? tap : at[i];
                            }
                        }
                    for (int i = 0; i < hi - lo; ++i) {
                        yp[oy * g.ow + lo + i] = core::from_float<T>(best[i]);
                        ap[oy * g.ow + lo + i] = at[i];
                    }
                    for (int ox = hi; ox < g.ow; ++ox) scan(oy, ox);
                }
            }
        });
    });
}

// dx = each window's gradient routed to its maximum (windows are visited in order: deterministic).
template <Window g, core::Storage T>
void max_pool_backward(const Context& ctx, const core::pool_position_t<g>* arg, const T* dy, T* dx, std::size_t n)
{
    detail::backward_planes<g>(ctx, dx, n, [&](std::size_t plane, float* dxp) {
        const core::pool_position_t<g>* ap = arg + plane * g.out_pixels();
        const T* dyp = dy + plane * g.out_pixels();
        for (int o = 0; o < g.out_pixels(); ++o)
            dxp[core::pool_input_offset(g, o / g.ow, o % g.ow, ap[o])] += core::to_float(dyp[o]);
    });
}

// Average over kh*kw taps, padding counted as zeros (PyTorch's count_include_pad).
template <Window g, core::Storage T>
void avg_pool_forward(const Context&, const T* x, T* y, std::size_t n)
{
    const float scale = 1.0f / float(g.kh * g.kw);
    parallel_rows(n * g.c, n * g.in_size(), [&](std::size_t p0, std::size_t p1) {   // planes [p0, p1)
        vectorized([&] {
            for (std::size_t plane = p0; plane < p1; ++plane) {
                const T* xp = x + plane * g.h * g.w;
                T* yp = y + plane * g.out_pixels();
                detail::for_each_window<g>([&](int o, int ya, int yb, int xa, int xb) {
                    float s = 0.0f;
                    for (int iy = ya; iy < yb; ++iy)
                        for (int ix = xa; ix < xb; ++ix) s += core::to_float(xp[iy * g.w + ix]);
                    yp[o] = core::from_float<T>(s * scale);
                });
            }
        });
    });
}

template <Window g, core::Storage T>
void avg_pool_backward(const Context& ctx, const T* dy, T* dx, std::size_t n)
{
    const float scale = 1.0f / float(g.kh * g.kw);
    detail::backward_planes<g>(ctx, dx, n, [&](std::size_t plane, float* dxp) {
        const T* dyp = dy + plane * g.out_pixels();
        detail::for_each_window<g>([&](int o, int ya, int yb, int xa, int xb) {
            for (int iy = ya; iy < yb; ++iy)
                for (int ix = xa; ix < xb; ++ix) dxp[iy * g.w + ix] += core::to_float(dyp[o]) * scale;
        });
    });
}

} // namespace replica::backend::cpu
