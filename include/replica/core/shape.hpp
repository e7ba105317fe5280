#pragma once
// Shape<Dims...>: the shape of ONE sample (the batch dimension is never part of a Shape).
//   Shape<1, 28, 28>  an image: channels, height, width
//   Shape<69, 1014>   a sequence: channels, length
//   Shape<10>         a vector

#include <array>
#include <concepts>
#include <cstddef>

#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE {

template <std::size_t... Dims>
struct Shape {
    static_assert(sizeof...(Dims) >= 1, "a Shape needs at least one dimension");
    static_assert(((Dims > 0) && ...), "every dimension of a Shape must be positive");

    static constexpr std::size_t rank = sizeof...(Dims);
    static constexpr std::size_t size = (Dims * ...);
    static constexpr std::array<std::size_t, rank> dims{Dims...};

    template <std::size_t I>
    static constexpr std::size_t dim = dims[I];

    // A sample as (channels, pixels): the first dimension and the rest; a vector is one pixel.
    static constexpr std::size_t channels = rank == 1 ? size : dims[0];
    static constexpr std::size_t pixels = size / channels;
};

namespace core {
template <class T>
struct is_shape : std::false_type {};
template <std::size_t... D>
struct is_shape<Shape<D...>> : std::true_type {};
} // namespace core

template <class T>
concept ShapeType = core::is_shape<T>::value;

} // namespace replica
