#pragma once
// Dataset: samples in host memory, ready to train on; Batch: a view of some of them. Their inputs
// are floats; TokenDataset and TokenBatch hold token ids (std::int32_t) for a model with
// Input<Tokens<T>> (model/input.hpp): DatasetOf<E> and BatchOf<E>, E being the model's input_element.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "replica/core/checked.hpp"
#include "replica/core/config.hpp"
#include "replica/core/error.hpp"

namespace REPLICA_NAMESPACE::data {

// `count` samples: inputs (count, input_size) as E, labels (count, label_size) as class indices.
template <class E>
struct DatasetOf {
    using element = E;
    std::vector<E> inputs;
    std::vector<std::int32_t> labels;
    std::size_t count = 0;
    std::size_t input_size = 0;
    std::size_t label_size = 1;

    // Throws Error naming `which` ("the training set") unless inputs and labels hold exactly
    // count * input_size and count * label_size values (sizes checked for overflow).
    void check_sizes(const std::string& which) const
    {
        const std::size_t in = core::checked_mul(count, input_size, which + ": count x input_size");
        const std::size_t out = core::checked_mul(count, label_size, which + ": count x label_size");
        core::require(inputs.size() == in && labels.size() == out,
                      which + " holds " + std::to_string(inputs.size()) + " inputs and " +
                          std::to_string(labels.size()) + " labels, not count x input_size = " + std::to_string(in) +
                          " and count x label_size = " + std::to_string(out) + ": fill all four fields consistently");
    }

    // Throws Error naming `which`, the sample and the value when an input is NaN or infinite: training
    // on it would turn every parameter into NaN. One pass over the inputs; call it once per data set.
    // Token ids are checked against the model's vocabulary instead, at each call that takes them.
    void check_finite(const std::string& which) const
    {
        if constexpr (std::is_floating_point_v<E>)
            for (std::size_t i = 0; i < inputs.size(); ++i)
            if (!std::isfinite(inputs[i]))
                throw Error(which + ": input " + std::to_string(i % (input_size ? input_size : 1)) + " of sample " +
                            std::to_string(i / (input_size ? input_size : 1)) + " is " + std::to_string(inputs[i]) +
                            "; every input must be a finite number: fix or drop that sample before training");
    }

    // Samples [begin, begin + n) as a new data set; throws Error when out of range.
    DatasetOf slice(std::size_t begin, std::size_t n) const
    {
        core::require(begin <= count && n <= count - begin,
                      "slice [" + std::to_string(begin) + ", " + std::to_string(begin) + " + " + std::to_string(n) +
                          ") is outside the data set of " + std::to_string(count) + " samples");
        check_sizes("slice: the data set");
        DatasetOf out{{inputs.begin() + begin * input_size, inputs.begin() + (begin + n) * input_size},
                    {labels.begin() + begin * label_size, labels.begin() + (begin + n) * label_size},
                    n, input_size, label_size};
        return out;
    }
};

// n samples in host memory. first_sample is the global index of the first one in the run's stream
// of samples (epoch * samples per epoch + position): random choices (dropout) are keyed on it.
template <class E>
struct BatchOf {
    using element = E;
    const E* inputs = nullptr;            // (size, input_size)
    const std::int32_t* labels = nullptr; // (size, label_size)
    std::size_t size = 0;
    std::uint64_t first_sample = 0;
    std::uint64_t seed = 0;
};

using Dataset = DatasetOf<float>;
using TokenDataset = DatasetOf<std::int32_t>;
using Batch = BatchOf<float>;
using TokenBatch = BatchOf<std::int32_t>;

} // namespace replica::data

namespace REPLICA_NAMESPACE {
using data::Batch;
using data::BatchOf;
using data::Dataset;
using data::DatasetOf;
using data::TokenBatch;
using data::TokenDataset;
} // namespace replica
