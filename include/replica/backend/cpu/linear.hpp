#pragma once
// Fully connected layer on the CPU: y (n, out) = x (n, in) W^T + b, W (out, in).

#include <cstddef>

#include "replica/backend/cpu/context.hpp"
#include "replica/backend/cpu/elementwise.hpp"
#include "replica/backend/cpu/ops.hpp"

namespace replica::backend::cpu {

// relu: the ReLU after the layer is applied too (y is its output).
inline void linear_forward(const Context& ctx, int in, int out, const float* w, const float* b, const float* x,
                           float* y, std::size_t n, bool relu = false)
{
    for (std::size_t s = 0; s < n; ++s) std::memcpy(y + s * out, b, sizeof(float) * out);
    gemm(false, true, int(n), out, in, 1.0f, x, in, w, in, 1.0f, y, out);
    if (relu) relu_forward(ctx, y, y, n * std::size_t(out));
}

// dw, db assigned; dx (may be null) assigned.
inline void linear_backward(const Context&, int in, int out, const float* w, const float* x, const float* dy,
                            float* dx, float* dw, float* db, std::size_t n)
{
    gemm(true, false, out, in, int(n), 1.0f, dy, out, x, in, 0.0f, dw, in);
    sum_rows(dy, int(n), out, db, false);
    if (dx) gemm(false, false, int(n), in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
}

// The backward of the layer and the ReLU after it: relu_y and dy are the ReLU's output and its
// gradient; dz receives the layer output's gradient.
inline void linear_backward_relu(const Context& ctx, int in, int out, const float* w, const float* x,
                                 const float* relu_y, const float* dy, float* dz, float* dx, float* dw, float* db,
                                 std::size_t n)
{
    relu_backward(ctx, relu_y, dy, dz, n * std::size_t(out));
    linear_backward(ctx, in, out, w, x, dz, dx, dw, db, n);
}

} // namespace replica::backend::cpu
