#pragma once
// Fully connected layer on the GPU through cuBLASLt (column-major: a row-major (r, c) matrix is a
// column-major (c, r) one). y (n, out) = x (n, in) W^T + b, W (out, in); FP32 products (no TF32, as
// PyTorch by default). The bias, and a ReLU that follows (Chain fuses it), are added in the product's
// epilogue; the bias gradient comes from the weight gradient's epilogue (BGRADB) where cuBLASLt
// offers one for the shape, else from a GEMV. A plan per (in, out, batch size, ReLU) is made once and
// kept in the context. Algorithms: cuBLASLt's heuristic choice, or timed as a step runs them
// (Options::benchmark, timing.hpp; never in deterministic mode). With cublasSgemm, a bias pass and a
// separate ReLU, LeNet's two layers took 57 of its 190 us a step on an H200: split-K products (a
// 64 x 500 x 10 one as a GEMM and a 6 us reduction) and 1-2 us kernels between them.

#include <cublasLt.h>
#include <cublas_v2.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>

#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/elementwise.hpp"
#include "replica/backend/cuda/timing.hpp"

namespace replica::backend::cuda {

namespace detail {

// A stored column-major matrix: rows x cols, leading dimension rows.
struct Matrix {
    std::uint64_t rows, cols;
};

// Timed choices (Options::benchmark), process-wide: by kind of GPU and product.
struct MeasuredGemmKey {
    std::string device;
    std::array<std::uint64_t, 9> shape;   // A, B, D dims, op(A), op(B), epilogue, graphs
    friend bool operator<(const MeasuredGemmKey& a, const MeasuredGemmKey& b)
    {
        return a.device != b.device ? a.device < b.device : a.shape < b.shape;
    }
};
inline std::map<MeasuredGemmKey, cublasLtMatmulAlgo_t>& measured_gemm_choices()
{
    static std::map<MeasuredGemmKey, cublasLtMatmulAlgo_t> choices;
    return choices;
}

// D = alpha op(A) op(B) (+ epilogue) with its bias pointer, on the context's stream.
inline cublasStatus_t run_gemm(const Context& ctx, const Gemm& g, const float* a, const float* b, float* d,
                               const float* bias, const cublasLtMatmulAlgo_t& algo, std::size_t workspace)
{
    if (bias) {
        const cublasStatus_t s = cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
        if (s != CUBLAS_STATUS_SUCCESS) return s;
    }
    const float one = 1.0f, zero = 0.0f;
    return cublasLtMatmul(ctx.cublaslt(), g.desc, &one, a, g.a, b, g.b, &zero, d, g.d, d, g.d, &algo,
                          ctx.blas_workspace(), workspace, ctx.stream());
}

// The product op(A) op(B) -> D with `epilogue`; usable = false if cuBLASLt has no algorithm for it.
inline Gemm make_gemm(const Context& ctx, Matrix a, cublasOperation_t op_a, Matrix b, cublasOperation_t op_b, Matrix d,
                      cublasLtEpilogue_t epilogue, std::size_t bias_length)
{
    Gemm g;
    REPLICA_CHECK(cublasLtMatmulDescCreate(&g.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    REPLICA_CHECK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
    REPLICA_CHECK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
    REPLICA_CHECK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    REPLICA_CHECK(cublasLtMatrixLayoutCreate(&g.a, CUDA_R_32F, a.rows, a.cols, std::int64_t(a.rows)));
    REPLICA_CHECK(cublasLtMatrixLayoutCreate(&g.b, CUDA_R_32F, b.rows, b.cols, std::int64_t(b.rows)));
    REPLICA_CHECK(cublasLtMatrixLayoutCreate(&g.d, CUDA_R_32F, d.rows, d.cols, std::int64_t(d.rows)));

    cublasLtMatmulPreference_t pref = nullptr;
    REPLICA_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const std::size_t most = Context::blas_workspace_bytes;
    REPLICA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &most, sizeof most));
    constexpr int kMax = 8;
    cublasLtMatmulHeuristicResult_t found[kMax] = {};
    int count = 0;
    const cublasStatus_t h = cublasLtMatmulAlgoGetHeuristic(ctx.cublaslt(), g.desc, g.a, g.b, g.d, g.d, pref, kMax, found, &count);
    cublasLtMatmulPreferenceDestroy(pref);
    int usable = 0;   // the successful results, in cuBLASLt's order
    for (int i = 0; h == CUBLAS_STATUS_SUCCESS && i < count; ++i)
        if (found[i].state == CUBLAS_STATUS_SUCCESS) found[usable++] = found[i];
    if (usable == 0) return g;   // destroyed by the plan's owner
    g.usable = true;
    g.algo = found[0].algo;
    g.workspace = found[0].workspaceSize;
    if (!ctx.options().benchmark || ctx.options().deterministic || usable == 1) return g;

    const MeasuredGemmKey key{device_kind(ctx), {a.rows, a.cols, b.rows, b.cols, d.rows, d.cols,
                                                 std::uint64_t(op_a) * 4 + std::uint64_t(op_b), std::uint64_t(epilogue),
                                                 std::uint64_t(ctx.options().graphs)}};
    std::lock_guard lock(measured_mutex());
    auto& choices = measured_gemm_choices();
    auto it = choices.find(key);
    if (it == choices.end()) {
        const TimingScratch scratch(ctx, {a.rows * a.cols * sizeof(float), b.rows * b.cols * sizeof(float),
                                          d.rows * d.cols * sizeof(float), bias_length * sizeof(float)});
        CallTimer timer(ctx);
        const int k = CallTimer::fastest(usable, [&](int i, double give_up) {
            return timer.seconds([&] {
                return run_gemm(ctx, g, scratch.floats(0), scratch.floats(1), scratch.floats(2),
                                bias_length ? scratch.floats(3) : nullptr, found[i].algo,
                                found[i].workspaceSize) == CUBLAS_STATUS_SUCCESS;
            }, give_up);
        });
        it = choices.emplace(key, found[k].algo).first;
    }
    for (int i = 0; i < usable; ++i)   // the chosen one's workspace
        if (std::memcmp(&found[i].algo, &it->second, sizeof(cublasLtMatmulAlgo_t)) == 0) {
            g.algo = found[i].algo;
            g.workspace = found[i].workspaceSize;
        }
    return g;
}

inline const LinearPlan& linear_plan(const Context& ctx, int in, int out, std::size_t n, bool relu)
{
    auto& plans = ctx.state().linear_plans;
    const LinearKey key{in, out, n, relu};
    if (auto it = plans.find(key); it != plans.end()) return it->second;
    const std::uint64_t i = std::uint64_t(in), o = std::uint64_t(out), m = n;
    LinearPlan p;
    // y^T (out, n) = W^T... : A = W stored (in, out), transposed; B = x^T (in, n).
    p.forward = make_gemm(ctx, {i, o}, CUBLAS_OP_T, {i, m}, CUBLAS_OP_N, {o, m},
                          relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS, o);
    // dW^T (in, out) = x^T (in, n) dy (n, out): B = dy^T stored (out, n), transposed; db = its sum over n.
    p.weight_grad_bias = make_gemm(ctx, {i, m}, CUBLAS_OP_N, {o, m}, CUBLAS_OP_T, {i, o}, CUBLASLT_EPILOGUE_BGRADB, o);
    if (!p.weight_grad_bias.usable)
        p.weight_grad = make_gemm(ctx, {i, m}, CUBLAS_OP_N, {o, m}, CUBLAS_OP_T, {i, o}, CUBLASLT_EPILOGUE_DEFAULT, 0);
    // dx^T (in, n) = W stored (in, out) times dy^T (out, n).
    p.input_grad = make_gemm(ctx, {i, o}, CUBLAS_OP_N, {o, m}, CUBLAS_OP_N, {i, m}, CUBLASLT_EPILOGUE_DEFAULT, 0);
    for (const Gemm* g : {&p.forward, &p.input_grad, p.weight_grad_bias.usable ? &p.weight_grad_bias : &p.weight_grad})
        if (!g->usable) {
            for (Gemm* d : {&p.forward, &p.weight_grad_bias, &p.weight_grad, &p.input_grad}) d->destroy();
            throw Error("cuBLASLt offers no algorithm for a fully connected layer of " + std::to_string(in) + " -> " +
                        std::to_string(out) + " over " + std::to_string(n) + " samples");
        }
    return plans.emplace(key, p).first->second;
}

} // namespace detail

// relu: the ReLU after the layer is applied too (y is its output).
inline void linear_forward(const Context& ctx, int in, int out, const float* w, const float* b, const float* x, float* y,
                           std::size_t n, bool relu = false)
{
    if (n == 0) return;
    const LinearPlan& p = detail::linear_plan(ctx, in, out, n, relu);
    REPLICA_CHECK(detail::run_gemm(ctx, p.forward, w, x, y, b, p.forward.algo, p.forward.workspace));
}

// dw, db assigned; dx (may be null) assigned.
inline void linear_backward(const Context& ctx, int in, int out, const float* w, const float* x, const float* dy, float* dx,
                            float* dw, float* db, std::size_t n, bool relu = false)
{
    if (n == 0) {   // no samples: a zero gradient
        REPLICA_CHECK(cudaMemsetAsync(dw, 0, sizeof(float) * std::size_t(in) * std::size_t(out), ctx.stream()));
        REPLICA_CHECK(cudaMemsetAsync(db, 0, sizeof(float) * std::size_t(out), ctx.stream()));
        return;
    }
    const LinearPlan& p = detail::linear_plan(ctx, in, out, n, relu);
    if (p.weight_grad_bias.usable) {
        REPLICA_CHECK(detail::run_gemm(ctx, p.weight_grad_bias, x, dy, dw, db, p.weight_grad_bias.algo,
                                            p.weight_grad_bias.workspace));
    } else {
        REPLICA_CHECK(detail::run_gemm(ctx, p.weight_grad, x, dy, dw, nullptr, p.weight_grad.algo, p.weight_grad.workspace));
        const float one = 1.0f, zero = 0.0f;
        // db (out) = dy^T (out, n) 1 (n)
        REPLICA_CHECK(cublasSgemv(ctx.cublas(), CUBLAS_OP_N, out, int(n), &one, dy, out, ctx.ones(n), 1, &zero, db, 1));
    }
    if (dx) REPLICA_CHECK(detail::run_gemm(ctx, p.input_grad, w, dy, dx, nullptr, p.input_grad.algo, p.input_grad.workspace));
}

// The backward of the layer and the ReLU after it: relu_y and dy are the ReLU's output and its
// gradient; dz receives the layer output's gradient.
inline void linear_backward_relu(const Context& ctx, int in, int out, const float* w, const float* x, const float* relu_y,
                                 const float* dy, float* dz, float* dx, float* dw, float* db, std::size_t n)
{
    relu_backward(ctx, relu_y, dy, dz, n * std::size_t(out));
    linear_backward(ctx, in, out, w, x, dz, dx, dw, db, n, true);
}

} // namespace replica::backend::cuda
