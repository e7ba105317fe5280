#pragma once
// The fully connected family (layers/linear.hpp; what every family shares: kernels/kernels.hpp):
// y (n, out) = x (n, in) W^T + b, W (out, in) row-major. x, y, w and the gradients of x and y are of
// the model's element type T, flat (no layout); b, dw and db are float. The products run in float
// (FP32 products on a GPU; bf16 and fp16 on tensor cores), each stored T value rounded once, after
// the bias and the ReLU. For bf16 and fp16 the bias added is b rounded to T (cuBLASLt's epilogues read
// a bias of the output's type, and PyTorch's autocast casts it so); its gradient db stays a float sum.
// b null: no bias (then db null too: TiedHead's product).

#include <concepts>
#include <cstddef>

#include "replica/core/config.hpp"
#include "replica/core/number.hpp"

namespace REPLICA_NAMESPACE::backend::kernels {

// The family for activations of type T. All ops are queued.
template <class C, class T>
concept LinearKernelsFor = core::Storage<T> &&
    requires(const C& ctx, int in, int out, const T* w, const float* b, const T* x, T* y, const T* relu_y,
             const T* dy, T* dz, T* dx, float* dw, float* db, std::size_t n, bool relu) {
        // y = x W^T + b, then max(y, 0) when relu (the ReLU after the layer, fused: its output, the
        // same bits as relu_forward's).
        linear_forward(ctx, in, out, w, b, x, y, n);
        linear_forward(ctx, in, out, w, b, x, y, n, relu);
        // y = x W^T + b + addend (n, out: relu_y's place), then max(y, 0) when relu: the addend added
        // in float before the one rounding (a Residual's other branch, in the layer's pass).
        linear_forward_add(ctx, in, out, w, b, x, relu_y, y, n);
        linear_forward_add(ctx, in, out, w, b, x, relu_y, y, n, relu);
        // y as linear_forward writes it, and dz (n, out) = the tanh form of GELU of it (the GELU after the
        // layer, in the product's epilogue where a backend fuses them: GELU of the float values before
        // y's rounding; otherwise gelu_tanh_forward of y). Each stored value rounded once.
        linear_forward_gelu(ctx, in, out, w, b, x, y, dz, n);
        // dw (out, in) = dy^T x and db (out) = the sum of dy's rows, assigned; dx (n, in) = dy W,
        // assigned, or nothing where dx is null.
        linear_backward(ctx, in, out, w, x, dy, dx, dw, db, n);
        // The backward of the layer and the ReLU after it: relu_y and dy are the ReLU's output and its
        // gradient; dz (n, out) = relu_backward(relu_y, dy), then linear_backward from dz.
        linear_backward_relu(ctx, in, out, w, x, relu_y, dy, dz, dx, dw, db, n);
    };

// The family for every element type of activations.
template <class C>
concept LinearKernels = LinearKernelsFor<C, float> && LinearKernelsFor<C, core::bf16> && LinearKernelsFor<C, core::fp16>;

} // namespace replica::backend::kernels
