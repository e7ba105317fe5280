#pragma once
// TiedHead<E>: (positions, Dim) -> (positions, Vocab), y = x W^T with W the (Vocab, Dim) table of the
// layer E = Embedding<Vocab, Dim> before it in the same chain: GPT-2's language-model head, which
// shares the token embedding's matrix (nanoGPT's `lm_head.weight = wte.weight`) and has no bias. It
// owns no parameters: the model holds the table once (param_count, initialisation, the optimizer's
// state, checkpoints); the head reads it as its weight, and the table's gradient is the sum of both
// uses, the head's assigned first (layers/op.hpp's tied weights; model/parts.hpp finds the table).
// Over a (Dim) vector it is the same product for one position. E names its table by its type; two
// embeddings of one type in a chain are told apart by a tag of their own, Embedding<V, D, Tag>.
//
//   using Wte = Embedding<256, 128>;
//   using Gpt = Sequential<Input<Tokens<64>>, Wte, PositionEmbedding<64>, ..., LayerNorm<>,
//                          TiedHead<Wte>, SequenceCrossEntropy>;

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "replica/core/config.hpp"
#include "replica/layers/decode.hpp"
#include "replica/layers/op.hpp"

namespace REPLICA_NAMESPACE::layers {

template <class E>
struct TiedHead {
    static_assert(requires {
        E::vocabulary;
        E::dim;
        typename E::tag;
    }, "TiedHead<E>: E is the Embedding<Vocab, Dim> whose table the head shares, as written in the model");

    template <class In, class T = float>
    struct op : LeafOp {
        static_assert(In::rank == 1 || In::rank == 2, "TiedHead needs a (features) or (positions, features) input");
        static constexpr std::size_t rows = In::rank == 1 ? 1 : In::dims[0];   // positions a sample
        static constexpr std::size_t D = In::size / rows;
        static_assert(D == E::dim, "TiedHead<Embedding<Vocab, Dim>>: its input has other than Dim features a position: "
                                   "the last layer before the head must give the embedding's width");
        static constexpr std::size_t V = E::vocabulary;
        using tied_to = typename E::tag;
        using input_shape = In;
        using output_shape = std::conditional_t<In::rank == 1, Shape<V>, Shape<rows, V>>;
        static constexpr std::size_t param_count = 0;

        using LeafOp::LeafOp;
        void init(float*, std::uint64_t) const {}
        template <class Ctx>
        void forward(Ctx& ctx, const Pass&, const ForwardArgs<T>& a) const
        {
            linear_forward(ctx, int(D), int(V), a.weights, static_cast<const float*>(nullptr), a.x, a.y, a.n * rows);
        }
        // The table's gradient ASSIGNED (the embedding's backward, later, adds its own).
        template <class Ctx>
        void backward(Ctx& ctx, const Pass&, const BackwardArgs<T>& a) const
        {
            linear_backward(ctx, int(D), int(V), a.weights, a.x, a.dy, a.dx, a.dparams, static_cast<float*>(nullptr),
                            a.n * rows);
        }
        // One position (layers/decode.hpp): a.params is the table (the chain passes its home's).
        static void decode(const DecodeArgs& a)
            requires(In::rank == 2)
        {
            decode_linear(a.params, nullptr, a.x, a.y, D, V);
        }
    };
};

} // namespace replica::layers

namespace REPLICA_NAMESPACE {
using layers::TiedHead;
} // namespace replica
