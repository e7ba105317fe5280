#pragma once
// How the optimizer treats each parameter: a rule names, for each parameter kind (core/param_kind.hpp)
// and layer id, a Treatment: a factor on the optimizer's weight decay, one on its learning rate, or
// frozen. A model takes its rule as an entry of its type,
//   Sequential<ParamRule<DecayAll>, Input<1, 28, 28>, ...>      (or with_param_rule<Net, DecayAll>)
// and without one follows DecayWeights. Layer ids number the layers from 0 in the order they are
// written, depth first: a Residual's or Concat's parts, a nested model's layers and a nested
// DataParallel's model's layers each take ids of their own, a composite none.
//
// A rule is a type with `static constexpr core::Treatment treat(core::ParamKind, std::uint32_t layer)`;
// models evaluate it at compile time, so what it chooses costs nothing per step:
//   struct NoDecayOnEmbeddings {
//       static constexpr replica::Treatment treat(replica::ParamKind kind, std::uint32_t layer)
//       {
//           if (kind == replica::ParamKind::embedding) return {.decay = 0.0f};
//           return replica::DecayWeights::treat(kind, layer);
//       }
//   };

#include <concepts>
#include <cstdint>
#include <type_traits>

#include "replica/core/config.hpp"
#include "replica/core/param_kind.hpp"

namespace REPLICA_NAMESPACE::model {

template <class R>
concept ParamRuleType = requires(core::ParamKind kind, std::uint32_t layer) {
    { R::treat(kind, layer) } -> std::same_as<core::Treatment>;
};

// The default: weight decay on weights (matrices, filters, projections) and embeddings, none on biases
// and on normalisations' scale and shift, as the recipes of torchvision, nanoGPT and llm.c decay (llm.c
// and nanoGPT decay every parameter of two or more dimensions). Every parameter trains at the
// optimizer's rate.
struct DecayWeights {
    static constexpr core::Treatment treat(core::ParamKind kind, std::uint32_t)
    {
        const bool decayed = kind == core::ParamKind::weight || kind == core::ParamKind::embedding;
        return {.decay = decayed ? 1.0f : 0.0f};
    }
};

// Weight decay on every parameter: what a PyTorch optimizer given model.parameters() does.
struct DecayAll {
    static constexpr core::Treatment treat(core::ParamKind, std::uint32_t) { return {}; }
};

// Layers [Begin, End) frozen (fine-tuning the rest), the others as Then says.
template <std::uint32_t Begin, std::uint32_t End, ParamRuleType Then = DecayWeights>
struct FreezeLayers {
    static_assert(Begin < End, "FreezeLayers<Begin, End>: freeze at least one layer (Begin < End)");
    static constexpr core::Treatment treat(core::ParamKind kind, std::uint32_t layer)
    {
        if (layer >= Begin && layer < End) return {.frozen = true};
        return Then::treat(kind, layer);
    }
};

// A model's entry: its parameters follow rule R.
template <ParamRuleType R>
struct ParamRule {
    using rule = R;
};

template <class E>
struct is_param_rule : std::false_type {};
template <class R>
struct is_param_rule<ParamRule<R>> : std::true_type {};

} // namespace replica::model

namespace REPLICA_NAMESPACE {
using model::DecayAll;
using model::DecayWeights;
using model::FreezeLayers;
using model::ParamRule;
} // namespace replica
