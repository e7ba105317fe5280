#pragma once
// Synthetic data sets for benchmarks and tests: random inputs and labels, a pure function of the seed.

#include <cstddef>
#include <cstdint>
#include <string>

#include "replica/core/checked.hpp"
#include "replica/core/config.hpp"
#include "replica/core/error.hpp"
#include "replica/core/rng.hpp"
#include "replica/data/dataset.hpp"

namespace REPLICA_NAMESPACE::data {

// `count` samples: input element e of sample s is 2 * random_uniform(seed, Stream::synthetic, 0, s, e) - 1,
// in [-1, 1); label j of sample s is random_bits(seed, Stream::synthetic, 1, s, j) % classes.
// Throws Error when a size or `classes` is 0, input_size or label_size exceeds 2^32, or count x a
// size overflows.
inline Dataset synthetic_dataset(std::size_t count, std::size_t input_size, std::size_t label_size,
                                 std::size_t classes, std::uint64_t seed)
{
    core::require(count > 0 && input_size > 0 && label_size > 0 && classes > 0,
                  "synthetic_dataset needs count, input_size, label_size and classes > 0, not " +
                      std::to_string(count) + ", " + std::to_string(input_size) + ", " +
                      std::to_string(label_size) + ", " + std::to_string(classes));
    core::require(input_size <= (std::uint64_t{1} << 32) && label_size <= (std::uint64_t{1} << 32),
                  "synthetic_dataset: input_size and label_size must be at most 2^32");
    Dataset set;
    set.count = count;
    set.input_size = input_size;
    set.label_size = label_size;
    set.inputs.resize(core::checked_mul(count, input_size, "synthetic_dataset: count x input_size"));
    set.labels.resize(core::checked_mul(count, label_size, "synthetic_dataset: count x label_size"));
    float* x = set.inputs.data();
    std::int32_t* y = set.labels.data();
    for (std::size_t s = 0; s < count; ++s) {
        for (std::size_t e = 0; e < input_size; ++e)
            *x++ = 2.0f * core::random_uniform(seed, core::Stream::synthetic, 0, s, std::uint32_t(e)) - 1.0f;
        for (std::size_t j = 0; j < label_size; ++j)
            *y++ = std::int32_t(core::random_bits(seed, core::Stream::synthetic, 1, s, std::uint32_t(j)) % classes);
    }
    return set;
}

} // namespace replica::data

namespace REPLICA_NAMESPACE {
using data::synthetic_dataset;
} // namespace replica
