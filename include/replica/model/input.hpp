#pragma once
// The entries of a model that are not layers:
//   Input<Dims...>   the first entry of every model (after a Precision, if any): the shape of one
//                    input sample, in floats.
//   Input<Tokens<T>> the same for a model of token ids: a sample is T ids (std::int32_t), and the
//                    model's first layer reads them (Embedding<Vocab, Dim>).
//
// A model's `input_element` (float or std::int32_t) is what every carrier of its inputs holds: Batch
// and TokenBatch, Dataset and TokenDataset (data/dataset.hpp), train_step, evaluate, predict, staging,
// DataParallel's scatter; giving floats to a token model, or ids to a float model, is a compile error.
//   Precision<T>     optional, before Input: the element type of the model's activations, float (the
//                    default), bf16 or fp16 (core/number.hpp). Parameters, their gradients, optimizer
//                    state and statistics stay float; convolutions and fully connected layers read a
//                    copy of the parameters in T and accumulate in float (docs/guide.md, "Precision").
//
//   using LeNetBf16 = Sequential<Precision<bf16>, Input<1, 28, 28>, Conv2d<20, 5>, ...>;
//   using LeNetBf16 = with_precision<LeNet, bf16>;   // the same, from an existing model type

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "replica/core/config.hpp"
#include "replica/core/error.hpp"
#include "replica/core/number.hpp"
#include "replica/core/shape.hpp"

namespace REPLICA_NAMESPACE::model {

// What Tokens<T> names: T token ids a sample (a value, so that Input<Tokens<T>> sits where
// Input<1, 28, 28>'s sizes do).
template <std::size_t T>
struct TokensOf {
    static_assert(T > 0, "Tokens<T>: a sample needs at least one token");
    static constexpr std::size_t length = T;
    // A member, so that a value of it is written with its contents wherever a compiler spells it out:
    // nvcc's host pass reads an empty class's value, TokensOf<T>(), as a function type.
    std::size_t ids = T;
};
template <std::size_t T>
inline constexpr TokensOf<T> Tokens{};

template <class T>
struct is_tokens : std::false_type {};
template <std::size_t T>
struct is_tokens<TokensOf<T>> : std::true_type {};

namespace detail {
template <auto... Dims>
struct float_entry {
    using shape = Shape<std::size_t(Dims)...>;
    using element = float;
};
template <auto... Dims>
struct token_entry {
    static_assert(sizeof...(Dims) == 1, "Tokens<T> stands alone: a token model's Input is Input<Tokens<T>>");
    using shape = Shape<std::remove_cvref_t<decltype((Dims, ...))>::length>;
    using element = std::int32_t;
};
} // namespace detail

// (remove_cvref: nvcc's host pass spells decltype(Dims) as decltype((Dims)), a reference to the value.)
template <auto... Dims>
struct Input : std::conditional_t<(is_tokens<std::remove_cvref_t<decltype(Dims)>>::value || ...), detail::token_entry<Dims...>,
                                  detail::float_entry<Dims...>> {};

template <class T>
struct is_input : std::false_type {};
template <auto... D>
struct is_input<Input<D...>> : std::true_type {};

// The input element a carrier holds (E) is the one the model reads (Model): a compile error that says
// the fix otherwise. The train/ and data/ functions that take a model's inputs call it.
template <class Model, class E>
consteval bool check_input_element()
{
    static_assert(!(std::is_same_v<Model, std::int32_t> && std::is_same_v<E, float>),
                  "this model reads token ids (Input<Tokens<T>>), not floats: give it std::int32_t ids, in a "
                  "TokenBatch or TokenDataset (data/dataset.hpp)");
    static_assert(!(std::is_same_v<Model, float> && std::is_same_v<E, std::int32_t>),
                  "this model reads floats (Input<Dims...>), not token ids: give it a Batch or Dataset of floats, or "
                  "begin the model with Input<Tokens<T>>, Embedding<Vocab, Dim> to read ids");
    static_assert(std::is_same_v<Model, E>, "a model's inputs are float (Input<Dims...>) or std::int32_t (Input<Tokens<T>>)");
    return true;
}

template <class T>
struct Precision {
    static_assert(core::Storage<T>, "Precision<T>: T is float, bf16 or fp16");
    using storage = T;
};

template <class T>
struct is_precision : std::false_type {};
template <class T>
struct is_precision<Precision<T>> : std::true_type {};

// The index of the first of `count` token ids (host memory) outside [0, vocabulary), or count.
inline std::size_t first_bad_token_id(const std::int32_t* ids, std::size_t count, std::size_t vocabulary)
{
    std::size_t i = 0;
    while (i < count && ids[i] >= 0 && std::size_t(ids[i]) < vocabulary) ++i;
    return i;
}

// Error naming the sample and position of the first of n samples of `length` token ids (host memory)
// outside [0, vocabulary).
inline void check_token_ids(const std::int32_t* ids, std::size_t n, std::size_t length, std::size_t vocabulary)
{
    if (const std::size_t i = first_bad_token_id(ids, n * length, vocabulary); i < n * length)
        throw Error("token id " + std::to_string(ids[i]) + " of sample " + std::to_string(i / length) + ", position " +
                        std::to_string(i % length) + " is outside the vocabulary [0, " + std::to_string(vocabulary) +
                        "): the data's tokenizer does not match the model's Embedding<Vocab, Dim>");
}

} // namespace replica::model

namespace REPLICA_NAMESPACE {
using core::bf16;
using core::fp16;
using model::Input;
using model::Precision;
using model::Tokens;
} // namespace replica
