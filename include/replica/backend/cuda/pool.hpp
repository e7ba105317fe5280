#pragma once
// Pooling on the GPU, with the CPU backend's exact rules (ceil mode, padding ignored by max, counted
// as zeros by average). Max pooling records each maximum's position; backward gathers: each input
// element sums the gradients of the windows that picked it, so no atomics and the same result every
// run. The kernels are templates on the window, so that their index arithmetic divides by constants
// (a 64-bit division by a value known only at run time costs dozens of instructions), and on the
// index type, 32-bit where it fits, with windows unrolled, and on the layout (Last: channels-last,
// layout.hpp; a thread then takes one channel of a pixel, neighbouring threads neighbouring channels).
// x, y, dy, dx are activations of one type T (float, bf16, fp16), read as float, summed in float, each output rounded once; the maxima's
// positions (arg) are positions within their windows, core::pool_position_t<g> (a byte for windows of
// up to 255 elements), core::pool_no_position<g> where a window has no element above -inf.

#include <cstddef>
#include <type_traits>

#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/launch.hpp"
#include "replica/backend/cuda/layout.hpp"
#include "replica/backend/cuda/packed.hpp"
#include "replica/core/window.hpp"

namespace replica::backend::cuda {

namespace kernels {
// Windows are walked over their full size (kh x kw, or the ceil(k/s) windows that can cover an
// input along an axis), unrolled (up to 8 per axis, so a global pooling stays small), with bounds
// tests inside: the same elements in the same order as a loop over the clipped range, so the same bits.

// Where the plane (sample, channel) of `pixels` elements starts, and the distance between its neighbouring
// elements, in either layout.
template <bool Last, class I>
__device__ inline I plane_start(const core::Window& g, I sample, int ch, int pixels)
{
    return Last ? sample * I(pixels) * I(g.c) + I(ch) : (sample * I(g.c) + I(ch)) * I(pixels);
}
// The element k elements into a plane at p: channels-last's are g.c apart (index type I);
// channels-first's are neighbours, indexed by the int k itself (an offset converted to an unsigned I
// first keeps nvcc from addressing a thread's neighbouring stores from one base).
template <bool Last, class I, class P>
__device__ inline P* element(P* p, const core::Window& g, int k)
{
    if constexpr (Last) return p + I(k) * I(g.c);
    else return p + k;
}
// Output element i of channels-last activations as (sample, channel, offset in its plane).
template <bool Last, class I>
__device__ inline void split_output(const core::Window& g, I i, I& sample, int& ch, int& o)
{
    static_assert(Last, "channels-first planes need no split");
    const I pixels = I(g.oh * g.ow);
    const I rest = i / I(g.c);
    ch = int(i - rest * I(g.c));
    sample = rest / pixels;
    o = int(rest - sample * pixels);
}

// f(value, position in the window) for every input element of output element i's window (padding
// skipped), rows then columns.
template <bool Last, class I, core::Storage T, class F>
__device__ inline void for_window(const core::Window& g, const T* x, I i, F&& f)
{
    int o;
    const T* xp;
    if constexpr (Last) {
        I sample;
        int ch;
        split_output<Last>(g, i, sample, ch, o);
        xp = x + plane_start<Last>(g, sample, ch, g.h * g.w);
    } else {   // a plane a (sample, channel): no need to tell them apart
        const I plane = i / I(g.oh * g.ow);
        o = int(i - plane * I(g.oh * g.ow));
        xp = x + plane * I(g.h * g.w);
    }
    const int y0 = o / g.ow * g.sh - g.ph, x0 = o % g.ow * g.sw - g.pw;
#pragma unroll 8
    for (int a = 0; a < g.kh; ++a)
#pragma unroll 8
        for (int b = 0; b < g.kw; ++b) {
            const int iy = y0 + a, ix = x0 + b;
            if (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w) f(load_ldg(element<Last, I>(xp, g, iy * g.w + ix)), a * g.kw + b);
        }
}

// P: core::pool_position_t<g> (a parameter of its own: nvcc cannot name it from G... in the signature).
template <bool Last, class I, core::Storage T, class P, int... G>
__global__ void max_pool_forward(const T* x, T* y, P* arg, I count)
{
    constexpr core::Window g{G...};
    static_assert(std::is_same_v<P, core::pool_position_t<g>>);
    REPLICA_GRID_LOOP_AS(I, i, count)
    {
        float best = -INFINITY;
        int at = -1;
        for_window<Last>(g, x, i, [&](float v, int k) {
            if (v > best) {   // strict: the first maximum in scan order wins
                best = v;
                at = k;
            }
        });
        y[i] = narrow<T>(best);
        arg[i] = at < 0 ? core::pool_no_position<g> : P(at);
    }
}

// Output windows [lo, hi) along one axis that contain input index i.
__device__ inline void covering(int i, int k, int s, int p, int out, int& lo, int& hi)
{
    const int top = i + p;                    // window o covers i when o*s <= top < o*s + k
    lo = top - k + 1 <= 0 ? 0 : (top - k + s) / s;
    hi = min(top / s + 1, out);
}

// Backward passes gather: each input element sums the gradients of the output windows that cover it,
// rows then columns. A thread takes a tile of neighbouring input elements, which share most of their
// windows, and reads each window's gradient (and maximum's position) once for the tile rather than
// once per element: GoogLeNet's first pool (3 x 3, stride 2), 8 reads for 4 elements instead of 8 for
// one. The sums keep their order, so the bits are those of one element a thread. Along an axis the tile is `stride` elements (2 at stride 1, 1 on an axis of one element,
// at most 4).
__host__ __device__ constexpr int tile_of(int extent, int stride)
{
    return extent == 1 ? 1 : stride < 2 ? 2 : stride > 4 ? 4 : stride;
}
// The most windows that cover some element of a tile of t elements.
__host__ __device__ constexpr int windows_of(int t, int k, int s, int out)
{
    return (t + k - 2) / s + 1 < out ? (t + k - 2) / s + 1 : out;
}

// op(where the output plane starts, where the input plane starts, y0, x0) for each tile (channels-last:
// neighbouring threads take one tile of neighbouring channels).
template <bool Last, class I, class TileOp>
__device__ inline void for_tiles(const core::Window& g, I count, TileOp&& op)
{
    const int ty = tile_of(g.h, g.sh), tx = tile_of(g.w, g.sw);
    const int across = (g.w + tx - 1) / tx, tiles = (g.h + ty - 1) / ty * across;
    REPLICA_GRID_LOOP_AS(I, i, count)
    {
        if constexpr (Last) {
            const I rest = i / I(g.c);
            const int ch = int(i - rest * I(g.c));
            const I sample = rest / I(tiles);
            const int t = int(rest - sample * I(tiles));
            op(plane_start<Last>(g, sample, ch, g.oh * g.ow), plane_start<Last>(g, sample, ch, g.h * g.w), t / across * ty,
               t % across * tx);
        } else {   // a plane a (sample, channel)
            const I plane = i / I(tiles);
            const int t = int(i - plane * I(tiles));
            op(plane * I(g.oh * g.ow), plane * I(g.h * g.w), t / across * ty, t % across * tx);
        }
    }
}

// The windows [ylo, ylo + NY) x [xlo, xlo + NX) that cover the tile at (y0, x0), clipped to those
// that exist: read(r, c, offset in the output plane) for each, rows then columns.
template <int NY, int NX, class Read>
__device__ inline void read_tile_windows(const core::Window& g, int y0, int x0, int& ylo, int& xlo, Read&& read)
{
    const int ty = tile_of(g.h, g.sh), tx = tile_of(g.w, g.sw);
    int yhi, xhi, unused;
    covering(y0, g.kh, g.sh, g.ph, g.oh, ylo, unused);
    covering(min(y0 + ty, g.h) - 1, g.kh, g.sh, g.ph, g.oh, unused, yhi);
    covering(x0, g.kw, g.sw, g.pw, g.ow, xlo, unused);
    covering(min(x0 + tx, g.w) - 1, g.kw, g.sw, g.pw, g.ow, unused, xhi);
#pragma unroll
    for (int r = 0; r < NY; ++r)
#pragma unroll
        for (int c = 0; c < NX; ++c)
            if (ylo + r < yhi && xlo + c < xhi) read(r, c, (ylo + r) * g.ow + xlo + c);
}

// f(iy, ix) for each element of the tile at (y0, x0) that lies in the plane.
template <class F>
__device__ inline void for_tile_elements(const core::Window& g, int y0, int x0, F&& f)
{
#pragma unroll
    for (int a = 0; a < tile_of(g.h, g.sh); ++a)
#pragma unroll
        for (int b = 0; b < tile_of(g.w, g.sw); ++b)
            if (y0 + a < g.h && x0 + b < g.w) f(y0 + a, x0 + b);
}

// The sum of d[r][c] over the windows (r, c) that take(r, c), rows then columns.
template <int NY, int NX, class Take>
__device__ inline float sum_windows(const float (&d)[NY][NX], Take&& take)
{
    float s = 0.0f;
#pragma unroll
    for (int r = 0; r < NY; ++r)
#pragma unroll
        for (int c = 0; c < NX; ++c)
            if (take(r, c)) s += d[r][c];
    return s;
}

template <bool Last, class I, core::Storage T, class P, int... G>
__global__ void max_pool_backward(const P* arg, const T* dy, T* dx, I count)
{
    constexpr core::Window g{G...};
    static_assert(std::is_same_v<P, core::pool_position_t<g>>);
    constexpr int NY = windows_of(tile_of(g.h, g.sh), g.kh, g.sh, g.oh), NX = windows_of(tile_of(g.w, g.sw), g.kw, g.sw, g.ow);
    for_tiles<Last>(g, count, [&](I out, I in, int y0, int x0) {
        const P* ap = arg + out;
        const T* dyp = dy + out;
        int at[NY][NX];
        float d[NY][NX];
        int ylo, xlo;
#pragma unroll
        for (int r = 0; r < NY; ++r)
#pragma unroll
            for (int c = 0; c < NX; ++c) at[r][c] = -1;
        read_tile_windows<NY, NX>(g, y0, x0, ylo, xlo, [&](int r, int c, int o) {
            const P p = __ldg(element<Last, I>(ap, g, o));
            at[r][c] = p == core::pool_no_position<g> ? -1 : core::pool_input_offset(g, ylo + r, xlo + c, p);
            d[r][c] = load_ldg(element<Last, I>(dyp, g, o));
        });
        T* dxp = dx + in;
        for_tile_elements(g, y0, x0, [&](int iy, int ix) {
            // A window whose maximum is this element covers it: no range test needed.
            *element<Last, I>(dxp, g, iy * g.w + ix) = narrow<T>(sum_windows(d, [&](int r, int c) { return at[r][c] == iy * g.w + ix; }));
        });
    });
}

template <bool Last, class I, core::Storage T, int... G>
__global__ void avg_pool_forward(const T* x, T* y, I count)
{
    constexpr core::Window g{G...};
    REPLICA_GRID_LOOP_AS(I, i, count)
    {
        float s = 0.0f;
        for_window<Last>(g, x, i, [&](float v, int) { s += v; });
        y[i] = narrow<T>(s * (1.0f / float(g.kh * g.kw)));
    }
}

template <bool Last, class I, core::Storage T, int... G>
__global__ void avg_pool_backward(const T* dy, T* dx, I count)
{
    constexpr core::Window g{G...};
    constexpr int NY = windows_of(tile_of(g.h, g.sh), g.kh, g.sh, g.oh), NX = windows_of(tile_of(g.w, g.sw), g.kw, g.sw, g.ow);
    for_tiles<Last>(g, count, [&](I out, I in, int y0, int x0) {
        const T* dyp = dy + out;
        float d[NY][NX] = {};
        int ylo, xlo;
        read_tile_windows<NY, NX>(g, y0, x0, ylo, xlo, [&](int r, int c, int o) { d[r][c] = load_ldg(element<Last, I>(dyp, g, o)); });
        T* dxp = dx + in;
        for_tile_elements(g, y0, x0, [&](int iy, int ix) {
            int rlo, rhi, clo, chi;
            covering(iy, g.kh, g.sh, g.ph, g.oh, rlo, rhi);
            covering(ix, g.kw, g.sw, g.pw, g.ow, clo, chi);
            const float s = sum_windows(d, [&](int r, int c) {
                return ylo + r >= rlo && ylo + r < rhi && xlo + c >= clo && xlo + c < chi;
            });
            *element<Last, I>(dxp, g, iy * g.w + ix) = narrow<T>(s * (1.0f / float(g.kh * g.kw)));
        });
    });
}
} // namespace kernels

namespace detail {
// f(Last, I{}): the context's layout for T as a compile-time bool, and the index type for count.
template <core::Storage T, class F>
void with_layout(const Context& ctx, std::size_t count, F&& f)
{
    indexed(count, [&](auto index) { by_layout<T>(ctx, [&](auto last) { f(last, index); }); });
}

// Backward threads per input plane: one per tile (kernels::tile_of).
constexpr std::size_t tiles(const core::Window& g)
{
    const int ty = kernels::tile_of(g.h, g.sh), tx = kernels::tile_of(g.w, g.sw);
    return std::size_t((g.h + ty - 1) / ty) * std::size_t((g.w + tx - 1) / tx);
}
} // namespace detail

template <core::Window g, core::Storage T>
void max_pool_forward(const Context& ctx, const T* x, T* y, core::pool_position_t<g>* arg, std::size_t n)
{
    const std::size_t count = n * g.c * g.oh * g.ow;
    detail::with_layout<T>(ctx, count, [&](auto last, auto index) {
        using I = decltype(index);
        kernels::max_pool_forward<decltype(last)::value, I, T, core::pool_position_t<g>, REPLICA_WINDOW_INTS(g)><<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(x, y, arg, I(count));
    });
    detail::check_launch("max_pool_forward");
}
template <core::Window g, core::Storage T>
void max_pool_backward(const Context& ctx, const core::pool_position_t<g>* arg, const T* dy, T* dx, std::size_t n)
{
    const std::size_t count = n * g.c * detail::tiles(g);
    detail::with_layout<T>(ctx, count, [&](auto last, auto index) {
        using I = decltype(index);
        kernels::max_pool_backward<decltype(last)::value, I, T, core::pool_position_t<g>, REPLICA_WINDOW_INTS(g)><<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(arg, dy, dx, I(count));
    });
    detail::check_launch("max_pool_backward");
}
template <core::Window g, core::Storage T>
void avg_pool_forward(const Context& ctx, const T* x, T* y, std::size_t n)
{
    const std::size_t count = n * g.c * g.oh * g.ow;
    detail::with_layout<T>(ctx, count, [&](auto last, auto index) {
        using I = decltype(index);
        kernels::avg_pool_forward<decltype(last)::value, I, T, REPLICA_WINDOW_INTS(g)><<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(x, y, I(count));
    });
    detail::check_launch("avg_pool_forward");
}
template <core::Window g, core::Storage T>
void avg_pool_backward(const Context& ctx, const T* dy, T* dx, std::size_t n)
{
    const std::size_t count = n * g.c * detail::tiles(g);
    detail::with_layout<T>(ctx, count, [&](auto last, auto index) {
        using I = decltype(index);
        kernels::avg_pool_backward<decltype(last)::value, I, T, REPLICA_WINDOW_INTS(g)><<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(dy, dx, I(count));
    });
    detail::check_launch("avg_pool_backward");
}

} // namespace replica::backend::cuda
