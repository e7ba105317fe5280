#pragma once
// Convolutions on the GPU: the layer's passes (what layers/conv.hpp calls), each run by the way the
// autotuner chose for it (conv/autotune.hpp): cuDNN's algorithms (conv/cudnn.hpp), products over the
// windows (conv/products.hpp) or our direct kernels (conv/direct.hpp), all behind one interface
// (conv/candidate.hpp). Bias gradients are our channel sums (conv/bias.hpp). A null bias b (and
// then a null bias gradient db) is a convolution without bias: nothing is added or summed for it; a
// fused ReLU, and its rule in backward, run where they would with a bias (on cuDNN's path, the pass
// that adds the bias or sums its gradient becomes a ReLU pass of its own). A transposed convolution
// runs cuDNN's adjoint passes. Only under nvcc.

#include <algorithm>
#include <cstddef>

#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/conv/autotune.hpp"
#include "replica/backend/cuda/conv/bias.hpp"
#include "replica/backend/cuda/conv/candidate.hpp"
#include "replica/backend/cuda/conv/cudnn.hpp"
#include "replica/backend/cuda/conv/direct.hpp"
#include "replica/backend/cuda/conv/products.hpp"

namespace replica::backend::cuda {

// Scratch: the bias gradient's partial sums (channel_sums), over the output's channels and pixels;
// for the direct kernels, their filter gradient's partial sums after (the larger of the two).
template <core::Window g, class T = float>
std::size_t conv_scratch_size(const Context&, int cout, std::size_t n)
{
    const std::size_t bias = std::size_t(cout) * detail::bias_parts(cout, n * g.oh * g.ow);
    if constexpr (!detail::direct_conv<g>) return bias;
    else return std::max(bias, DirectConv<g>::scratch_size(cout, n));
}
template <core::Window g, class T = float>
std::size_t conv_transpose_scratch_size(const Context&, int, std::size_t n)
{
    return std::size_t(g.c) * detail::bias_parts(g.c, n * g.h * g.w);
}

namespace detail {
template <core::Window g>
void run_backward(const Context& ctx, const ConvBackward& a)
{
    static_assert(ConvCandidate<CudnnConv<g>> && ConvCandidate<ProductConv<g>>);
    const ConvPlan& p = plan_of<g>(ctx, a.cout, a.n);
    if (p.gemm_backward) ProductConv<g>::backward(ctx, &p, a);
    else if constexpr (direct_conv<g>) DirectConv<g>::backward(ctx, &p, a);
    else CudnnConv<g>::backward(ctx, &p, a);
}
} // namespace detail

template <core::Window g>
void conv_forward(const Context& ctx, int cout, const float* w, const float* b, const float* x, float* y,
                  std::size_t n, float*, bool relu)
{
    static_assert(ConvCandidate<CudnnConv<g>> && ConvCandidate<ProductConv<g>>);
    const ConvForward a{cout, w, b, x, y, n, relu};
    if constexpr (detail::direct_conv<g>) {
        static_assert(ConvCandidate<DirectConv<g>>);
        if (DirectConv<g>::takes_forward(cout)) {   // before any plan: it needs none
            DirectConv<g>::forward(ctx, nullptr, a);
            return;
        }
    }
    const ConvPlan& p = detail::plan_of<g>(ctx, cout, n);
    if (p.gemm_forward) ProductConv<g>::forward(ctx, &p, a);
    else CudnnConv<g>::forward(ctx, &p, a);
}

template <core::Window g>
void conv_backward(const Context& ctx, int cout, const float* w, const float* x, const float* dy, float* dx,
                   float* dw, float* db, std::size_t n, float* scratch)
{
    detail::run_backward<g>(ctx, ConvBackward{cout, w, x, nullptr, dy, nullptr, dx, dw, db, n, scratch});
}

// The backward of a convolution followed by a ReLU whose output is relu_y and whose output gradient
// is dy: the ReLU's backward runs in the bias-gradient pass (without a bias, in a pass of its own;
// on the product path, in its transpose), which writes the convolution output's gradient to dz
// (n x cout x oh x ow).
template <core::Window g>
void conv_backward_relu(const Context& ctx, int cout, const float* w, const float* x, const float* relu_y,
                        const float* dy, float* dz, float* dx, float* dw, float* db, std::size_t n, float* scratch)
{
    detail::run_backward<g>(ctx, ConvBackward{cout, w, x, relu_y, dy, dz, dx, dw, db, n, scratch});
}

// Window g maps the transposed convolution's OUTPUT (g.c = cout channels, g.h x g.w) to its input
// (c channels, g.oh x g.ow); the weight (c, cout, kh, kw) is that convolution's filter.
template <core::Window g>
void conv_transpose_forward(const Context& ctx, int c, const float* w, const float* b, const float* x, float* y,
                            std::size_t n, float*)
{
    CudnnConvTranspose<g>::forward(ctx, detail::conv_plan(ctx, g, c, n, ConvKey::transposed), w, b, x, y, n);
}

template <core::Window g>
void conv_transpose_backward(const Context& ctx, int c, const float* w, const float* x, const float* dy, float* dx,
                             float* dw, float* db, std::size_t n, float* scratch)
{
    CudnnConvTranspose<g>::backward(ctx, detail::conv_plan(ctx, g, c, n, ConvKey::transposed), w, x, dy, dx, dw, db, n,
                                    scratch);
}

} // namespace replica::backend::cuda
