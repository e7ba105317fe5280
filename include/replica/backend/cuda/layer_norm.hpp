#pragma once
// Layer normalisation on the GPU, the CPU backend's contract (backend/cpu/layer_norm.hpp): `rows` rows
// of `features` values, each normalised on its own. One block a row for the statistics, the output
// and the input gradient (sums in a tree fixed by the block size); the weight and bias gradients in
// two passes: each chunk of kLayerNormChunk rows summed in order, a thread a feature, into the
// context's workspace, then the chunks' sums added in chunk order. The grouping depends on the row
// count only, so every result is the same on every run and on any number of replicas. x, y, dy, dx are
// T (float, bf16, fp16), computed in float; the weight, bias, their gradients and the statistics float.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <type_traits>

#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/launch.hpp"
#include "replica/core/config.hpp"
#include "replica/core/error.hpp"
#include "replica/core/number.hpp"

namespace REPLICA_NAMESPACE::backend::cuda {

namespace kernels {
inline constexpr int kLayerNormThreads = 128;

struct Sum {
    __device__ float operator()(float a, float b) const { return a + b; }
};

// Block r: row r.
template <class T>
__global__ void layer_norm_forward(const T* x, T* y, const float* w, const float* b, unsigned features, float eps,
                                   float* mean, float* rstd)
{
    __shared__ float lane[kLayerNormThreads];
    const std::size_t r = blockIdx.x;
    const T* xr = x + r * features;
    float s = 0.0f;
    for (unsigned f = threadIdx.x; f < features; f += blockDim.x) s += core::to_float(xr[f]);
    const float m = detail::block_reduce(lane, s, Sum{}) / float(features);
    __syncthreads();   // every thread has read lane[0] before the next sum writes lane
    float q = 0.0f;
    for (unsigned f = threadIdx.x; f < features; f += blockDim.x) {
        const float c = core::to_float(xr[f]) - m;
        q += c * c;
    }
    const float rs = rsqrtf(detail::block_reduce(lane, q, Sum{}) / float(features) + eps);
    for (unsigned f = threadIdx.x; f < features; f += blockDim.x) {
        const float h = (core::to_float(xr[f]) - m) * rs;
        y[r * features + f] = core::from_float<T>(w ? h * w[f] + b[f] : h);
    }
    if (threadIdx.x == 0) mean[r] = m, rstd[r] = rs;
}

template <class T>
__global__ void layer_norm_backward_input(const T* x, const T* dy, const float* w, const float* mean, const float* rstd,
                                          T* dx, unsigned features)
{
    __shared__ float lane[kLayerNormThreads];
    const std::size_t r = blockIdx.x;
    const float m = mean[r], rs = rstd[r];
    float sg = 0.0f, sgh = 0.0f;
    for (unsigned f = threadIdx.x; f < features; f += blockDim.x) {
        const float g = core::to_float(dy[r * features + f]) * (w ? w[f] : 1.0f);
        sg += g;
        sgh += g * (core::to_float(x[r * features + f]) - m) * rs;
    }
    const float mg = detail::block_reduce(lane, sg, Sum{}) / float(features);
    __syncthreads();
    const float mgh = detail::block_reduce(lane, sgh, Sum{}) / float(features);
    for (unsigned f = threadIdx.x; f < features; f += blockDim.x) {
        const float g = core::to_float(dy[r * features + f]) * (w ? w[f] : 1.0f);
        const float h = (core::to_float(x[r * features + f]) - m) * rs;
        dx[r * features + f] = core::from_float<T>(rs * (g - mg - h * mgh));
    }
}

inline constexpr std::size_t kLayerNormChunk = 64;

// Block (b, c), thread f of block b: feature f over chunk c's rows, in order, into partial's rows 2c
// (weight) and 2c + 1 (bias).
template <class T>
__global__ void layer_norm_backward_params_chunks(const T* x, const T* dy, const float* mean, const float* rstd,
                                                  float* partial, std::size_t rows, unsigned features)
{
    const unsigned f = blockIdx.x * blockDim.x + threadIdx.x;
    if (f >= features) return;
    const std::size_t begin = std::size_t(blockIdx.y) * kLayerNormChunk, end = min(rows, begin + kLayerNormChunk);
    float sw = 0.0f, sb = 0.0f;
    for (std::size_t r = begin; r < end; ++r) {
        const float d = core::to_float(dy[r * features + f]);
        sw += d * (core::to_float(x[r * features + f]) - mean[r]) * rstd[r];
        sb += d;
    }
    partial[2 * std::size_t(blockIdx.y) * features + f] = sw;
    partial[(2 * std::size_t(blockIdx.y) + 1) * features + f] = sb;
}

// Thread f: the chunks' sums of feature f, in chunk order.
template <int = 0>
__global__ void layer_norm_backward_params_total(const float* partial, std::size_t chunks, unsigned features, float* dw,
                                                 float* db)
{
    const unsigned f = blockIdx.x * blockDim.x + threadIdx.x;
    if (f >= features) return;
    float sw = 0.0f, sb = 0.0f;
    for (std::size_t c = 0; c < chunks; ++c) {
        sw += partial[2 * c * features + f];
        sb += partial[(2 * c + 1) * features + f];
    }
    dw[f] = sw;
    db[f] = sb;
}
} // namespace kernels

// y = (x - mean) * rstd * w + b per row (w, b null: 1 and 0); mean and rstd (rows floats) assigned.
template <core::Storage T>
void layer_norm_forward(const Context& ctx, const T* x, T* y, const float* w, const float* b, std::size_t rows,
                        std::size_t features, float eps, float* mean, float* rstd)
{
    if (rows == 0) return;
    kernels::layer_norm_forward<<<unsigned(rows), kernels::kLayerNormThreads, 0, ctx.stream()>>>(
        x, y, w, b, unsigned(features), eps, mean, rstd);
    detail::check_launch("layer_norm_forward");
}

// dx (may be null) assigned; dw, db assigned (null without affine, w then null too).
template <core::Storage T>
void layer_norm_backward(const Context& ctx, const T* x, const T* dy, const float* w, const float* mean, const float* rstd,
                         std::type_identity_t<T>* dx, float* dw, float* db, std::size_t rows, std::size_t features)
{
    if (dw) {
        const std::size_t chunks = (rows + kernels::kLayerNormChunk - 1) / kernels::kLayerNormChunk;
        core::require(chunks <= 65535, "layer_norm_backward: at most 65535 x 64 rows a call");
        float* partial = static_cast<float*>(ctx.workspace(std::max<std::size_t>(1, 2 * chunks * features) * sizeof(float)));
        if (chunks > 0) {
            const dim3 grid(unsigned(detail::blocks_for(features)), unsigned(chunks));
            kernels::layer_norm_backward_params_chunks<<<grid, detail::kThreads, 0, ctx.stream()>>>(
                x, dy, mean, rstd, partial, rows, unsigned(features));
            detail::check_launch("layer_norm_backward_params_chunks");
        }
        kernels::layer_norm_backward_params_total<<<detail::blocks_for(features), detail::kThreads, 0, ctx.stream()>>>(
            partial, chunks, unsigned(features), dw, db);
        detail::check_launch("layer_norm_backward_params_total");
    }
    if (dx && rows > 0) {
        kernels::layer_norm_backward_input<<<unsigned(rows), kernels::kLayerNormThreads, 0, ctx.stream()>>>(
            x, dy, w, mean, rstd, dx, unsigned(features));
        detail::check_launch("layer_norm_backward_input");
    }
}

} // namespace replica::backend::cuda
