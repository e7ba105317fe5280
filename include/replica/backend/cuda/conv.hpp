#pragma once
// Convolutions on the GPU: the layer's passes (what layers/conv.hpp calls), each run by the way the
// autotuner chose for it (conv/autotune.hpp): cuDNN's algorithms (conv/cudnn.hpp), products over the
// windows (conv/products.hpp) or our direct kernels (conv/direct.hpp), all behind one interface
// (conv/candidate.hpp). Bias gradients are our channel sums (conv/bias.hpp). A null bias b (and
// then a null bias gradient db) is a convolution without bias: nothing is added or summed for it; a
// fused ReLU, and its rule in backward, run where they would with a bias (on cuDNN's path, the pass
// that adds the bias or sums its gradient becomes a ReLU pass of its own). A transposed convolution
// runs cuDNN's adjoint passes.
//
// Element type T (float, bf16, fp16; deduced from the pointers): x, y, w, their gradients, relu_y and
// dz are T, activations in the context's layout (layout.hpp: channels-last runs cuDNN, with tensors
// and filters described NHWC and the (cout, c, kh, kw) weights reordered into scratch, or the
// products' channels-last rows); b, dw, db and scratch are float. Arithmetic is FP32 (bf16 and fp16
// on tensor cores), each stored T value rounded once where our kernels or cuBLASLt write it (cuDNN's
// own filter gradient comes out in T and is widened to dw). Plans are made and timed per T. Only under
// nvcc.

#include <algorithm>
#include <concepts>
#include <cstddef>

#include "replica/backend/layout_rules.hpp"
#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/conv/autotune.hpp"
#include "replica/backend/cuda/conv/bias.hpp"
#include "replica/backend/cuda/conv/candidate.hpp"
#include "replica/backend/cuda/conv/cudnn.hpp"
#include "replica/backend/cuda/conv/direct.hpp"
#include "replica/backend/cuda/conv/products.hpp"
#include "replica/backend/cuda/layout.hpp"
#include "replica/core/config.hpp"
#include "replica/core/number.hpp"

namespace REPLICA_NAMESPACE::backend::cuda {

// Scratch (floats): the bias gradient's partial sums (channel_sums), over the output's channels and
// pixels; for the direct kernels, their filter gradient's partial sums after (the larger of the two);
// for T other than float on cuDNN's filter gradient, that gradient in T after the bias's sums
// (CudnnConv::scratch_size).
namespace detail {
// The scratch of the candidates themselves.
template <core::Window g, core::Storage T>
std::size_t own_scratch(int cout, std::size_t n)
{
    const std::size_t bias = bias_scratch<T>(std::size_t(cout), n * g.oh * g.ow);
    const std::size_t cudnn = std::same_as<T, float> ? bias : CudnnConv<g>::template scratch_size<T>(cout, n);
    if constexpr (!direct_conv<g>) return cudnn;
    else return std::max({bias, DirectConv<g>::scratch_size(cout, n), cudnn});
}

// Whether a convolution runs channels-first although ctx keeps T channels-last
// (backend/layout_rules.hpp says where and why).
template <core::Window g, core::Storage T>
bool detours(const Context& ctx)
{
    return channels_last<T>(ctx) && detours_channels_last(g);
}

// The detour's activations in (channels, pixels), in T, after the candidates' scratch, each region
// 256-byte aligned: y (or dy, n x cout x g.oh x g.ow), then x and dx (n x g.c x g.h x g.w) unless the
// input has one channel (both layouts are then the same memory).
template <core::Window g, core::Storage T>
struct Detour {
    T *x, *dx, *y;
    static std::size_t floats(std::size_t values) { return (values * sizeof(T) + 255) / 256 * 64; }
    static constexpr std::size_t inputs = g.c == 1 ? 0 : 2;
    static std::size_t size(int cout, std::size_t n)
    {
        return floats(n * std::size_t(cout) * g.oh * g.ow) + inputs * floats(n * g.c * g.h * g.w);
    }
    Detour(float* scratch, int cout, std::size_t n)
    {
        const std::size_t in = floats(n * g.c * g.h * g.w), out = floats(n * std::size_t(cout) * g.oh * g.ow);
        float* at = scratch + (own_scratch<g, T>(cout, n) + 63) / 64 * 64;
        y = reinterpret_cast<T*>(at);
        x = reinterpret_cast<T*>(at + out);
        dx = reinterpret_cast<T*>(at + out + in);
    }
};
} // namespace detail

template <core::Window g, core::Storage T = float>
std::size_t conv_scratch_size(const Context& ctx, int cout, std::size_t n)
{
    const std::size_t own = detail::own_scratch<g, T>(cout, n);
    return detail::detours<g, T>(ctx) ? (own + 63) / 64 * 64 + detail::Detour<g, T>::size(cout, n) : own;
}
// c: the transposed convolution's input channels.
template <core::Window g, core::Storage T = float>
std::size_t conv_transpose_scratch_size(const Context&, int c, std::size_t n)
{
    if constexpr (std::same_as<T, float>) return detail::bias_scratch<T>(std::size_t(g.c), n * g.h * g.w);
    else return CudnnConvTranspose<g>::template scratch_size<T>(c, n);
}

namespace detail {
template <core::Window g, core::Storage T>
void run_direct_backward(const Context& ctx, const ConvPlan& p, const ConvBackward<T>& a)
{
    if constexpr (direct_conv<g>) DirectConv<g>::backward(ctx, &p, a);
}

template <core::Window g, core::Storage T>
void run_backward(const Context& ctx, const ConvBackward<T>& a)
{
    static_assert(ConvCandidate<CudnnConv<g>, T> && ConvCandidate<ProductConv<g>, T>);
    if (detours<g, T>(ctx)) {   // channels-first: x and dy transposed in, dx out
        const Detour<g, T> d(a.scratch, a.cout, a.n);
        const std::size_t in = std::size_t(g.h) * g.w, out = std::size_t(g.oh) * g.ow, cout = std::size_t(a.cout);
        const T* dy = a.dy;
        if (a.relu_y) {   // the ReLU's rule first, into dz (the layer's own output gradient), where it is
            relu_backward(ctx, a.relu_y, a.dy, a.dz, a.n * cout * out);
            dy = a.dz;
        }
        from_activation_layout(ctx, dy, d.y, a.n, cout, out);
        const bool one = Detour<g, T>::inputs == 0;   // one input channel: the same memory either way
        if (!one) from_activation_layout(ctx, a.x, d.x, a.n, g.c, in);
        if (a.dx && a.accumulate && !one) from_activation_layout(ctx, a.dx, d.dx, a.n, g.c, in);   // what to add to
        ConvBackward<T> first = a;
        first.x = one ? a.x : d.x;
        first.dy = d.y;
        first.relu_y = nullptr;
        first.dz = nullptr;
        first.dx = !a.dx ? nullptr : one ? a.dx : d.dx;
        run_backward<g>(ctx.channels_first(), first);
        if (a.dx && !one) to_activation_layout(ctx, d.dx, a.dx, a.n, g.c, in);
        return;
    }
    const ConvPlan& p = plan_of<g, T>(ctx, a.cout, a.n);
    if (p.gemm_backward) ProductConv<g>::backward(ctx, &p, a);
    else if (direct_conv<g> && !channels_last<T>(ctx)) run_direct_backward<g>(ctx, p, a);
    else CudnnConv<g>::backward(ctx, &p, a);
}
} // namespace detail

template <core::Window g, core::Storage T>
void conv_forward(const Context& ctx, int cout, const T* w, const float* b, const T* x, T* y, std::size_t n, float* scratch,
                  bool relu)
{
    static_assert(ConvCandidate<CudnnConv<g>, T> && ConvCandidate<ProductConv<g>, T>);
    if (detail::detours<g, T>(ctx)) {   // channels-first, x transposed in and y out
        const detail::Detour<g, T> d(scratch, cout, n);
        const bool one = detail::Detour<g, T>::inputs == 0;   // one input channel: the same memory either way
        if (!one) from_activation_layout(ctx, x, d.x, n, g.c, std::size_t(g.h) * g.w);
        conv_forward<g>(ctx.channels_first(), cout, w, b, one ? x : d.x, d.y, n, scratch, relu);
        to_activation_layout(ctx, d.y, y, n, std::size_t(cout), std::size_t(g.oh) * g.ow);
        return;
    }
    const ConvForward<T> a{cout, w, b, x, y, n, relu, scratch};
    if constexpr (detail::direct_conv<g>) {
        static_assert(ConvCandidate<DirectConv<g>, T>);
        // Before any plan: it needs none. The direct kernels read and write (channels, pixels).
        if (DirectConv<g>::takes_forward(cout) && !channels_last<T>(ctx)) {
            DirectConv<g>::forward(ctx, nullptr, a);
            return;
        }
    }
    const ConvPlan& p = detail::plan_of<g, T>(ctx, cout, n);
    if (p.gemm_forward) ProductConv<g>::forward(ctx, &p, a);
    else CudnnConv<g>::forward(ctx, &p, a);
}

// dx assigned, or with `accumulate` the input gradient added to it (for the identity shortcut of a
// Residual: model/residual.hpp).
template <core::Window g, core::Storage T>
void conv_backward(const Context& ctx, int cout, const T* w, const T* x, const T* dy, T* dx, float* dw, float* db,
                   std::size_t n, float* scratch, bool accumulate = false)
{
    detail::run_backward<g>(ctx, ConvBackward<T>{cout, w, x, nullptr, dy, nullptr, dx, dw, db, n, scratch, accumulate});
}

// The backward of a convolution followed by a ReLU whose output is relu_y and whose output gradient
// is dy: the ReLU's backward runs in the bias-gradient pass (without a bias, in a pass of its own;
// on the product path, in its transpose), which writes the convolution output's gradient to dz
// (n x cout x oh x ow).
template <core::Window g, core::Storage T>
void conv_backward_relu(const Context& ctx, int cout, const T* w, const T* x, const T* relu_y, const T* dy, T* dz, T* dx,
                        float* dw, float* db, std::size_t n, float* scratch, bool accumulate = false)
{
    detail::run_backward<g>(ctx, ConvBackward<T>{cout, w, x, relu_y, dy, dz, dx, dw, db, n, scratch, accumulate});
}

// Window g maps the transposed convolution's OUTPUT (g.c = cout channels, g.h x g.w) to its input
// (c channels, g.oh x g.ow); the weight (c, cout, kh, kw) is that convolution's filter.
template <core::Window g, core::Storage T>
void conv_transpose_forward(const Context& ctx, int c, const T* w, const float* b, const T* x, T* y, std::size_t n,
                            float* scratch)
{
    CudnnConvTranspose<g>::forward(ctx, detail::conv_plan<T>(ctx, g, c, n, ConvKey::transposed), c, w, b, x, y, n, scratch);
}

template <core::Window g, core::Storage T>
void conv_transpose_backward(const Context& ctx, int c, const T* w, const T* x, const T* dy, T* dx, float* dw, float* db,
                             std::size_t n, float* scratch)
{
    CudnnConvTranspose<g>::backward(ctx, detail::conv_plan<T>(ctx, g, c, n, ConvKey::transposed), c, w, x, dy, dx, dw, db,
                                    n, scratch);
}

} // namespace replica::backend::cuda
