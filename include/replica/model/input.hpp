#pragma once
// The entries of a model that are not layers:
//   Input<Dims...>   the first entry of every model (after a Precision, if any): the shape of one
//                    input sample.
//   Precision<T>     optional, before Input: the element type of the model's activations, float (the
//                    default), bf16 or fp16 (core/number.hpp). Parameters, their gradients, optimizer
//                    state and statistics stay float; convolutions and fully connected layers read a
//                    copy of the parameters in T and accumulate in float (docs/guide.md, "Precision").
//
//   using LeNetBf16 = Sequential<Precision<bf16>, Input<1, 28, 28>, Conv2d<20, 5>, ...>;
//   using LeNetBf16 = with_precision<LeNet, bf16>;   // the same, from an existing model type

#include <cstddef>
#include <type_traits>

#include "replica/core/config.hpp"
#include "replica/core/number.hpp"
#include "replica/core/shape.hpp"

namespace REPLICA_NAMESPACE::model {

template <std::size_t... Dims>
struct Input {
    using shape = Shape<Dims...>;
};

template <class T>
struct is_input : std::false_type {};
template <std::size_t... D>
struct is_input<Input<D...>> : std::true_type {};

template <class T>
struct Precision {
    static_assert(core::Storage<T>, "Precision<T>: T is float, bf16 or fp16");
    using storage = T;
};

template <class T>
struct is_precision : std::false_type {};
template <class T>
struct is_precision<Precision<T>> : std::true_type {};

} // namespace replica::model

namespace REPLICA_NAMESPACE {
using core::bf16;
using core::fp16;
using model::Input;
using model::Precision;
} // namespace replica
