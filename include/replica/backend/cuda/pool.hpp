#pragma once
// Pooling on the GPU, with the CPU backend's exact rules (ceil mode, padding ignored by max, counted
// as zeros by average). Max pooling records each maximum's position; backward gathers: one thread per
// input element sums the gradients of the windows that picked it, so no atomics and the same result
// every run. The kernels are templates on the window, so that their index arithmetic divides by
// constants (a 64-bit division by a value known only at run time costs dozens of instructions), and
// on the index type, 32-bit where it fits, with windows unrolled (max pooling backward of GoogLeNet's
// first pool at batch 32 on an H200: 261 us with 64-bit indices and loops, 171 us so).

#include <cstddef>

#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/launch.hpp"

namespace replica::backend::cuda {

// A window as the template arguments of a kernel (nvcc cannot pass a class-type template argument
// from namespace scope to a __global__ function): the kernel rebuilds it as a constant.
#define REPLICA_WINDOW_INTS(g) g.c, g.h, g.w, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.oh, g.ow

namespace kernels {
// Grid-stride loop with an index of type I: 32 bits where the count allows (see indexed()), so that
// the index arithmetic is single instructions.
#define REPLICA_GRID_LOOP_AS(I, i, count) \
    for (I i = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); i < (count); i += I(blockDim.x) * I(gridDim.x))

// Windows are walked over their full size (kh x kw, or the ceil(k/s) windows that can cover an
// input along an axis), unrolled (up to 8 per axis, so a global pooling stays small), with bounds
// tests inside: the same elements in the same order as a loop over the clipped range, so the same bits.

// f(value, offset in its input plane) for every input element of output element i's window
// (padding skipped), rows then columns.
template <class I, class F>
__device__ inline void for_window(const core::Window& g, const float* x, I i, F&& f)
{
    const I plane = i / I(g.oh * g.ow);
    const int o = int(i - plane * I(g.oh * g.ow));
    const int y0 = o / g.ow * g.sh - g.ph, x0 = o % g.ow * g.sw - g.pw;
    const float* xp = x + plane * I(g.h * g.w);
#pragma unroll 8
    for (int a = 0; a < g.kh; ++a)
#pragma unroll 8
        for (int b = 0; b < g.kw; ++b) {
            const int iy = y0 + a, ix = x0 + b;
            if (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w) f(__ldg(xp + iy * g.w + ix), iy * g.w + ix);
        }
}

template <class I, int... G>
__global__ void max_pool_forward(const float* x, float* y, float* arg, I count)
{
    constexpr core::Window g{G...};
    REPLICA_GRID_LOOP_AS(I, i, count)
    {
        float best = -INFINITY;
        int at = -1;
        for_window(g, x, i, [&](float v, int k) {
            if (v > best) {   // strict: the first maximum in scan order wins
                best = v;
                at = k;
            }
        });
        y[i] = best;
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

// Input element i of (n * c) planes of h x w: its plane, its place in the plane, and the output
// windows [ylo, yhi) x [xlo, xhi) that contain it (backward passes gather over them).
template <class I>
struct Covered {
    I plane;
    int at, ylo, yhi, xlo, xhi;
};
template <class I>
__device__ inline Covered<I> covered_by(const core::Window& g, I i)
{
    Covered<I> c{i / I(g.h * g.w), 0, 0, 0, 0, 0};
    c.at = int(i - c.plane * I(g.h * g.w));
    covering(c.at / g.w, g.kh, g.sh, g.ph, g.oh, c.ylo, c.yhi);
    covering(c.at % g.w, g.kw, g.sw, g.pw, g.ow, c.xlo, c.xhi);
    return c;
}

// f(offset in the output plane) for every output window covering input c, rows then columns.
template <class F>
__device__ inline void for_covering(const core::Window& g, int ylo, int yhi, int xlo, int xhi, F&& f)
{
#pragma unroll 8
    for (int a = 0; a < (g.kh + g.sh - 1) / g.sh; ++a)
#pragma unroll 8
        for (int b = 0; b < (g.kw + g.sw - 1) / g.sw; ++b)
            if (ylo + a < yhi && xlo + b < xhi) f((ylo + a) * g.ow + xlo + b);
}

template <class I, int... G>
__global__ void max_pool_backward(const float* arg, const float* dy, float* dx, I count)
{
    constexpr core::Window g{G...};
    REPLICA_GRID_LOOP_AS(I, i, count)
    {
        const Covered<I> c = covered_by(g, i);
        const float* ap = arg + c.plane * I(g.oh * g.ow);
        const float* dyp = dy + c.plane * I(g.oh * g.ow);
        float sum = 0.0f;
        for_covering(g, c.ylo, c.yhi, c.xlo, c.xhi, [&](int o) {
            if (int(__ldg(ap + o)) == c.at) sum += __ldg(dyp + o);
        });
        dx[i] = sum;
    }
}

template <class I, int... G>
__global__ void avg_pool_forward(const float* x, float* y, I count)
{
    constexpr core::Window g{G...};
    REPLICA_GRID_LOOP_AS(I, i, count)
    {
        float s = 0.0f;
        for_window(g, x, i, [&](float v, int) { s += v; });
        y[i] = s * (1.0f / float(g.kh * g.kw));
    }
}

template <class I, int... G>
__global__ void avg_pool_backward(const float* dy, float* dx, I count)
{
    constexpr core::Window g{G...};
    REPLICA_GRID_LOOP_AS(I, i, count)
    {
        const Covered<I> c = covered_by(g, i);
        const float* dyp = dy + c.plane * I(g.oh * g.ow);
        float s = 0.0f;
        for_covering(g, c.ylo, c.yhi, c.xlo, c.xhi, [&](int o) { s += __ldg(dyp + o); });
        dx[i] = s * (1.0f / float(g.kh * g.kw));
    }
}
#undef REPLICA_GRID_LOOP_AS
} // namespace kernels

namespace detail {
// f(I{}) with I = 32-bit where count < 2^31 (the grid-stride index cannot wrap), else 64-bit.
template <class F>
void indexed(std::size_t count, F&& f)
{
    if (count < (std::size_t{1} << 31)) f(std::uint32_t{});
    else f(std::size_t{});
}
} // namespace detail

template <core::Window g>
void max_pool_forward(const Context& ctx, const float* x, float* y, float* arg, std::size_t n)
{
    const std::size_t count = n * g.c * g.oh * g.ow;
    detail::indexed(count, [&](auto index) {
        using I = decltype(index);
        kernels::max_pool_forward<I, REPLICA_WINDOW_INTS(g)><<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(x, y, arg, I(count));
    });
    detail::check_launch("max_pool_forward");
}
template <core::Window g>
void max_pool_backward(const Context& ctx, const float* arg, const float* dy, float* dx, std::size_t n)
{
    const std::size_t count = n * g.c * g.h * g.w;
    detail::indexed(count, [&](auto index) {
        using I = decltype(index);
        kernels::max_pool_backward<I, REPLICA_WINDOW_INTS(g)><<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(arg, dy, dx, I(count));
    });
    detail::check_launch("max_pool_backward");
}
template <core::Window g>
void avg_pool_forward(const Context& ctx, const float* x, float* y, std::size_t n)
{
    const std::size_t count = n * g.c * g.oh * g.ow;
    detail::indexed(count, [&](auto index) {
        using I = decltype(index);
        kernels::avg_pool_forward<I, REPLICA_WINDOW_INTS(g)><<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(x, y, I(count));
    });
    detail::check_launch("avg_pool_forward");
}
template <core::Window g>
void avg_pool_backward(const Context& ctx, const float* dy, float* dx, std::size_t n)
{
    const std::size_t count = n * g.c * g.h * g.w;
    detail::indexed(count, [&](auto index) {
        using I = decltype(index);
        kernels::avg_pool_backward<I, REPLICA_WINDOW_INTS(g)><<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(dy, dx, I(count));
    });
    detail::check_launch("avg_pool_backward");
}

} // namespace replica::backend::cuda
