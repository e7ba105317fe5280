#pragma once
// Sequential<[Precision<T>], [ParamRule<R>], Input<...>, Layers..., [Loss]>: a model. Layers run one
// after the other; shapes, parameter count and the parameter layout are fixed at compile time. The loss
// ends the list, or is SoftmaxCrossEntropy when none is given; a Precision begins it, or activations are
// float (model/input.hpp); a ParamRule says how the optimizer treats each kind of parameter, or
// DecayWeights does (model/param_rules.hpp).
//
//   using LeNet = Sequential<Input<1, 28, 28>, Conv2d<20, 5>, MaxPool2d<2>, ..., Linear<10>>;
//   LeNet net{Device::cpu()};         // parameters initialised from seed 0
//
// A Sequential is also a layer: nested in another model (as a Concat branch, or a classifier after a
// DataParallel) it needs no Input; if it has one, it must match the shape that reaches it.
//
// As a model it is one Stage (model/stage.hpp), which owns its memory and runs its steps; this file
// is the description: the entries read into a chain of layers, a loss, an input element type and a
// parameter rule.

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "replica/core/config.hpp"
#include "replica/layers/loss.hpp"
#include "replica/model/chain.hpp"
#include "replica/model/input.hpp"
#include "replica/model/param_rules.hpp"
#include "replica/model/stage.hpp"

namespace REPLICA_NAMESPACE::model {

namespace detail {
template <class... Ts>
struct type_list {};

// The entries after Input, split into the layers and the loss (the last entry, if it is one).
template <class Done, class... Es>
struct split_loss;
template <class... Done>
struct split_loss<type_list<Done...>> {
    using layers = type_list<Done...>;
    using loss = ::replica::layers::SoftmaxCrossEntropy;
    static constexpr bool given = false;
};
template <class... Done, class L>
    requires ::replica::layers::Loss<L>
struct split_loss<type_list<Done...>, L> {
    using layers = type_list<Done...>;
    using loss = L;
    static constexpr bool given = true;
};
template <class... Done, class E, class... Rest>
struct split_loss<type_list<Done...>, E, Rest...> : split_loss<type_list<Done..., E>, Rest...> {};

// Token models (model/input.hpp): a layer that reads ids (Embedding) comes first, and only there.
template <bool Tokens, class... Ls>
constexpr bool token_layers_in_place(type_list<Ls...>)
{
    constexpr bool reads[] = {false, (::replica::layers::vocabulary_of<Ls> > 0)...};   // [0]: for no layers
    for (std::size_t i = 1; i <= sizeof...(Ls); ++i)
        if (reads[i] && !(Tokens && i == 1)) return false;
    return true;
}
template <class L, class... Ls>
constexpr std::size_t first_vocabulary(type_list<L, Ls...>)
{
    return ::replica::layers::vocabulary_of<L>;
}
constexpr std::size_t first_vocabulary(type_list<>) { return 0; }

template <class In, class T, class Layers>
struct chain_of;
template <class In, class T, class... Ls>
struct chain_of<In, T, type_list<Ls...>> {
    using type = Chain<In, T, Ls...>;
};

// What a Sequential without Input has in place of a chain: it is a layer only, never a model.
struct NotAModel {
    using input_shape = Shape<1>;
    using output_shape = Shape<1>;
    using storage = float;
    static constexpr std::size_t param_count = 0, saved_size = 0, kept_size = 0, statistics_count = 0, syncs = 0;
    static constexpr bool spans_devices = false, may_hold_input = false, wants_channels_last = false;
    bool holds_input() const { return false; }
    explicit NotAModel(const Build&) {}
    void init(float*, std::uint64_t) const {}
    void init_statistics(float*) const {}
};

template <class... Es>
struct entries : split_loss<type_list<>, Es...> {
    static constexpr bool has_input = false, has_precision = false, has_param_rule = false;
    using param_rule = DecayWeights;
    using storage = float;
    using input_element = float;
    static constexpr std::size_t vocabulary = 0;
    template <class In, class T>
    using chain_from = typename chain_of<In, T, typename split_loss<type_list<>, Es...>::layers>::type;
    using chain = NotAModel;
};
template <class I, class... Es>
    requires is_input<I>::value
struct entries<I, Es...> : split_loss<type_list<>, Es...> {
    static constexpr bool has_input = true, has_precision = false, has_param_rule = false;
    using param_rule = DecayWeights;
    using storage = float;
    using input = I;
    using input_shape = typename I::shape;
    using input_element = typename I::element;
    static constexpr std::size_t vocabulary = first_vocabulary(typename split_loss<type_list<>, Es...>::layers{});
    template <class In, class T>
    using chain_from = typename chain_of<In, T, typename split_loss<type_list<>, Es...>::layers>::type;
    using chain = chain_from<input_shape, float>;
};
template <class P, class... Es>
    requires is_precision<P>::value
struct entries<P, Es...> : entries<Es...> {
    static constexpr bool has_precision = true;
    using storage = typename P::storage;
    using chain = typename entries<Es...>::template chain_from<typename entries<Es...>::input_shape, storage>;
};
template <class R, class... Es>
    requires is_param_rule<R>::value
struct entries<R, Es...> : entries<Es...> {
    static_assert(!entries<Es...>::has_precision,
                  "write Precision<T> before ParamRule<R>: Sequential<Precision<T>, ParamRule<R>, Input<...>, ...>");
    static_assert(!entries<Es...>::has_param_rule, "a model takes one ParamRule<R>: remove the others");
    static constexpr bool has_param_rule = true;
    using param_rule = typename R::rule;
};
} // namespace detail

template <class... Entries>
class Sequential : public Stage<detail::entries<Entries...>> {
    using entries = detail::entries<Entries...>;

public:
    // ---- as a layer ----
    template <class In>
    static constexpr bool input_matches()
    {
        if constexpr (entries::has_input) return std::is_same_v<typename entries::input_shape, In>;
        else return true;
    }

    template <class In, class T = float>
    struct op : entries::template chain_from<In, T> {
        static_assert(input_matches<In>(),
                      "a nested model's Input<...> does not match the shape that reaches it: fix the Input "
                      "or the layers before it");
        static_assert(!entries::given, "a loss ends the outermost model only: remove it from the nested Sequential");
        static_assert(!entries::has_precision,
                      "a nested Sequential computes in the precision of the model around it: remove its Precision<...>");
        static_assert(!entries::has_param_rule,
                      "a nested Sequential's parameters follow the ParamRule of the model around it: remove its ParamRule<...>");
        using entries::template chain_from<In, T>::chain_from;
    };

    // ---- as a model: one Stage (model/stage.hpp) ----
    using Stage<entries>::Stage;
    static_assert(!Sequential::reads_tokens || Sequential::vocabulary > 0,
                  "a model of token ids (Input<Tokens<T>>) begins with a layer that reads them: Embedding<Vocab, Dim>");
    static_assert(detail::token_layers_in_place<Sequential::reads_tokens>(typename entries::layers{}),
                  "Embedding reads token ids: it must be the first layer of the outermost model, after "
                  "Input<Tokens<T>> (Sequential<Input<Tokens<T>>, Embedding<Vocab, Dim>, ...>)");
};

template <class T>
struct is_sequential : std::false_type {};
template <class... E>
struct is_sequential<Sequential<E...>> : std::true_type {};

namespace detail {
template <class M, class T>
struct with_precision;
template <class... E, class T>
struct with_precision<Sequential<E...>, T> {
    using type = Sequential<Precision<T>, E...>;
};
template <class P, class... E, class T>
    requires is_precision<P>::value
struct with_precision<Sequential<P, E...>, T> {
    using type = Sequential<Precision<T>, E...>;
};
template <class... E>
struct with_precision<Sequential<E...>, float> {
    using type = Sequential<E...>;
};
template <class P, class... E>
    requires is_precision<P>::value
struct with_precision<Sequential<P, E...>, float> {
    using type = Sequential<E...>;
};
} // namespace detail

// Model M (a Sequential) with activations of type T: float, bf16 or fp16.
template <class M, class T>
using with_precision = typename detail::with_precision<M, T>::type;

namespace detail {
// Sequential<[Precision], ParamRule<R>, the rest>, whatever rule the model had.
template <class M, class R>
struct with_param_rule;
template <class... E, class R>
struct with_param_rule<Sequential<E...>, R> {
    using type = Sequential<ParamRule<R>, E...>;
};
template <class Old, class... E, class R>
    requires is_param_rule<Old>::value
struct with_param_rule<Sequential<Old, E...>, R> {
    using type = Sequential<ParamRule<R>, E...>;
};
template <class P, class... E, class R>
    requires is_precision<P>::value
struct with_param_rule<Sequential<P, E...>, R> {
    using type = typename with_precision<typename with_param_rule<Sequential<E...>, R>::type, typename P::storage>::type;
};
} // namespace detail

// Model M (a Sequential) whose parameters follow rule R (model/param_rules.hpp).
template <class M, ParamRuleType R>
using with_param_rule = typename detail::with_param_rule<M, R>::type;

} // namespace replica::model

namespace REPLICA_NAMESPACE {
using model::Sequential;
using model::with_param_rule;
using model::with_precision;
} // namespace replica
