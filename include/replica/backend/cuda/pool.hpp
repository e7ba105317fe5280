#pragma once
// Pooling on the GPU, with the CPU backend's exact rules (ceil mode, padding ignored by max, counted
// as zeros by average). Max pooling records each maximum's position; backward gathers: one thread per
// input element sums the gradients of the windows that picked it, so no atomics and the same result
// every run. The kernels are templates on the window, so that their index arithmetic divides by
// constants (a 64-bit division by a value known only at run time costs dozens of instructions).

#include <cstddef>

#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/launch.hpp"

namespace replica::backend::cuda {

// A window as the template arguments of a kernel (nvcc cannot pass a class-type template argument
// from namespace scope to a __global__ function): the kernel rebuilds it as a constant.
#define REPLICA_WINDOW_INTS(g) g.c, g.h, g.w, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.oh, g.ow

namespace kernels {
__device__ inline float window_max(const core::Window& g, const float* xp, int oy, int ox, int& arg)
{
    const int y0 = oy * g.sh - g.ph, x0 = ox * g.sw - g.pw;
    const int ya = max(y0, 0), yb = min(y0 + g.kh, g.h), xa = max(x0, 0), xb = min(x0 + g.kw, g.w);
    float best = -INFINITY;
    arg = -1;
    for (int iy = ya; iy < yb; ++iy)
        for (int ix = xa; ix < xb; ++ix)
            if (xp[iy * g.w + ix] > best) {   // strict: the first maximum in scan order wins
                best = xp[iy * g.w + ix];
                arg = iy * g.w + ix;
            }
    return best;
}

template <int... G>
__global__ void max_pool_forward(const float* x, float* y, float* arg, std::size_t count)
{
    constexpr core::Window g{G...};
    REPLICA_GRID_LOOP(i, count)
    {
        const std::size_t plane = i / (g.oh * g.ow);
        const int o = int(i % (g.oh * g.ow));
        int at;
        y[i] = window_max(g, x + plane * g.h * g.w, o / g.ow, o % g.ow, at);
        arg[i] = float(at);
    }
}

// Output windows [lo, hi) along one axis that contain input index i.
__device__ inline void covering(int i, int k, int s, int p, int out, int& lo, int& hi)
{
    const int top = i + p;                    // window o covers i when o*s <= top < o*s + k
    lo = top - k + 1 <= 0 ? 0 : (top - k + s) / s;
    hi = min(top / s + 1, out);
}

// Input element i of an (n * c) planes of h x w input: its plane, its place in the plane, and the
// output windows [ylo, yhi) x [xlo, xhi) that contain it (backward passes gather over them).
struct Covered {
    std::size_t plane;
    int at, ylo, yhi, xlo, xhi;
};
__device__ inline Covered covered_by(const core::Window& g, std::size_t i)
{
    Covered c{i / (g.h * g.w), int(i % (g.h * g.w)), 0, 0, 0, 0};
    covering(c.at / g.w, g.kh, g.sh, g.ph, g.oh, c.ylo, c.yhi);
    covering(c.at % g.w, g.kw, g.sw, g.pw, g.ow, c.xlo, c.xhi);
    return c;
}

template <int... G>
__global__ void max_pool_backward(const float* arg, const float* dy, float* dx, std::size_t count)
{
    constexpr core::Window g{G...};
    REPLICA_GRID_LOOP(i, count)
    {
        const Covered c = covered_by(g, i);
        const float* ap = arg + c.plane * g.oh * g.ow;
        const float* dyp = dy + c.plane * g.oh * g.ow;
        float sum = 0.0f;
        for (int oy = c.ylo; oy < c.yhi; ++oy)
            for (int ox = c.xlo; ox < c.xhi; ++ox)
                if (int(ap[oy * g.ow + ox]) == c.at) sum += dyp[oy * g.ow + ox];
        dx[i] = sum;
    }
}

template <int... G>
__global__ void avg_pool_forward(const float* x, float* y, std::size_t count)
{
    constexpr core::Window g{G...};
    REPLICA_GRID_LOOP(i, count)
    {
        const std::size_t plane = i / (g.oh * g.ow);
        const int o = int(i % (g.oh * g.ow)), oy = o / g.ow, ox = o % g.ow;
        const float* xp = x + plane * g.h * g.w;
        const int y0 = oy * g.sh - g.ph, x0 = ox * g.sw - g.pw;
        float s = 0.0f;
        for (int iy = max(y0, 0); iy < min(y0 + g.kh, g.h); ++iy)
            for (int ix = max(x0, 0); ix < min(x0 + g.kw, g.w); ++ix) s += xp[iy * g.w + ix];
        y[i] = s * (1.0f / float(g.kh * g.kw));
    }
}

template <int... G>
__global__ void avg_pool_backward(const float* dy, float* dx, std::size_t count)
{
    constexpr core::Window g{G...};
    REPLICA_GRID_LOOP(i, count)
    {
        const Covered c = covered_by(g, i);
        const float* dyp = dy + c.plane * g.oh * g.ow;
        float s = 0.0f;
        for (int oy = c.ylo; oy < c.yhi; ++oy)
            for (int ox = c.xlo; ox < c.xhi; ++ox) s += dyp[oy * g.ow + ox];
        dx[i] = s * (1.0f / float(g.kh * g.kw));
    }
}
} // namespace kernels

template <core::Window g>
void max_pool_forward(const Context& ctx, const float* x, float* y, float* arg, std::size_t n)
{
    const std::size_t count = n * g.c * g.oh * g.ow;
    kernels::max_pool_forward<REPLICA_WINDOW_INTS(g)><<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(x, y, arg, count);
    detail::check_launch("max_pool_forward");
}
template <core::Window g>
void max_pool_backward(const Context& ctx, const float* arg, const float* dy, float* dx, std::size_t n)
{
    const std::size_t count = n * g.c * g.h * g.w;
    kernels::max_pool_backward<REPLICA_WINDOW_INTS(g)><<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(arg, dy, dx, count);
    detail::check_launch("max_pool_backward");
}
template <core::Window g>
void avg_pool_forward(const Context& ctx, const float* x, float* y, std::size_t n)
{
    const std::size_t count = n * g.c * g.oh * g.ow;
    kernels::avg_pool_forward<REPLICA_WINDOW_INTS(g)><<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(x, y, count);
    detail::check_launch("avg_pool_forward");
}
template <core::Window g>
void avg_pool_backward(const Context& ctx, const float* dy, float* dx, std::size_t n)
{
    const std::size_t count = n * g.c * g.h * g.w;
    kernels::avg_pool_backward<REPLICA_WINDOW_INTS(g)><<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(dy, dx, count);
    detail::check_launch("avg_pool_backward");
}

} // namespace replica::backend::cuda
