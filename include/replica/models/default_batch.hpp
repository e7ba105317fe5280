#pragma once
// default_batch_size<M>: the batch size a standard network is usually trained with, carried by its
// type as the networks in DIGITS carried theirs.

#include <cstddef>

#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::models {

template <class M>
inline constexpr std::size_t default_batch_size = 0;   // 0: the model names none

} // namespace replica::models

namespace REPLICA_NAMESPACE {
using models::default_batch_size;
} // namespace replica
