#pragma once
// The interface every way of running a convolution implements (a candidate: conv/cudnn.hpp,
// conv/products.hpp, conv/direct.hpp), and what their passes read and write. The autotuner
// (conv/autotune.hpp) chooses one candidate per pass and layer; conv.hpp runs the choice.
//
// A candidate C for window g (x (n, g.c, g.h, g.w), w (cout, g.c, g.kh, g.kw), b (cout) or null
// for a convolution without bias, y (n, cout, g.oh, g.ow)) provides, all queued on the context's
// compute stream:
//   C::forward(ctx, plan, ConvForward)    y = the convolution of x by w, plus b, then the ReLU if relu
//   C::backward(ctx, plan, ConvBackward)  dw assigned, db assigned where not null (null exactly when
//                                         b was), dx assigned where not null
// and is prepared and measured by the autotuner through its own plan and time functions (cuDNN's
// descriptors and algorithms, cudnn_plan; the products' seconds, ProductConv::time; the direct
// kernels are taken by a rule on the shape, DirectConv, and not timed). `plan` is the layer's
// ConvPlan, or null where a candidate is taken before any plan is made (the direct forward).
// Only under nvcc.

#include <concepts>
#include <cstddef>

#include "replica/backend/cuda/context.hpp"

namespace replica::backend::cuda {

// Seconds per call of a convolution's forward pass and of its backward (both gradients).
struct PassSeconds {
    double forward = 0.0, backward = 0.0;
};

// One forward pass of a convolution layer over n samples.
struct ConvForward {
    int cout;
    const float* w;
    const float* b;
    const float* x;
    float* y;
    std::size_t n;
    bool relu;   // the ReLU after the layer is applied too (y is its output)
};

// One backward pass. Without relu_y, dy is the output's gradient and dz is scratch the candidate may
// not need (null allowed). With relu_y (the output of the ReLU after the layer), dy is the ReLU's
// output gradient and dz (n, cout, g.oh, g.ow) receives the layer output's gradient (a candidate may
// leave it pixel-major: only the candidate reads it). scratch: conv_scratch_size floats.
struct ConvBackward {
    int cout;
    const float* w;
    const float* x;
    const float* relu_y;
    const float* dy;
    float* dz;
    float* dx;
    float* dw;
    float* db;
    std::size_t n;
    float* scratch;
};

template <class C>
concept ConvCandidate = requires(const Context& ctx, const ConvPlan* plan, const ConvForward& f, const ConvBackward& b) {
    C::forward(ctx, plan, f);
    C::backward(ctx, plan, b);
};

} // namespace replica::backend::cuda
