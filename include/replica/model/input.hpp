#pragma once
// Input<Dims...>: the first entry of every model; declares the shape of one input sample.

#include <cstddef>

#include "replica/core/shape.hpp"

namespace replica::model {

template <std::size_t... Dims>
struct Input {
    using shape = Shape<Dims...>;
};

template <class T>
struct is_input : std::false_type {};
template <std::size_t... D>
struct is_input<Input<D...>> : std::true_type {};

} // namespace replica::model

namespace replica {
using model::Input;
} // namespace replica
