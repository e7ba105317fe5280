#pragma once
// Small compile-time helpers.

#include <array>
#include <cstddef>
#include <tuple>
#include <utility>

#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::core {

// f(std::integral_constant<std::size_t, I>{}) for I = 0 .. N-1, in order.
template <std::size_t N, class F>
constexpr void static_for(F&& f)
{
    [&]<std::size_t... I>(std::index_sequence<I...>) { (f(std::integral_constant<std::size_t, I>{}), ...); }(
        std::make_index_sequence<N>{});
}

// The same, from N-1 down to 0.
template <std::size_t N, class F>
constexpr void static_for_reverse(F&& f)
{
    [&]<std::size_t... I>(std::index_sequence<I...>) {
        (f(std::integral_constant<std::size_t, N - 1 - I>{}), ...);
    }(std::make_index_sequence<N>{});
}

// Exclusive prefix sums of a list of sizes: offsets[i] = sum of sizes before i; offsets[N] = total.
template <std::size_t... Sizes>
inline constexpr std::array<std::size_t, sizeof...(Sizes) + 1> prefix_sums = [] {
    std::array<std::size_t, sizeof...(Sizes) + 1> out{};
    std::size_t sizes[] = {Sizes..., 0};
    for (std::size_t i = 0; i < sizeof...(Sizes); ++i) out[i + 1] = out[i] + sizes[i];
    return out;
}();

} // namespace replica::core
