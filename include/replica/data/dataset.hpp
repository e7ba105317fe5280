#pragma once
// Dataset: samples in host memory, ready to train on; Batch: a view of some of them.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "replica/core/error.hpp"

namespace replica::data {

// `count` samples: inputs (count, input_size) as float, labels (count, label_size) as class indices.
struct Dataset {
    std::vector<float> inputs;
    std::vector<std::int32_t> labels;
    std::size_t count = 0;
    std::size_t input_size = 0;
    std::size_t label_size = 1;

    // Samples [begin, begin + n) as a new data set; throws Error when out of range.
    Dataset slice(std::size_t begin, std::size_t n) const
    {
        core::require(begin <= count && n <= count - begin,
                      "slice [" + std::to_string(begin) + ", " + std::to_string(begin + n) +
                          ") is outside the data set of " + std::to_string(count) + " samples");
        Dataset out{{inputs.begin() + begin * input_size, inputs.begin() + (begin + n) * input_size},
                    {labels.begin() + begin * label_size, labels.begin() + (begin + n) * label_size},
                    n, input_size, label_size};
        return out;
    }
};

// n samples in host memory. first_sample is the global index of the first one in the run's stream
// of samples (epoch * samples per epoch + position): random choices (dropout) are keyed on it.
struct Batch {
    const float* inputs = nullptr;        // (size, input_size)
    const std::int32_t* labels = nullptr; // (size, label_size)
    std::size_t size = 0;
    std::uint64_t first_sample = 0;
    std::uint64_t seed = 0;
};

} // namespace replica::data

namespace replica {
using data::Batch;
using data::Dataset;
} // namespace replica
