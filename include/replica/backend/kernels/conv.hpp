#pragma once
// The convolution family (layers/conv.hpp; what every family shares: kernels/kernels.hpp), templates
// on the window g (core::Window), called as conv_forward<g>(ctx, ...).
//
// A convolution maps x (n, g.c, g.h, g.w) to y (n, cout, g.oh, g.ow) with weights w (cout, g.c,
// g.kh, g.kw) and bias b (cout). A transposed convolution is the adjoint of the convolution whose
// window g runs over ITS output: x (n, c, g.oh, g.ow) to y (n, g.c, g.h, g.w), weights w (c, g.c,
// g.kh, g.kw) (PyTorch's layouts). x, y, w, the gradients of x and y, relu_y and dz are of the
// model's element type T, activations in the context's layout; b, dw, db and scratch are float. The
// arithmetic is float (on a GPU: bf16 and fp16 on tensor cores, float on TF32 ones where
// cuda::Options::allow_tf32), each stored T value rounded once, after the bias, the ReLU and the input
// gradient's sums. A null b (and then a null db) is a
// convolution without bias. `scratch` is context memory of at least the op's *_scratch_size floats,
// the op's own for the call (nothing in it is kept or read from before).

#include <concepts>
#include <cstddef>

#include "replica/core/config.hpp"
#include "replica/core/number.hpp"
#include "replica/core/window.hpp"

namespace REPLICA_NAMESPACE::backend::kernels {

// The family for activations of type T and the window g. The scratch sizes are host work; the
// passes are queued.
template <class C, class T, core::Window g>
concept ConvKernelsFor = core::Storage<T> &&
    requires(const C& ctx, int cout, int c, const T* w, const float* b, const T* x, T* y, const T* relu_y,
             const T* dy, T* dz, T* dx, float* dw, float* db, std::size_t n, float* scratch, bool relu,
             bool accumulate) {
        // Floats of scratch the convolution's passes need for n samples of cout output channels.
        { conv_scratch_size<g, T>(ctx, cout, n) } -> std::same_as<std::size_t>;
        // y = the convolution of x with w, plus b, then max(y, 0) when relu (the ReLU after the layer,
        // fused: its output, the same bits as relu_forward's).
        conv_forward<g>(ctx, cout, w, b, x, y, n, scratch, relu);
        // dw and db assigned. dx assigned, or with accumulate the input gradient added to it (summed
        // in float onto dx's values, rounded once: a Residual's identity shortcut), or nothing where
        // dx is null.
        conv_backward<g>(ctx, cout, w, x, dy, dx, dw, db, n, scratch, accumulate);
        // The backward of the convolution and the ReLU after it: relu_y and dy are the ReLU's output
        // and its gradient; dz (n, cout, g.oh, g.ow) = relu_backward(relu_y, dy), then conv_backward
        // from dz.
        conv_backward_relu<g>(ctx, cout, w, x, relu_y, dy, dz, dx, dw, db, n, scratch, accumulate);
        // Floats of scratch the transposed convolution's passes need for n samples of c input channels.
        { conv_transpose_scratch_size<g, T>(ctx, c, n) } -> std::same_as<std::size_t>;
        // y = the transposed convolution of x with w, plus b.
        conv_transpose_forward<g>(ctx, c, w, b, x, y, n, scratch);
        // dw and db assigned; dx assigned, or nothing where dx is null.
        conv_transpose_backward<g>(ctx, c, w, x, dy, dx, dw, db, n, scratch);
    };

// The family for every element type of activations, checked with two windows (the contract holds
// for every window a layer builds): a 5x5 convolution of one channel, which a GPU runs channels
// first (backend/layout_rules.hpp), and a strided, padded 3x3 convolution of 64 channels.
template <class C>
concept ConvKernels = ConvKernelsFor<C, float, core::Window{1, 28, 28, 5, 5, 1, 1, 0, 0, 24, 24}> &&
                      ConvKernelsFor<C, core::bf16, core::Window{1, 28, 28, 5, 5, 1, 1, 0, 0, 24, 24}> &&
                      ConvKernelsFor<C, core::fp16, core::Window{1, 28, 28, 5, 5, 1, 1, 0, 0, 24, 24}> &&
                      ConvKernelsFor<C, float, core::Window{64, 16, 16, 3, 3, 2, 2, 1, 1, 8, 8}> &&
                      ConvKernelsFor<C, core::bf16, core::Window{64, 16, 16, 3, 3, 2, 2, 1, 1, 8, 8}> &&
                      ConvKernelsFor<C, core::fp16, core::Window{64, 16, 16, 3, 3, 2, 2, 1, 1, 8, 8}>;

} // namespace replica::backend::kernels
