#pragma once
// Causal scaled dot-product attention on the CPU, the part of CausalSelfAttention between its two
// projections (layers/attention.hpp). Per sample, qkv is (t, 3d): each position's q, then k, then v,
// each (heads, d / heads); o is (t, d), heads side by side. Position i attends to positions j <= i with
// weights softmax_j(q_i . k_j / sqrt(d / heads)). qkv, o, do and dqkv are T (core::Storage), loaded as
// float; the softmax's log-sum-exp per (sample, head, position) is float. Plain loops in float, the
// reference the GPU's kernels are compared with.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

#include "replica/backend/cpu/context.hpp"
#include "replica/core/config.hpp"
#include "replica/core/number.hpp"

namespace REPLICA_NAMESPACE::backend::cpu {

// Scratch floats attention_forward and attention_backward need for n samples of (t, d).
template <class T = float>
std::size_t attention_scratch(const Context&, std::size_t /*n*/, std::size_t t, std::size_t d, std::size_t /*heads*/)
{
    static_assert(core::Storage<T>, "activations are float, core::bf16 or core::fp16");
    return std::max(t, 3 * t * d);   // forward: a row of scores; backward: a sample's dq, dk, dv in float
}

// o (n, t, d) and lse (n, heads, t) assigned.
template <core::Storage T>
void attention_forward(const Context&, const T* qkv, T* o, float* lse, std::size_t n, std::size_t t, std::size_t d,
                       std::size_t heads, float* scratch)
{
    const std::size_t hd = d / heads, row = 3 * d;
    const float scale = 1.0f / std::sqrt(float(hd));
    float* p = scratch;   // (t): scores, then weights, of one query
    for (std::size_t s = 0; s < n; ++s) {
        const T* qs = qkv + s * t * row;
        for (std::size_t h = 0; h < heads; ++h)
            for (std::size_t i = 0; i < t; ++i) {
                const T* q = qs + i * row + h * hd;
                const std::size_t keys = i + 1;   // the causal mask: keys after i are never read
                float most = -std::numeric_limits<float>::infinity();
                for (std::size_t j = 0; j < keys; ++j) {
                    const T* k = qs + j * row + d + h * hd;
                    float dot = 0.0f;
                    for (std::size_t c = 0; c < hd; ++c) dot += core::to_float(q[c]) * core::to_float(k[c]);
                    p[j] = dot * scale;
                    most = std::max(most, p[j]);
                }
                float sum = 0.0f;
                for (std::size_t j = 0; j < keys; ++j) sum += (p[j] = std::exp(p[j] - most));
                lse[(s * heads + h) * t + i] = most + std::log(sum);
                T* out = o + (s * t + i) * d + h * hd;
                for (std::size_t c = 0; c < hd; ++c) {
                    float acc = 0.0f;
                    for (std::size_t j = 0; j < keys; ++j) acc += p[j] * core::to_float(qs[j * row + 2 * d + h * hd + c]);
                    out[c] = core::from_float<T>(acc / sum);
                }
            }
    }
}

// From forward's qkv, o and lse, and the gradient of o: dqkv (n, t, 3d) assigned. The weights are
// recomputed, p_ij = exp(q_i . k_j * scale - lse_i); with delta_i = do_i . o_i (per head),
// ds_ij = p_ij (do_i . v_j - delta_i): dq_i = scale sum_j ds_ij k_j, dk_j = scale sum_i ds_ij q_i,
// dv_j = sum_i p_ij do_i.
template <core::Storage T>
void attention_backward(const Context&, const T* qkv, const T* o, const float* lse, const T* d_o, T* dqkv,
                        std::size_t n, std::size_t t, std::size_t d, std::size_t heads, float* scratch)
{
    const std::size_t hd = d / heads, row = 3 * d;
    const float scale = 1.0f / std::sqrt(float(hd));
    float* g = scratch;   // (t, 3d): one sample's dq, dk, dv in float
    for (std::size_t s = 0; s < n; ++s) {
        const T* qs = qkv + s * t * row;
        std::fill(g, g + t * row, 0.0f);
        for (std::size_t h = 0; h < heads; ++h)
            for (std::size_t i = 0; i < t; ++i) {
                const T* q = qs + i * row + h * hd;
                const T* doi = d_o + (s * t + i) * d + h * hd;
                const T* oi = o + (s * t + i) * d + h * hd;
                float delta = 0.0f;
                for (std::size_t c = 0; c < hd; ++c) delta += core::to_float(doi[c]) * core::to_float(oi[c]);
                const float l = lse[(s * heads + h) * t + i];
                const std::size_t keys = i + 1;   // the causal mask
                for (std::size_t j = 0; j < keys; ++j) {
                    const T* k = qs + j * row + d + h * hd;
                    const T* v = qs + j * row + 2 * d + h * hd;
                    float dot = 0.0f, dp = 0.0f;
                    for (std::size_t c = 0; c < hd; ++c) {
                        dot += core::to_float(q[c]) * core::to_float(k[c]);
                        dp += core::to_float(doi[c]) * core::to_float(v[c]);
                    }
                    const float p = std::exp(dot * scale - l);
                    const float ds = p * (dp - delta) * scale;
                    float* dq = g + i * row + h * hd;
                    float* dk = g + j * row + d + h * hd;
                    float* dv = g + j * row + 2 * d + h * hd;
                    for (std::size_t c = 0; c < hd; ++c) {
                        dq[c] += ds * core::to_float(k[c]);
                        dk[c] += ds * core::to_float(q[c]);
                        dv[c] += p * core::to_float(doi[c]);
                    }
                }
            }
        for (std::size_t e = 0; e < t * row; ++e) dqkv[s * t * row + e] = core::from_float<T>(g[e]);
    }
}

} // namespace replica::backend::cpu
