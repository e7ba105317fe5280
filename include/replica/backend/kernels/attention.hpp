#pragma once
// The attention family (layers/attention.hpp; what every family shares: kernels/kernels.hpp): causal
// scaled dot-product attention, the part of CausalSelfAttention between its two projections. Per
// sample, qkv is (t, 3d), each position's q, then k, then v, each (heads, d / heads); o is (t, d),
// the heads side by side. Position i attends to positions j <= i with the weights
// softmax_j(q_i . k_j / sqrt(d / heads)). qkv, o and their gradients are of the model's element type
// T, as stored, computed in float, each output rounded once; lse, the softmax's log-sum-exp a
// (sample, head, position), and scratch are float. `scratch` is context memory of at least
// attention_scratch floats, the op's own for the call. Every result is the same every run.

#include <concepts>
#include <cstddef>

#include "replica/core/config.hpp"
#include "replica/core/number.hpp"

namespace REPLICA_NAMESPACE::backend::kernels {

// The family for activations of type T. attention_scratch is host work; the passes are queued.
template <class C, class T>
concept AttentionKernelsFor = core::Storage<T> &&
    requires(const C& ctx, const T* qkv, T* o, const T* o_in, float* lse, const float* lse_in, const T* d_o, T* dqkv,
             std::size_t n, std::size_t t, std::size_t d, std::size_t heads, float* scratch) {
        // Floats of scratch the passes need for n samples of (t, d) with `heads` heads.
        { attention_scratch<T>(ctx, n, t, d, heads) } -> std::same_as<std::size_t>;
        // o (n, t, d) and lse (n, heads, t) assigned.
        attention_forward(ctx, qkv, o, lse, n, t, d, heads, scratch);
        // From forward's qkv, o and lse, and o's gradient d_o: dqkv (n, t, 3d) assigned.
        attention_backward(ctx, qkv, o_in, lse_in, d_o, dqkv, n, t, d, heads, scratch);
    };

// The family for every element type of activations.
template <class C>
concept AttentionKernels =
    AttentionKernelsFor<C, float> && AttentionKernelsFor<C, core::bf16> && AttentionKernelsFor<C, core::fp16>;

} // namespace replica::backend::kernels
