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

// How a split op (layers/tensor_parallel.hpp) holds its rank's share of a block of the whole layer's
// parameters: the whole block is `runs` runs of `ways` pieces of `piece` parameters, and rank r holds
// piece r of every run, one after another (runs x piece parameters). runs == 0: not split, every
// rank holds the whole block.
struct ParamSplit {
    std::size_t runs = 0;
    std::size_t piece = 0;
};

// `count` consecutive parameters of one kind: an op's param_blocks list them in order, their counts
// summing to its param_count.
struct ParamBlock {
    std::size_t count;
    ParamKind kind;
    ParamSplit split{};
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

// A run of parameters that one update treats alike, as the optimizers' kernels read it: parameters
// [begin, begin + count) of a slice (and their gradients), their optimizer state from parameter index
// `state` of the slice's state (state index state + j for parameter begin + j: frozen parameters have
// none), the weight decay multiplied by `decay` and the learning rate by `lr_scale`. Models make these
// tables at compile time (model/param_layout.hpp).
struct ParamSegment {
    std::size_t begin;
    std::size_t count;
    std::size_t state;
    float decay;
    float lr_scale;
};

// One segment of `count` parameters from the start of a slice, decayed and at the optimizer's rate:
// for calling an optimizer's apply() on a plain array.
constexpr ParamSegment whole_slice(std::size_t count) { return {0, count, 0, 1.0f, 1.0f}; }

// Where an update reads the gradient of parameter begin + j of a segment: at the same index (the
// model's gradient), or at its state index state + j (a sum kept beside the state, train/accumulate.hpp).
enum class GradientAt : std::uint8_t { params, state };

} // namespace replica::core

namespace REPLICA_NAMESPACE {
using core::ParamBlock;
using core::ParamKind;
using core::ParamSegment;
using core::Treatment;
} // namespace replica
