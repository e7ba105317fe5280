#pragma once
// Causal scaled dot-product attention on the GPU, the CPU backend's contract and layouts
// (backend/cpu/attention.hpp): qkv (n, t, 3d) with each position's q, k, v; o (n, t, d); the softmax's
// log-sum-exp (n, heads, t). Direct kernels, one block a (sample, head, position), the scores of one
// row in shared memory: forward writes o and the log-sum-exp of query i; backward recomputes the
// weights from them, one kernel for dq (block: query i, over keys j <= i), one for dk and dv (block:
// key j, over queries i >= j). No atomics: every result is the same on every run. Values T (float,
// bf16, fp16) computed in float; sums in a tree fixed by the block size, or in position order.
// Shared memory bounds t: 6,080 positions (attention_limit). No scratch.

#include <cmath>
#include <cstddef>
#include <string>

#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/launch.hpp"
#include "replica/core/config.hpp"
#include "replica/core/error.hpp"
#include "replica/core/number.hpp"

namespace REPLICA_NAMESPACE::backend::cuda {

namespace kernels {
inline constexpr int kAttentionThreads = 128;

struct Max {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct Add {
    __device__ float operator()(float a, float b) const { return a + b; }
};

template <class T>
__device__ inline float dot(const T* a, const T* b, unsigned count)
{
    float s = 0.0f;
    for (unsigned c = 0; c < count; ++c) s += core::to_float(a[c]) * core::to_float(b[c]);
    return s;
}

// Block (s * heads + h) * t + i. Shared: the block's lanes, then the row's t weights.
template <class T>
__global__ void attention_forward(const T* qkv, T* o, float* lse, unsigned t, unsigned d, unsigned heads, float scale)
{
    extern __shared__ float shared[];
    float* lane = shared;
    float* p = shared + blockDim.x;
    const unsigned i = blockIdx.x % t, h = (blockIdx.x / t) % heads;
    const std::size_t s = blockIdx.x / (std::size_t(t) * heads), row = 3 * std::size_t(d), hd = d / heads;
    const T* base = qkv + s * t * row;
    const T* q = base + i * row + h * hd;
    float most = -INFINITY;
    for (unsigned j = threadIdx.x; j <= i; j += blockDim.x) {   // the causal mask: keys after i are never read
        p[j] = dot(q, base + j * row + d + h * hd, unsigned(hd)) * scale;
        most = fmaxf(most, p[j]);
    }
    most = detail::block_reduce(lane, most, Max{});
    __syncthreads();
    float sum = 0.0f;
    for (unsigned j = threadIdx.x; j <= i; j += blockDim.x) sum += (p[j] = expf(p[j] - most));
    sum = detail::block_reduce(lane, sum, Add{});   // its last barrier orders the p[j] writes before the reads below
    for (unsigned c = threadIdx.x; c < hd; c += blockDim.x) {
        float acc = 0.0f;
        for (unsigned j = 0; j <= i; ++j) acc += p[j] * core::to_float(base[j * row + 2 * d + h * hd + c]);
        o[(s * t + i) * d + h * hd + c] = core::from_float<T>(acc / sum);
    }
    if (threadIdx.x == 0) lse[blockIdx.x] = most + logf(sum);
}

// dq_i = scale sum_{j <= i} ds_ij k_j, ds_ij = p_ij (do_i . v_j - do_i . o_i). Block as forward's.
template <class T>
__global__ void attention_backward_query(const T* qkv, const T* o, const float* lse, const T* d_o, T* dqkv, unsigned t,
                                         unsigned d, unsigned heads, float scale)
{
    extern __shared__ float shared[];
    float* lane = shared;
    float* ds = shared + blockDim.x;
    const unsigned i = blockIdx.x % t, h = (blockIdx.x / t) % heads;
    const std::size_t s = blockIdx.x / (std::size_t(t) * heads), row = 3 * std::size_t(d), hd = d / heads;
    const T* base = qkv + s * t * row;
    const T* q = base + i * row + h * hd;
    const T* doi = d_o + (s * t + i) * d + h * hd;
    float part = 0.0f;
    for (unsigned c = threadIdx.x; c < hd; c += blockDim.x)
        part += core::to_float(doi[c]) * core::to_float(o[(s * t + i) * d + h * hd + c]);
    const float delta = detail::block_reduce(lane, part, Add{}), l = lse[blockIdx.x];
    for (unsigned j = threadIdx.x; j <= i; j += blockDim.x) {
        const float p = expf(dot(q, base + j * row + d + h * hd, unsigned(hd)) * scale - l);
        ds[j] = p * (dot(doi, base + j * row + 2 * d + h * hd, unsigned(hd)) - delta) * scale;
    }
    __syncthreads();
    for (unsigned c = threadIdx.x; c < hd; c += blockDim.x) {
        float acc = 0.0f;
        for (unsigned j = 0; j <= i; ++j) acc += ds[j] * core::to_float(base[j * row + d + h * hd + c]);
        dqkv[(s * t + i) * row + h * hd + c] = core::from_float<T>(acc);
    }
}

// dk_j = scale sum_{i >= j} ds_ij q_i, dv_j = sum_{i >= j} p_ij do_i. Block (s * heads + h) * t + j.
// Shared: the lanes, then p and ds for each query (2 t).
template <class T>
__global__ void attention_backward_key(const T* qkv, const T* o, const float* lse, const T* d_o, T* dqkv, unsigned t,
                                       unsigned d, unsigned heads, float scale)
{
    extern __shared__ float shared[];
    float* p = shared + blockDim.x;
    float* ds = p + t;
    const unsigned j = blockIdx.x % t, h = (blockIdx.x / t) % heads;
    const std::size_t s = blockIdx.x / (std::size_t(t) * heads), row = 3 * std::size_t(d), hd = d / heads;
    const T* base = qkv + s * t * row;
    const T* k = base + j * row + d + h * hd;
    const T* v = base + j * row + 2 * d + h * hd;
    const std::size_t rows = (s * heads + h) * t;   // this (sample, head)'s log-sum-exp
    for (unsigned i = j + threadIdx.x; i < t; i += blockDim.x) {
        const T* doi = d_o + (s * t + i) * d + h * hd;
        const float pij = expf(dot(base + i * row + h * hd, k, unsigned(hd)) * scale - lse[rows + i]);
        const float delta = dot(doi, o + (s * t + i) * d + h * hd, unsigned(hd));
        p[i] = pij;
        ds[i] = pij * (dot(doi, v, unsigned(hd)) - delta) * scale;
    }
    __syncthreads();
    for (unsigned c = threadIdx.x; c < hd; c += blockDim.x) {
        float dk = 0.0f, dv = 0.0f;
        for (unsigned i = j; i < t; ++i) {
            dk += ds[i] * core::to_float(base[i * row + h * hd + c]);
            dv += p[i] * core::to_float(d_o[(s * t + i) * d + h * hd + c]);
        }
        dqkv[(s * t + j) * row + d + h * hd + c] = core::from_float<T>(dk);
        dqkv[(s * t + j) * row + 2 * d + h * hd + c] = core::from_float<T>(dv);
    }
}
} // namespace kernels

namespace detail {
// Shared bytes of a block: its lanes and two floats a position.
inline std::size_t attention_shared(std::size_t t) { return (kernels::kAttentionThreads + 2 * t) * sizeof(float); }
inline void attention_limit(std::size_t t)
{
    core::require(attention_shared(t) <= 48 * 1024,
                  "CausalSelfAttention on the GPU holds a row of weights in shared memory: at most " +
                      std::to_string((48 * 1024 / sizeof(float) - kernels::kAttentionThreads) / 2) + " positions, not " +
                      std::to_string(t));
}
} // namespace detail

// No scratch: the weights are recomputed in shared memory.
template <class T = float>
std::size_t attention_scratch(const Context&, std::size_t, std::size_t, std::size_t, std::size_t)
{
    static_assert(core::Storage<T>, "activations are float, core::bf16 or core::fp16");
    return 0;
}

// o (n, t, d) and lse (n, heads, t) assigned.
template <core::Storage T>
void attention_forward(const Context& ctx, const T* qkv, T* o, float* lse, std::size_t n, std::size_t t, std::size_t d,
                       std::size_t heads, float*)
{
    if (n == 0) return;
    detail::attention_limit(t);
    const float scale = 1.0f / std::sqrt(float(d / heads));
    kernels::attention_forward<<<unsigned(n * heads * t), kernels::kAttentionThreads, detail::attention_shared(t),
                                 ctx.stream()>>>(qkv, o, lse, unsigned(t), unsigned(d), unsigned(heads), scale);
    detail::check_launch("attention_forward");
}

// dqkv (n, t, 3d) assigned, from forward's qkv, o, lse and the gradient of o.
template <core::Storage T>
void attention_backward(const Context& ctx, const T* qkv, const T* o, const float* lse, const T* d_o, T* dqkv,
                        std::size_t n, std::size_t t, std::size_t d, std::size_t heads, float*)
{
    if (n == 0) return;
    detail::attention_limit(t);
    const float scale = 1.0f / std::sqrt(float(d / heads));
    const unsigned blocks = unsigned(n * heads * t);
    kernels::attention_backward_query<<<blocks, kernels::kAttentionThreads, detail::attention_shared(t), ctx.stream()>>>(
        qkv, o, lse, d_o, dqkv, unsigned(t), unsigned(d), unsigned(heads), scale);
    detail::check_launch("attention_backward_query");
    kernels::attention_backward_key<<<blocks, kernels::kAttentionThreads, detail::attention_shared(t), ctx.stream()>>>(
        qkv, o, lse, d_o, dqkv, unsigned(t), unsigned(d), unsigned(heads), scale);
    detail::check_launch("attention_backward_key");
}

} // namespace replica::backend::cuda
