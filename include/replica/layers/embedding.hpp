#pragma once
// Embeddings, a language model's input (GPT-2's wte and wpe).
//   Embedding<Vocab, Dim, Tag>  token ids (T) -> (T, Dim): row ids[t] of a (Vocab, Dim) table. It reads
//                               the model's token ids, so it is the first layer of a model with
//                               Input<Tokens<T>> (model/input.hpp), and only there; the model checks every
//                               id against [0, Vocab) before it queues anything. TiedHead<E>
//                               (layers/tied_head.hpp), E this type, reads its table as the head's
//                               weight: GPT-2's tied head. Tag (any type) tells two embeddings of the
//                               same Vocab and Dim apart.
//   PositionEmbedding<Context>  (T, Dim) -> (T, Dim): x + row t of a learned (Context, Dim) table at
//                               position t, T <= Context.
// Both tables are initialised N(0, 0.02), GPT-2's (and nanoGPT's) choice for wte and wpe, and are
// of kind core::ParamKind::embedding. Backward ASSIGNS the tables' gradients: zero, then each position's
// output gradient added to its row, in an order fixed by the batch (never by threads or atomics), so
// the result is the same bits on every run and device count; a tied table starts from the head's
// gradient instead of zero (BackwardArgs::accumulate_params). Embedding has no input gradient.
//
//   using Gpt = Sequential<Input<Tokens<16>>, Embedding<64, 32>, PositionEmbedding<16>, ...,
//                          Linear<64>, SequenceCrossEntropy>;

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "replica/core/config.hpp"
#include "replica/core/rng.hpp"
#include "replica/layers/decode.hpp"
#include "replica/layers/op.hpp"

namespace REPLICA_NAMESPACE::layers {

// N(0, std) from the counter-based generator (Box-Muller on two draws): element i of layer `layer`.
inline void init_normal(float* p, std::size_t count, float std, std::uint64_t seed, std::uint32_t layer)
{
    for (std::size_t i = 0; i < count; ++i) {
        const double u1 = 1.0 - double(core::random_uniform(seed, core::Stream::init, layer, 1, std::uint32_t(i)));   // (0, 1]
        const double u2 = double(core::random_uniform(seed, core::Stream::init, layer, 2, std::uint32_t(i)));
        p[i] = float(double(std) * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
    }
}

inline constexpr float kEmbeddingStd = 0.02f;

template <std::size_t Vocab, std::size_t Dim, class Tag = void>
struct Embedding {
    static_assert(Vocab > 0 && Dim > 0, "Embedding<Vocab, Dim>: a vocabulary and a width of at least 1");
    static_assert(Vocab <= std::size_t(INT32_MAX), "Embedding<Vocab, Dim>: token ids are std::int32_t");
    static constexpr std::size_t vocabulary = Vocab;
    static constexpr std::size_t dim = Dim;
    using tag = Embedding;   // what names its table (TiedHead<Embedding<...>>)

    template <class In, class T = float>
    struct op : LeafOp {
        using tag = Embedding;
        static constexpr bool accumulates_param_gradient = true;   // under a TiedHead
        static_assert(In::rank == 1,
                      "Embedding reads a sample of T token ids: it is the first layer, after Input<Tokens<T>>");
        static constexpr std::size_t positions = In::size;
        using input_shape = In;
        using output_shape = Shape<positions, Dim>;
        static constexpr std::size_t param_count = Vocab * Dim;   // the table, (Vocab, Dim)
        static constexpr std::array param_blocks{core::ParamBlock{Vocab * Dim, core::ParamKind::embedding}};

        using LeafOp::LeafOp;
        void init(float* p, std::uint64_t seed) const { init_normal(p, param_count, kEmbeddingStd, seed, id); }
        template <class Ctx>
        void forward(Ctx& ctx, const Pass&, const ForwardArgs<T>& a) const
        {
            embedding_forward(ctx, token_ids(a.x), a.params, a.y, a.n * positions, Dim);
        }
        template <class Ctx>
        void backward(Ctx& ctx, const Pass&, const BackwardArgs<T>& a) const
        {
            embedding_backward(ctx, token_ids(a.x), a.dy, a.dparams, a.n * positions, Vocab, Dim, a.accumulate_params);
        }
        // One position (layers/decode.hpp): row id of the table, the id at a.x (checked by the caller).
        static void decode(const DecodeArgs& a)
        {
            const float* row = a.params + std::size_t(*token_ids(a.x)) * Dim;
            for (std::size_t d = 0; d < Dim; ++d) a.y[d] = row[d];
        }
    };
};

template <std::size_t Context>
struct PositionEmbedding {
    static_assert(Context > 0, "PositionEmbedding<Context>: a context of at least 1 position");
    static constexpr std::size_t context = Context;

    template <class In, class T = float>
    struct op : LeafOp {
        static_assert(In::rank == 2,
                      "PositionEmbedding adds a vector a position to a (positions, features) input: put it after "
                      "Embedding<Vocab, Dim>");
        static_assert(In::rank != 2 || In::dims[0] <= Context,
                      "PositionEmbedding<Context>: the sequence has more positions than the Context it has vectors "
                      "for: make Context at least Input<Tokens<T>>'s T");
        static constexpr std::size_t positions = In::dims[0];
        static constexpr std::size_t D = In::size / positions;
        using input_shape = In;
        using output_shape = In;
        static constexpr std::size_t param_count = Context * D;   // the table, (Context, D)
        static constexpr std::array param_blocks{core::ParamBlock{Context * D, core::ParamKind::embedding}};

        using LeafOp::LeafOp;
        void init(float* p, std::uint64_t seed) const { init_normal(p, param_count, kEmbeddingStd, seed, id); }
        template <class Ctx>
        void forward(Ctx& ctx, const Pass&, const ForwardArgs<T>& a) const
        {
            position_embedding_forward(ctx, a.x, a.params, a.y, a.n, positions, D);
        }
        template <class Ctx>
        void backward(Ctx& ctx, const Pass&, const BackwardArgs<T>& a) const
        {
            position_embedding_backward(ctx, a.dy, a.dx, a.dparams, a.n, positions, Context, D);
        }
        static void decode(const DecodeArgs& a)
        {
            const float* row = a.params + a.position * D;
            for (std::size_t d = 0; d < D; ++d) a.y[d] = a.x[d] + row[d];
        }
    };
};

} // namespace replica::layers

namespace REPLICA_NAMESPACE {
using layers::Embedding;
using layers::PositionEmbedding;
} // namespace replica
