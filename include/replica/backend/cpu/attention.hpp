#pragma once
// Causal scaled dot-product attention on the CPU, the part of CausalSelfAttention between its two
// projections (layers/attention.hpp). Per sample, qkv is (t, 3d): each position's q, then k, then v,
// each (heads, d / heads); o is (t, d), heads side by side. Position i attends to positions j <= i with
// weights softmax_j(q_i . k_j / sqrt(d / heads)). qkv, o, do and dqkv are T (core::Storage), loaded as
// float; the softmax's log-sum-exp per (sample, head, position) is float.
//
// Each (sample, head) is a few products through BLAS over the head's columns in place (leading
// dimension 3d or d): the scores S = scale Q K^T (t, t), the causal softmax row by row, O = P V; in
// backward, P recomputed from S and the log-sum-exp, dV = P^T dO, dP = dO V^T, dS = P (dP - delta) with
// delta_i = dO_i . O_i, dQ = scale dS K, dK = scale dS^T Q. The products cover the whole (t, t) square
// and the mask zeroes its upper part, so that every sum has a fixed order: the same bits every run.
// A bf16/fp16 sample is loaded to float first and its results stored once, rounded.

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <limits>

#include "replica/backend/cpu/context.hpp"
#include "replica/backend/cpu/ops.hpp"
#include "replica/core/config.hpp"
#include "replica/core/number.hpp"

namespace REPLICA_NAMESPACE::backend::cpu {

// Scratch floats attention_forward and attention_backward need for n samples of (t, d): one sample's
// qkv, o, do and dqkv in float (16-bit activations), and two (t, t) squares.
template <class T = float>
std::size_t attention_scratch(const Context&, std::size_t /*n*/, std::size_t t, std::size_t d, std::size_t /*heads*/)
{
    static_assert(core::Storage<T>, "activations are float, core::bf16 or core::fp16");
    return 8 * t * d + 2 * t * t;
}

// o (n, t, d) and lse (n, heads, t) assigned.
template <core::Storage T>
void attention_forward(const Context&, const T* qkv, T* o, float* lse, std::size_t n, std::size_t t, std::size_t d,
                       std::size_t heads, float* scratch)
{
    const std::size_t hd = d / heads, row = 3 * d;
    const float scale = 1.0f / std::sqrt(float(hd));
    float* qkv_room = scratch;           // (t, 3d)
    float* o_room = qkv_room + t * row;  // (t, d)
    float* p = o_room + t * d;           // (t, t): scores, then weights
    const int ti = int(t), hdi = int(hd), rowi = int(row), di = int(d);
    for (std::size_t s = 0; s < n; ++s) {
        const float* qs = as_float(qkv + s * t * row, t * row, qkv_room);
        float* os = std::same_as<T, float> ? reinterpret_cast<float*>(o + s * t * d) : o_room;
        for (std::size_t h = 0; h < heads; ++h) {
            const float* q = qs + h * hd;
            const float* k = qs + d + h * hd;
            const float* v = qs + 2 * d + h * hd;
            gemm(false, true, ti, ti, hdi, scale, q, rowi, k, rowi, 0.0f, p, ti);
            for (std::size_t i = 0; i < t; ++i) {
                float* pi = p + i * t;
                const std::size_t keys = i + 1;   // the causal mask
                float most = -std::numeric_limits<float>::infinity();
                for (std::size_t j = 0; j < keys; ++j) most = std::max(most, pi[j]);
                float sum = 0.0f;
                for (std::size_t j = 0; j < keys; ++j) sum += (pi[j] = exp_nonpositive(pi[j] - most));
                const float inv = 1.0f / sum;
                for (std::size_t j = 0; j < keys; ++j) pi[j] *= inv;
                std::fill(pi + keys, pi + t, 0.0f);
                lse[(s * heads + h) * t + i] = most + std::log(sum);
            }
            gemm(false, false, ti, hdi, ti, 1.0f, p, ti, v, rowi, 0.0f, os + h * hd, di);
        }
        if constexpr (!std::same_as<T, float>) store_float(o_room, t * d, o + s * t * d);
    }
}

// From forward's qkv, o and lse, and the gradient of o: dqkv (n, t, 3d) assigned.
template <core::Storage T>
void attention_backward(const Context&, const T* qkv, const T* o, const float* lse, const T* d_o, T* dqkv,
                        std::size_t n, std::size_t t, std::size_t d, std::size_t heads, float* scratch)
{
    const std::size_t hd = d / heads, row = 3 * d;
    const float scale = 1.0f / std::sqrt(float(hd));
    float* qkv_room = scratch;             // (t, 3d)
    float* o_room = qkv_room + t * row;    // (t, d)
    float* do_room = o_room + t * d;       // (t, d)
    float* g_room = do_room + t * d;       // (t, 3d): dq, dk, dv
    float* p = g_room + t * row;           // (t, t): weights
    float* dp = p + t * t;                 // (t, t): their gradient, then the scores'
    const int ti = int(t), hdi = int(hd), rowi = int(row), di = int(d);
    for (std::size_t s = 0; s < n; ++s) {
        const float* qs = as_float(qkv + s * t * row, t * row, qkv_room);
        const float* os = as_float(o + s * t * d, t * d, o_room);
        const float* dos = as_float(d_o + s * t * d, t * d, do_room);
        float* g = std::same_as<T, float> ? reinterpret_cast<float*>(dqkv + s * t * row) : g_room;
        for (std::size_t h = 0; h < heads; ++h) {
            const float* q = qs + h * hd;
            const float* k = qs + d + h * hd;
            const float* v = qs + 2 * d + h * hd;
            const float* doh = dos + h * hd;
            const float* l = lse + (s * heads + h) * t;
            gemm(false, true, ti, ti, hdi, scale, q, rowi, k, rowi, 0.0f, p, ti);
            for (std::size_t i = 0; i < t; ++i) {
                float* pi = p + i * t;
                for (std::size_t j = 0; j <= i; ++j) pi[j] = exp_nonpositive(pi[j] - l[i]);
                std::fill(pi + i + 1, pi + t, 0.0f);
            }
            gemm(true, false, ti, hdi, ti, 1.0f, p, ti, doh, di, 0.0f, g + 2 * d + h * hd, rowi);   // dV = P^T dO
            gemm(false, true, ti, ti, hdi, 1.0f, doh, di, v, rowi, 0.0f, dp, ti);                  // dP = dO V^T
            for (std::size_t i = 0; i < t; ++i) {
                const float* oi = os + i * d + h * hd;
                const float* doi = doh + i * d;
                float delta = 0.0f;
                for (std::size_t c = 0; c < hd; ++c) delta += doi[c] * oi[c];
                float* dpi = dp + i * t;
                const float* pi = p + i * t;
                for (std::size_t j = 0; j < t; ++j) dpi[j] = pi[j] * (dpi[j] - delta);   // 0 above the diagonal
            }
            gemm(false, false, ti, hdi, ti, scale, dp, ti, k, rowi, 0.0f, g + h * hd, rowi);      // dQ = scale dS K
            gemm(true, false, ti, hdi, ti, scale, dp, ti, q, rowi, 0.0f, g + d + h * hd, rowi);   // dK = scale dS^T Q
        }
        if constexpr (!std::same_as<T, float>) store_float(g_room, t * row, dqkv + s * t * row);
    }
}

} // namespace replica::backend::cpu
