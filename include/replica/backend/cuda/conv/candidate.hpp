#pragma once
// The interface every way of running a convolution implements (a candidate: conv/cudnn.hpp,
// conv/products.hpp, conv/direct.hpp), and what their passes read and write. The autotuner
// (conv/autotune.hpp) chooses one candidate per pass and layer; conv.hpp runs the choice.
//
// A candidate C for window g (x (n, g.c, g.h, g.w), w (cout, g.c, g.kh, g.kw), b (cout) or null
// for a convolution without bias, y (n, cout, g.oh, g.ow)) and element type T (float, bf16, fp16:
// x, w, y and their gradients are T; b, dw, db and scratch float) provides, all queued on the
// context's compute stream:
//   C::forward(ctx, plan, ConvForward<T>)    y = the convolution of x by w, plus b, then the ReLU if
//                                            relu (in float, rounded to T once where a library allows)
//   C::backward(ctx, plan, ConvBackward<T>)  dw assigned, db assigned where not null (null exactly
//                                            when b was), dx assigned where not null (added to,
//                                            with `accumulate`)
// and is prepared and measured by the autotuner through its own plan and time functions (cuDNN's
// descriptors and algorithms, cudnn_plan; the products' seconds, ProductConv::time; the direct
// kernels are taken by a rule on the shape, DirectConv, and not timed). `plan` is the layer's
// ConvPlan (made for T), or null where a candidate is taken before any plan is made (the direct
// forward).
// Only under nvcc.

#include <concepts>
#include <cstddef>

#include "replica/backend/cuda/context.hpp"
#include "replica/core/config.hpp"
#include "replica/core/number.hpp"

namespace REPLICA_NAMESPACE::backend::cuda {

// Seconds per call of a convolution's forward pass and of its backward (both gradients).
struct PassSeconds {
    double forward = 0.0, backward = 0.0;
};

// One forward pass of a convolution layer over n samples.
template <core::Storage T>
struct ConvForward {
    int cout;
    const T* w;
    const float* b;
    const T* x;
    T* y;
    std::size_t n;
    bool relu;        // the ReLU after the layer is applied too (y is its output)
    float* scratch;   // conv_scratch_size<g, T> floats
};

// One backward pass. Without relu_y, dy is the output's gradient and dz is scratch the candidate may
// not need (null allowed). With relu_y (the output of the ReLU after the layer), dy is the ReLU's
// output gradient and dz (n, cout, g.oh, g.ow) receives the layer output's gradient (a candidate may
// leave it pixel-major: only the candidate reads it). scratch: conv_scratch_size<g, T> floats.
template <core::Storage T>
struct ConvBackward {
    int cout;
    const T* w;
    const T* x;
    const T* relu_y;
    const T* dy;
    T* dz;
    T* dx;
    float* dw;
    float* db;
    std::size_t n;
    float* scratch;
    bool accumulate = false;   // dx += the input gradient (in FP32 onto dx's values, rounded to T once)
};

template <class C, class T = float>
concept ConvCandidate = requires(const Context& ctx, const ConvPlan* plan, const ConvForward<T>& f, const ConvBackward<T>& b) {
    C::forward(ctx, plan, f);
    C::backward(ctx, plan, b);
};

} // namespace replica::backend::cuda
