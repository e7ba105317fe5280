#pragma once
// Fully connected layer on the CPU: y (n, out) = x (n, in) W^T + b, W (out, in).
//
// x, y, dy, dx and the weights w are T (core::Storage); b, dw, db are float, b and db null for a product
// without a bias. For bf16/fp16 the T operands, and the bias rounded to T (as the GPU's epilogue reads
// it: backend/kernels/linear.hpp), are converted to float in the context's workspace (the layer passes
// no scratch), the float products run on them as for float, and each stored output is rounded once,
// after the bias and the ReLU: bit for bit round_through<T> of the float call on the same (T-valued)
// inputs.

#include <concepts>
#include <cstddef>
#include <cstring>
#include <type_traits>

#include "replica/backend/cpu/context.hpp"
#include "replica/backend/cpu/elementwise.hpp"
#include "replica/backend/cpu/ops.hpp"
#include "replica/core/config.hpp"
#include "replica/core/number.hpp"

namespace REPLICA_NAMESPACE::backend::cpu {

namespace detail {
// A 16-bit product's float values: b (rounded to T) + x W^T (n, out), in the context's workspace.
template <core::Storage T>
float* linear_float_sums(const Context& ctx, int in, int out, const T* w, const float* b, const T* x, std::size_t n)
{
    const std::size_t nx = n * std::size_t(in), nw = std::size_t(out) * in, ny = n * std::size_t(out);
    float* xf = ctx.workspace(nx + nw + ny + (b ? std::size_t(out) : 0));
    float* wf = xf + nx;
    float* yf = wf + nw;
    float* bf = b ? yf + ny : nullptr;
    load_float(x, nx, xf);
    load_float(w, nw, wf);
    for (int j = 0; b && j < out; ++j) bf[j] = core::round_through<T>(b[j]);
    if (b)
        for (std::size_t s = 0; s < n; ++s) std::memcpy(yf + s * out, bf, sizeof(float) * out);
    gemm(false, true, int(n), out, in, 1.0f, xf, in, wf, in, b ? 1.0f : 0.0f, yf, out);
    return yf;
}
} // namespace detail

// relu: the ReLU after the layer is applied too (y is its output).
template <core::Storage T>
void linear_forward(const Context& ctx, int in, int out, const T* w, const float* b, const T* x, T* y, std::size_t n,
                    bool relu = false)
{
    if constexpr (std::same_as<T, float>) {
        if (b)
            for (std::size_t s = 0; s < n; ++s) std::memcpy(y + s * out, b, sizeof(float) * out);
        gemm(false, true, int(n), out, in, 1.0f, x, in, w, in, b ? 1.0f : 0.0f, y, out);
        if (relu) relu_forward(ctx, y, y, n * std::size_t(out));
    } else {
        float* yf = detail::linear_float_sums(ctx, in, out, w, b, x, n);
        if (relu) relu_forward(ctx, yf, yf, n * std::size_t(out));
        store_float(yf, n * std::size_t(out), y);
    }
}

// y = x W^T + b + addend (n, out), then the ReLU when relu: linear_forward's values with the addend
// added before the one rounding (backend/kernels/linear.hpp). In float the addend is added to the
// layer's output, as add_into adds a Residual's branches: the same bits as the two passes.
template <core::Storage T>
void linear_forward_add(const Context& ctx, int in, int out, const T* w, const float* b, const T* x,
                        const std::type_identity_t<T>* addend, T* y, std::size_t n, bool relu = false)
{
    const std::size_t ny = n * std::size_t(out);
    if constexpr (std::same_as<T, float>) {
        linear_forward(ctx, in, out, w, b, x, y, n);
        add_into(ctx, static_cast<const float*>(y), addend, y, ny, relu);
    } else {
        const float* yf = detail::linear_float_sums(ctx, in, out, w, b, x, n);
        for (std::size_t i = 0; i < ny; ++i) {
            const float v = yf[i] + core::to_float(addend[i]);
            y[i] = core::from_float<T>(relu && v < 0.0f ? 0.0f : v);
        }
    }
}

// linear_forward into y, then the tanh form of GELU of y into activated (the contract's unfused form:
// backend/kernels/linear.hpp).
template <core::Storage T>
void linear_forward_gelu(const Context& ctx, int in, int out, const T* w, const float* b, const T* x, T* y,
                         std::type_identity_t<T>* activated, std::size_t n)
{
    linear_forward(ctx, in, out, w, b, x, y, n);
    gelu_tanh_forward(ctx, static_cast<const T*>(y), activated, n * std::size_t(out));
}

// dw, db (null without a bias) assigned; dx (may be null) assigned.
template <core::Storage T>
void linear_backward(const Context& ctx, int in, int out, const T* w, const T* x, const T* dy,
                     std::type_identity_t<T>* dx, float* dw, float* db, std::size_t n)
{
    if constexpr (std::same_as<T, float>) {
        gemm(true, false, out, in, int(n), 1.0f, dy, out, x, in, 0.0f, dw, in);
        if (db) sum_rows(dy, int(n), out, db, false);
        if (dx) gemm(false, false, int(n), in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
    } else {
        const std::size_t nx = n * std::size_t(in), ndy = n * std::size_t(out), nw = std::size_t(out) * in;
        float* xf = ctx.workspace(nx + ndy + (dx ? nw : 0));
        float* dyf = xf + nx;
        load_float(x, nx, xf);
        load_float(dy, ndy, dyf);
        gemm(true, false, out, in, int(n), 1.0f, dyf, out, xf, in, 0.0f, dw, in);
        if (db) sum_rows(dyf, int(n), out, db, false);
        if (dx) {
            float* wf = dyf + ndy;
            load_float(w, nw, wf);
            float* dxf = xf;   // x is no longer needed
            gemm(false, false, int(n), in, out, 1.0f, dyf, out, wf, in, 0.0f, dxf, in);
            store_float(dxf, nx, dx);
        }
    }
}

// The backward of the layer and the ReLU after it: relu_y and dy are the ReLU's output and its
// gradient; dz receives the layer output's gradient.
template <core::Storage T>
void linear_backward_relu(const Context& ctx, int in, int out, const T* w, const T* x, const T* relu_y, const T* dy,
                          T* dz, std::type_identity_t<T>* dx, float* dw, float* db, std::size_t n)
{
    relu_backward(ctx, relu_y, dy, dz, n * std::size_t(out));
    linear_backward(ctx, in, out, w, x, dz, dx, dw, db, n);
}

} // namespace replica::backend::cpu
