#pragma once
// CausalSelfAttention<Heads>: (positions T, features D) -> (T, D), GPT-2's (nanoGPT's) attention block
// without dropout (there is none here: neither on the weights nor after the projection):
//   qkv = x Wqkv^T + bqkv            (T, 3D): each position's q, k, v, as PyTorch's c_attn lays them
//   o_h = softmax(q_h k_h^T / sqrt(D / Heads) + causal mask) v_h, for each head h of D / Heads features
//   y   = o Wo^T + bo                o (T, D) the heads side by side
// Position i attends to positions 0..i. Parameters: Wqkv (3D, D), bqkv (3D), Wo (D, D), bo (D), in that
// order (PyTorch's c_attn.weight, c_attn.bias, c_proj.weight, c_proj.bias), initialised like Linear's,
// U(-1/sqrt(D), 1/sqrt(D)). Kept from forward to backward: qkv and o (4 T D values a sample); saved: the
// softmax's log-sum-exp of each (head, position) (Heads T floats), from which backward recomputes the
// weights. Scratch: the gradients of o and qkv, and the backend's own (attention_scratch).
// Decoding (layers/decode.hpp) keeps each position's k and v in its cache, (L, D) keys then (L, D)
// values, and attends from the new position's q to those of positions 0 .. position.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <limits>

#include "replica/core/config.hpp"
#include "replica/layers/decode.hpp"
#include "replica/layers/op.hpp"

namespace REPLICA_NAMESPACE::layers {

template <std::size_t Heads>
struct CausalSelfAttention {
    static_assert(Heads > 0, "CausalSelfAttention needs at least one head");

    template <class In, class T = float>
    struct op : LeafOp {
        static_assert(In::rank == 2, "CausalSelfAttention needs a (positions, features) input: Input<T, D>, or a Linear over one");
        static constexpr std::size_t L = In::dims[0];                          // positions (T)
        // features (on another rank Heads, so that the rank's message is the only one)
        static constexpr std::size_t D = In::rank == 2 ? In::dims[1] : Heads;
        static_assert(D % Heads == 0,
                      "CausalSelfAttention<Heads>: the features D must be a multiple of Heads (each head takes D / "
                      "Heads of them): pick Heads that divides D");
        using input_shape = In;
        using output_shape = In;
        static constexpr std::size_t qkv_weights = 3 * D * D, qkv_count = qkv_weights + 3 * D;
        static constexpr std::size_t out_weights = D * D;
        static constexpr std::size_t param_count = qkv_count + out_weights + D;
        static constexpr std::array param_blocks{core::ParamBlock{qkv_weights, core::ParamKind::weight},
                                                 core::ParamBlock{3 * D, core::ParamKind::bias},
                                                 core::ParamBlock{out_weights, core::ParamKind::weight},
                                                 core::ParamBlock{D, core::ParamKind::bias}};
        static constexpr std::size_t kept_size = 4 * L * D;   // qkv (L, 3D), then o (L, D)
        static constexpr std::size_t saved_size = Heads * L;  // log-sum-exp (Heads, L)

        using LeafOp::LeafOp;
        void init(float* p, std::uint64_t seed) const
        {
            init_uniform(p, param_count, 1.0f / std::sqrt(float(D)), seed, id);
        }
        // Backward's gradients of o (n L D) and qkv (n L 3D) in T, then the backend's scratch; forward
        // uses the backend's alone, at the same place.
        template <class Ctx>
        std::size_t scratch_size(const Ctx& ctx, std::size_t n) const
        {
            return floats_for<T>(n * L * D) + floats_for<T>(n * L * 3 * D) + attention_scratch<T>(ctx, n, L, D, Heads);
        }
        // A Residual's other branch, when its body ends here, is added in the output projection
        // (layers/op.hpp: takes_addend); backward reads no y.
        static constexpr bool takes_addend = true;
        template <class Ctx>
        void forward(Ctx& ctx, const Pass&, const ForwardArgs<T>& a) const
        {
            T* qkv = a.kept;
            T* o = a.kept + a.n * L * 3 * D;
            linear_forward(ctx, int(D), int(3 * D), a.weights, a.params + qkv_weights, a.x, qkv, a.n * L);
            attention_forward(ctx, static_cast<const T*>(qkv), o, a.saved, a.n, L, D, Heads, own_scratch(a.scratch, a.n));
            const float* bias = a.params + qkv_count + out_weights;
            if (a.addend)
                linear_forward_add(ctx, int(D), int(D), a.weights + qkv_count, bias, static_cast<const T*>(o), a.addend, a.y, a.n * L);
            else linear_forward(ctx, int(D), int(D), a.weights + qkv_count, bias, static_cast<const T*>(o), a.y, a.n * L);
        }
        template <class Ctx>
        void backward(Ctx& ctx, const Pass&, const BackwardArgs<T>& a) const
        {
            const T* qkv = a.kept;
            const T* o = a.kept + a.n * L * 3 * D;
            T* d_o = reinterpret_cast<T*>(a.scratch);
            T* dqkv = reinterpret_cast<T*>(a.scratch + floats_for<T>(a.n * L * D));
            linear_backward(ctx, int(D), int(D), a.weights + qkv_count, o, a.dy, d_o, a.dparams + qkv_count,
                            a.dparams + qkv_count + out_weights, a.n * L);
            attention_backward(ctx, qkv, o, static_cast<const float*>(a.saved), static_cast<const T*>(d_o), dqkv, a.n,
                               L, D, Heads, own_scratch(a.scratch, a.n));
            linear_backward(ctx, int(D), int(3 * D), a.weights, a.x, static_cast<const T*>(dqkv), a.dx, a.dparams,
                            a.dparams + qkv_weights, a.n * L);
        }

        static constexpr std::size_t decode_cache = 2 * L * D;       // keys (L, D), then values (L, D)
        static constexpr std::size_t decode_scratch = 4 * D + L;     // qkv (3D), o (D), weights (L)
        static void decode(const DecodeArgs& a)
        {
            constexpr std::size_t hd = D / Heads;
            float* qkv = a.scratch;
            float* o = a.scratch + 3 * D;
            float* p = a.scratch + 4 * D;
            float* keys = a.cache;
            float* values = a.cache + L * D;
            decode_linear(a.params, a.params + qkv_weights, a.x, qkv, D, 3 * D);
            std::copy(qkv + D, qkv + 2 * D, keys + a.position * D);
            std::copy(qkv + 2 * D, qkv + 3 * D, values + a.position * D);
            const float scale = 1.0f / std::sqrt(float(hd));
            for (std::size_t h = 0; h < Heads; ++h) {
                const float* q = qkv + h * hd;
                float most = -std::numeric_limits<float>::infinity();
                for (std::size_t j = 0; j <= a.position; ++j) {
                    p[j] = decode_dot(q, keys + j * D + h * hd, hd) * scale;
                    most = std::max(most, p[j]);
                }
                double sum = 0.0;
                for (std::size_t j = 0; j <= a.position; ++j) sum += double(p[j] = std::exp(p[j] - most));
                for (std::size_t e = 0; e < hd; ++e) {
                    double acc = 0.0;
                    for (std::size_t j = 0; j <= a.position; ++j) acc += double(p[j]) * double(values[j * D + h * hd + e]);
                    o[h * hd + e] = float(acc / sum);
                }
            }
            decode_linear(a.params + qkv_count, a.params + qkv_count + out_weights, o, a.y, D, D);
        }

    private:
        static float* own_scratch(float* scratch, std::size_t n)
        {
            return scratch + floats_for<T>(n * L * D) + floats_for<T>(n * L * 3 * D);
        }
    };
};

} // namespace replica::layers

namespace REPLICA_NAMESPACE {
using layers::CausalSelfAttention;
} // namespace replica
