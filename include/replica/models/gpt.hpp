#pragma once
// GPT-2 (Radford et al., 2019) as nanoGPT writes it: pre-LN transformer blocks, learned position
// embeddings, GELU's tanh form, a final LayerNorm and a head tied to the token embedding.
//
//   GPT<Layers, Heads, Dim, Context, Vocab>   token ids (Context) -> next-token logits (Context, Vocab),
//                                             trained with SequenceCrossEntropy
//   TransformerBlock<Heads, Dim>              x + attn(ln_1(x)), then that + mlp(ln_2(that)), the MLP
//                                             Dim -> 4 Dim -> GELU(tanh) -> Dim
//   GPT2Small = GPT<12, 12, 768, 1024, 50304> GPT-2 124M with its vocabulary of 50,257 padded to 50,304
//                                             (a multiple of 64, as llm.c and nanoGPT pad it)
//   CharGPT = GPT<4, 4, 128, 64, 256>         a byte-level model for the text demo (examples/train_gpt)
//
// Parameters are initialised as every layer's own rule says (Linear's PyTorch default, the embeddings
// N(0, 0.02)); GPT-2's scaled initialisation of the residual projections is not applied. There is no
// dropout (nanoGPT's default for GPT-2's training).

#include <cstddef>
#include <utility>

#include "replica/core/config.hpp"
#include "replica/layers/activation.hpp"
#include "replica/layers/attention.hpp"
#include "replica/layers/embedding.hpp"
#include "replica/layers/layer_norm.hpp"
#include "replica/layers/linear.hpp"
#include "replica/layers/loss.hpp"
#include "replica/layers/tied_head.hpp"
#include "replica/model/input.hpp"
#include "replica/model/residual.hpp"
#include "replica/model/sequential.hpp"
#include "replica/models/default_batch.hpp"

namespace REPLICA_NAMESPACE::models {

template <std::size_t Heads, std::size_t Dim>
using TransformerBlock =
    Sequential<Residual<Sequential<LayerNorm<>, CausalSelfAttention<Heads>>>,
               Residual<Sequential<LayerNorm<>, Linear<4 * Dim>, GELUWith<GeluApprox::tanh>, Linear<Dim>>>>;

namespace detail {
template <std::size_t, class T>
struct repeated {
    using type = T;
};
template <class Indices, std::size_t Heads, std::size_t Dim, std::size_t Context, std::size_t Vocab>
struct GPTOf;
template <std::size_t... I, std::size_t Heads, std::size_t Dim, std::size_t Context, std::size_t Vocab>
struct GPTOf<std::index_sequence<I...>, Heads, Dim, Context, Vocab> {
    using token_embedding = Embedding<Vocab, Dim>;
    using type = Sequential<Input<Tokens<Context>>, token_embedding, PositionEmbedding<Context>,
                            typename repeated<I, TransformerBlock<Heads, Dim>>::type..., LayerNorm<>,
                            TiedHead<token_embedding>, SequenceCrossEntropy>;
};
} // namespace detail

template <std::size_t Layers, std::size_t Heads, std::size_t Dim, std::size_t Context, std::size_t Vocab>
using GPT = typename detail::GPTOf<std::make_index_sequence<Layers>, Heads, Dim, Context, Vocab>::type;

using GPT2Small = GPT<12, 12, 768, 1024, 50304>;
using CharGPT = GPT<4, 4, 128, 64, 256>;

static_assert(GPT2Small::param_count == 124'475'904,
              "GPT2Small must have GPT-2 124M's 124,475,904 parameters (vocabulary padded to 50,304, head tied)");

template <>
inline constexpr std::size_t default_batch_size<CharGPT> = 32;

} // namespace replica::models

namespace REPLICA_NAMESPACE {
using models::CharGPT;
using models::GPT;
using models::GPT2Small;
using models::TransformerBlock;
} // namespace replica
