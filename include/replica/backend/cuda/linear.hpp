#pragma once
// Fully connected layer on the GPU through cuBLAS (column-major: a row-major (r, c) matrix is a
// column-major (c, r) one). y (n, out) = x (n, in) W^T + b, W (out, in).

#include <cublas_v2.h>

#include <cstddef>

#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/launch.hpp"

namespace replica::backend::cuda {

namespace kernels {
__global__ void broadcast_rows(const float* b, float* y, std::size_t out, std::size_t count)
{
    REPLICA_GRID_LOOP(i, count) y[i] = b[i % out];
}
} // namespace kernels

inline void linear_forward(const Context& ctx, int in, int out, const float* w, const float* b, const float* x, float* y,
                           std::size_t n)
{
    const std::size_t count = n * std::size_t(out);
    kernels::broadcast_rows<<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(b, y, std::size_t(out), count);
    detail::check_launch("broadcast_rows");
    const float one = 1.0f;
    // y^T (out, n) += W (out, in) x^T (in, n)
    REPLICA_CHECK(cublasSgemm(ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, out, int(n), in, &one, w, in, x, in, &one, y, out));
}

inline void linear_backward(const Context& ctx, int in, int out, const float* w, const float* x, const float* dy, float* dx,
                            float* dw, float* db, std::size_t n)
{
    const float one = 1.0f, zero = 0.0f;
    // dW^T (in, out) = x^T (in, n) dy (n, out)
    REPLICA_CHECK(cublasSgemm(ctx.cublas(), CUBLAS_OP_N, CUBLAS_OP_T, in, out, int(n), &one, x, in, dy, out, &zero, dw, in));
    // db (out) = dy^T (out, n) 1 (n)
    REPLICA_CHECK(cublasSgemv(ctx.cublas(), CUBLAS_OP_N, out, int(n), &one, dy, out, ctx.ones(n), 1, &zero, db, 1));
    // dx^T (in, n) = W^T (in, out) dy^T (out, n)
    if (dx) REPLICA_CHECK(cublasSgemm(ctx.cublas(), CUBLAS_OP_N, CUBLAS_OP_N, in, int(n), out, &one, w, in, dy, out, &zero, dx, in));
}

} // namespace replica::backend::cuda
