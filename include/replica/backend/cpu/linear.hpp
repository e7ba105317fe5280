#pragma once
// Fully connected layer on the CPU: y (n, out) = x (n, in) W^T + b, W (out, in).

#include <cstddef>

#include "replica/backend/cpu/context.hpp"
#include "replica/backend/cpu/ops.hpp"

namespace replica::backend::cpu {

inline void linear_forward(const Context&, int in, int out, const float* w, const float* b, const float* x,
                           float* y, std::size_t n)
{
    for (std::size_t s = 0; s < n; ++s) std::memcpy(y + s * out, b, sizeof(float) * out);
    gemm(false, true, int(n), out, in, 1.0f, x, in, w, in, 1.0f, y, out);
}

// dw, db assigned; dx (may be null) assigned.
inline void linear_backward(const Context&, int in, int out, const float* w, const float* x, const float* dy,
                            float* dx, float* dw, float* db, std::size_t n)
{
    gemm(true, false, out, in, int(n), 1.0f, dy, out, x, in, 0.0f, dw, in);
    sum_rows(dy, int(n), out, db, false);
    if (dx) gemm(false, false, int(n), in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
}

} // namespace replica::backend::cpu
