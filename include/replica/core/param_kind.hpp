#pragma once
// What a parameter is, for the optimizer's rules (train/param_rules.hpp): every op states, at compile
// time, its parameters' kinds in the order of its flat slice (layers/op.hpp, `param_blocks`), and a
// rule turns (kind, layer id) into how the optimizer treats those parameters.
//   weight     a fully connected layer's matrix, a convolution's filters, attention's projections
//   bias       an additive term of a product (Linear's, Conv's)
//   scale      a normalisation's multiplier (BatchNorm's and LayerNorm's weight, gamma)
//   shift      a normalisation's additive term (their bias, beta)
//   embedding  a table looked up by index (token and position embeddings)

#include <cstddef>
#include <cstdint>

#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::core {

enum class ParamKind : std::uint8_t { weight, bias, scale, shift, embedding };

// `count` consecutive parameters of one kind: an op's param_blocks list them in order, their counts
// summing to its param_count.
struct ParamBlock {
    std::size_t count;
    ParamKind kind;
};

// How the optimizer treats a range of parameters: `decay` multiplies the optimizer's weight decay (0:
// none), `lr_scale` its learning rate; a frozen range is not updated, has no optimizer state and its
// gradient is not summed over replicas. A structural type: rules return it from constexpr functions.
struct Treatment {
    float decay = 1.0f;
    float lr_scale = 1.0f;
    bool frozen = false;
    friend constexpr bool operator==(const Treatment&, const Treatment&) = default;
};

} // namespace replica::core

namespace REPLICA_NAMESPACE {
using core::ParamBlock;
using core::ParamKind;
using core::Treatment;
} // namespace replica
