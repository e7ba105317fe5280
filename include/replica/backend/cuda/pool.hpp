#pragma once
// Pooling on the GPU, with the CPU backend's exact rules (ceil mode, padding ignored by max, counted
// as zeros by average). Max pooling records each maximum's position; backward gathers: each input
// element sums the gradients of the windows that picked it, so no atomics and the same result every
// run. The kernels are templates on the window, so that their index arithmetic divides by constants
// (a 64-bit division by a value known only at run time costs dozens of instructions), and on the
// index type, 32-bit where it fits, with windows unrolled, and on the layout (Last: channels-last,
// layout.hpp; a thread then takes V neighbouring channels of a pixel, neighbouring threads
// neighbouring channels: V = 8, one 16-byte move of 16-bit values, where the channels are a multiple
// of 8 and the buffers aligned for it, else 1). Each channel is computed as with V = 1, the same
// comparisons and sums in the same order: the same bits.
// x, y, dy, dx are activations of one type T (float, bf16, fp16), read as float, summed in float, each output rounded once; the maxima's
// positions (arg) are positions within their windows, core::pool_position_t<g> (a byte for windows of
// up to 255 elements), core::pool_no_position<g> where a window has no element above -inf.

#include <cstddef>
#include <type_traits>

#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/launch.hpp"
#include "replica/backend/cuda/layout.hpp"
#include "replica/backend/cuda/packed.hpp"
#include "replica/core/config.hpp"
#include "replica/core/window.hpp"

namespace REPLICA_NAMESPACE::backend::cuda {

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

// f(pointer, position in the window) for every input element of output element i's window (padding
// skipped), rows then columns; with channels-last activations, the pointer is to channel ch of the
// element and the next V - 1 channels follow it.
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
            if (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w) f(element<Last, I>(xp, g, iy * g.w + ix), a * g.kw + b);
        }
}

// V values at p as floats (through the read-only data cache where V = 1); store_v stores them.
template <int V, core::Storage T>
__device__ inline void load_lanes(const T* p, float (&v)[8])
{
    if constexpr (V == 1) v[0] = load_ldg(p);
    else load_v<V>(p, v);
}
// V positions at p, and V positions stored there: one 8-byte move where V = 8 and they are bytes.
template <int V, class P>
__device__ inline void load_positions(const P* p, int (&at)[V])
{
    if constexpr (V == 8 && sizeof(P) == 1) {
        const uint2 r = *reinterpret_cast<const uint2*>(p);
#pragma unroll
        for (int l = 0; l < 8; ++l) at[l] = int(((l < 4 ? r.x : r.y) >> (8 * (l % 4))) & 0xffu);
    } else {
#pragma unroll
        for (int l = 0; l < V; ++l) at[l] = int(__ldg(p + l));
    }
}
template <int V, class P>
__device__ inline void store_positions(P* p, const P (&at)[V])
{
    if constexpr (V == 8 && sizeof(P) == 1) {
        unsigned w[2] = {0u, 0u};
#pragma unroll
        for (int l = 0; l < 8; ++l) w[l / 4] |= unsigned(at[l]) << (8 * (l % 4));
        *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
    } else {
#pragma unroll
        for (int l = 0; l < V; ++l) p[l] = at[l];
    }
}

// P: core::pool_position_t<g> (a parameter of its own: nvcc cannot name it from G... in the signature).
// A thread takes V channels of output element i * V; count = outputs / V.
template <bool Last, int V, class I, core::Storage T, class P, int... G>
__global__ void max_pool_forward(const T* x, T* y, P* arg, I count)
{
    constexpr core::Window g{G...};
    static_assert(std::is_same_v<P, core::pool_position_t<g>>);
    static_assert(V == 1 || Last, "several channels a thread: channels-last only");
    REPLICA_GRID_LOOP_AS(I, i, count)
    {
        float best[8];
        int at[V];
#pragma unroll
        for (int l = 0; l < V; ++l) best[l] = -INFINITY, at[l] = -1;
        for_window<Last>(g, x, i * I(V), [&](const T* p, int k) {
            float v[8];
            load_lanes<V>(p, v);
#pragma unroll
            for (int l = 0; l < V; ++l)
                if (v[l] > best[l]) {   // strict: the first maximum in scan order wins
                    best[l] = v[l];
                    at[l] = k;
                }
        });
        store_v<V>(y + i * I(V), best);
        P positions[V];
#pragma unroll
        for (int l = 0; l < V; ++l) positions[l] = at[l] < 0 ? core::pool_no_position<g> : P(at[l]);
        store_positions<V>(arg + i * I(V), positions);
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
// one. Each element's sum keeps its order, so the bits are those of one element a thread. Along an
// axis the tile is `stride` elements (2 at stride 1, 1 on an axis of one element, at most 4).
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
// neighbouring threads take one tile of V neighbouring channels each).
template <bool Last, int V, class I, class TileOp>
__device__ inline void for_tiles(const core::Window& g, I count, TileOp&& op)
{
    const int ty = tile_of(g.h, g.sh), tx = tile_of(g.w, g.sw);
    const int across = (g.w + tx - 1) / tx, tiles = (g.h + ty - 1) / ty * across;
    REPLICA_GRID_LOOP_AS(I, i, count)
    {
        if constexpr (Last) {
            const I first = i * I(V), rest = first / I(g.c);
            const int ch = int(first - rest * I(g.c));
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

// The windows that cover the tile at (y0, x0), clipped to those that exist: read(oy, ox, offset in
// the output plane) for each, rows then columns (at most NY x NX of them).
template <int NY, int NX, class Read>
__device__ inline void for_tile_windows(const core::Window& g, int y0, int x0, Read&& read)
{
    const int ty = tile_of(g.h, g.sh), tx = tile_of(g.w, g.sw);
    int ylo, xlo, yhi, xhi, unused;
    covering(y0, g.kh, g.sh, g.ph, g.oh, ylo, unused);
    covering(min(y0 + ty, g.h) - 1, g.kh, g.sh, g.ph, g.oh, unused, yhi);
    covering(x0, g.kw, g.sw, g.pw, g.ow, xlo, unused);
    covering(min(x0 + tx, g.w) - 1, g.kw, g.sw, g.pw, g.ow, unused, xhi);
#pragma unroll
    for (int r = 0; r < NY; ++r)
#pragma unroll
        for (int c = 0; c < NX; ++c)
            if (ylo + r < yhi && xlo + c < xhi) read(ylo + r, xlo + c, (ylo + r) * g.ow + xlo + c);
}

// A tile's sums, V channels of each of its TY x TX elements, from zero: s[a * TX + b][l] for the
// element at (a, b) and channel l.
template <int TY, int TX, int V>
struct TileSums {
    float s[TY * TX][8];
    __device__ TileSums()
    {
#pragma unroll
        for (int e = 0; e < TY * TX; ++e)
#pragma unroll
            for (int l = 0; l < V; ++l) s[e][l] = 0.0f;
    }
    // d[l] added to the sum of channel l of the element at (a, b) where take(a, b, l).
    template <class Take>
    __device__ void add(const float (&d)[8], Take&& take)
    {
#pragma unroll
        for (int a = 0; a < TY; ++a)
#pragma unroll
            for (int b = 0; b < TX; ++b)
#pragma unroll
                for (int l = 0; l < V; ++l)
                    if (take(a, b, l)) s[a * TX + b][l] += d[l];
    }
    // The sums (times `scale`) of the elements of the tile at (y0, x0) that lie in the plane, each
    // at its place in dx.
    template <bool Last, class I, core::Storage T>
    __device__ void store(const core::Window& g, T* dxp, int y0, int x0, float scale)
    {
#pragma unroll
        for (int a = 0; a < TY; ++a)
#pragma unroll
            for (int b = 0; b < TX; ++b)
                if (y0 + a < g.h && x0 + b < g.w) {
                    float v[8];
#pragma unroll
                    for (int l = 0; l < V; ++l) v[l] = s[a * TX + b][l] * scale;
                    store_v<V>(element<Last, I>(dxp, g, (y0 + a) * g.w + x0 + b), v);
                }
    }
};

template <bool Last, int V, class I, core::Storage T, class P, int... G>
__global__ void max_pool_backward(const P* arg, const T* dy, T* dx, I count)
{
    constexpr core::Window g{G...};
    static_assert(std::is_same_v<P, core::pool_position_t<g>>);
    constexpr int TY = tile_of(g.h, g.sh), TX = tile_of(g.w, g.sw);
    constexpr int NY = windows_of(TY, g.kh, g.sh, g.oh), NX = windows_of(TX, g.kw, g.sw, g.ow);
    for_tiles<Last, V>(g, count, [&](I out, I in, int y0, int x0) {
        TileSums<TY, TX, V> sums;
        for_tile_windows<NY, NX>(g, y0, x0, [&](int oy, int ox, int o) {
            int at[V];   // each channel's maximum as an offset in the input plane, or -1
            load_positions<V>(element<Last, I>(arg + out, g, o), at);
#pragma unroll
            for (int l = 0; l < V; ++l)
                at[l] = at[l] == int(core::pool_no_position<g>) ? -1 : core::pool_input_offset(g, oy, ox, at[l]);
            float d[8];
            load_lanes<V>(element<Last, I>(dy + out, g, o), d);
            // A window whose maximum is an element covers it: no range test needed.
            sums.add(d, [&](int a, int b, int l) { return at[l] == (y0 + a) * g.w + x0 + b; });
        });
        sums.template store<Last, I>(g, dx + in, y0, x0, 1.0f);
    });
}

template <bool Last, int V, class I, core::Storage T, int... G>
__global__ void avg_pool_forward(const T* x, T* y, I count)
{
    constexpr core::Window g{G...};
    REPLICA_GRID_LOOP_AS(I, i, count)
    {
        float s[8];
#pragma unroll
        for (int l = 0; l < V; ++l) s[l] = 0.0f;
        for_window<Last>(g, x, i * I(V), [&](const T* p, int) {
            float v[8];
            load_lanes<V>(p, v);
#pragma unroll
            for (int l = 0; l < V; ++l) s[l] += v[l];
        });
#pragma unroll
        for (int l = 0; l < V; ++l) s[l] *= 1.0f / float(g.kh * g.kw);
        store_v<V>(y + i * I(V), s);
    }
}

template <bool Last, int V, class I, core::Storage T, int... G>
__global__ void avg_pool_backward(const T* dy, T* dx, I count)
{
    constexpr core::Window g{G...};
    constexpr int TY = tile_of(g.h, g.sh), TX = tile_of(g.w, g.sw);
    constexpr int NY = windows_of(TY, g.kh, g.sh, g.oh), NX = windows_of(TX, g.kw, g.sw, g.ow);
    for_tiles<Last, V>(g, count, [&](I out, I in, int y0, int x0) {
        int rlo[TY], rhi[TY], clo[TX], chi[TX];   // the windows that cover each row and column of the tile
#pragma unroll
        for (int a = 0; a < TY; ++a) covering(y0 + a, g.kh, g.sh, g.ph, g.oh, rlo[a], rhi[a]);
#pragma unroll
        for (int b = 0; b < TX; ++b) covering(x0 + b, g.kw, g.sw, g.pw, g.ow, clo[b], chi[b]);
        TileSums<TY, TX, V> sums;
        for_tile_windows<NY, NX>(g, y0, x0, [&](int oy, int ox, int o) {
            float d[8];
            load_lanes<V>(element<Last, I>(dy + out, g, o), d);
            sums.add(d, [&](int a, int b, int) { return oy >= rlo[a] && oy < rhi[a] && ox >= clo[b] && ox < chi[b]; });
        });
        sums.template store<Last, I>(g, dx + in, y0, x0, 1.0f / float(g.kh * g.kw));
    });
}
} // namespace kernels

namespace detail {
// f(Last, V, I{}): the context's layout for T as a compile-time bool, the channels a thread takes
// (8 on channels-last activations of a multiple of 8 channels whose buffers are 16-byte aligned,
// else 1) and the index type for count values.
template <core::Storage T, class F, class... P>
void with_layout(const Context& ctx, const core::Window& g, std::size_t count, F&& f, const P*... buffers)
{
    indexed(count, [&](auto index) {
        by_layout<T>(ctx, [&](auto last) {
            if constexpr (decltype(last)::value)
                if (g.c % 8 == 0 && quad_aligned(buffers...)) return f(last, std::integral_constant<int, 8>{}, index);
            f(last, std::integral_constant<int, 1>{}, index);
        });
    });
}

// Backward threads per input plane: one per tile (kernels::tile_of).
constexpr std::size_t tiles(const core::Window& g)
{
    const int ty = kernels::tile_of(g.h, g.sh), tx = kernels::tile_of(g.w, g.sw);
    return std::size_t((g.h + ty - 1) / ty) * std::size_t((g.w + tx - 1) / tx);
}
} // namespace detail

// Each launches count / V threads (detail::with_layout, whose alignment test covers every buffer the
// lanes move through, the maxima's positions included).
template <core::Window g, core::Storage T>
void max_pool_forward(const Context& ctx, const T* x, T* y, core::pool_position_t<g>* arg, std::size_t n)
{
    const std::size_t count = n * g.c * g.oh * g.ow;
    detail::with_layout<T>(ctx, g, count, [&](auto last, auto lanes, auto index) {
        using I = decltype(index);
        constexpr int V = decltype(lanes)::value;
        kernels::max_pool_forward<decltype(last)::value, V, I, T, core::pool_position_t<g>, REPLICA_WINDOW_INTS(g)>
            <<<detail::blocks_for(count / V), detail::kThreads, 0, ctx.stream()>>>(x, y, arg, I(count / V));
    }, x, y, arg);
    detail::check_launch("max_pool_forward");
}
template <core::Window g, core::Storage T>
void max_pool_backward(const Context& ctx, const core::pool_position_t<g>* arg, const T* dy, T* dx, std::size_t n)
{
    const std::size_t count = n * g.c * detail::tiles(g);
    detail::with_layout<T>(ctx, g, count, [&](auto last, auto lanes, auto index) {
        using I = decltype(index);
        constexpr int V = decltype(lanes)::value;
        kernels::max_pool_backward<decltype(last)::value, V, I, T, core::pool_position_t<g>, REPLICA_WINDOW_INTS(g)>
            <<<detail::blocks_for(count / V), detail::kThreads, 0, ctx.stream()>>>(arg, dy, dx, I(count / V));
    }, arg, dy, dx);
    detail::check_launch("max_pool_backward");
}
template <core::Window g, core::Storage T>
void avg_pool_forward(const Context& ctx, const T* x, T* y, std::size_t n)
{
    const std::size_t count = n * g.c * g.oh * g.ow;
    detail::with_layout<T>(ctx, g, count, [&](auto last, auto lanes, auto index) {
        using I = decltype(index);
        constexpr int V = decltype(lanes)::value;
        kernels::avg_pool_forward<decltype(last)::value, V, I, T, REPLICA_WINDOW_INTS(g)>
            <<<detail::blocks_for(count / V), detail::kThreads, 0, ctx.stream()>>>(x, y, I(count / V));
    }, x, y);
    detail::check_launch("avg_pool_forward");
}
template <core::Window g, core::Storage T>
void avg_pool_backward(const Context& ctx, const T* dy, T* dx, std::size_t n)
{
    const std::size_t count = n * g.c * detail::tiles(g);
    detail::with_layout<T>(ctx, g, count, [&](auto last, auto lanes, auto index) {
        using I = decltype(index);
        constexpr int V = decltype(lanes)::value;
        kernels::avg_pool_backward<decltype(last)::value, V, I, T, REPLICA_WINDOW_INTS(g)>
            <<<detail::blocks_for(count / V), detail::kThreads, 0, ctx.stream()>>>(dy, dx, I(count / V));
    }, dy, dx);
    detail::check_launch("avg_pool_backward");
}

} // namespace replica::backend::cuda
