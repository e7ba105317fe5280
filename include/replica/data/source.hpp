#pragma once
// SampleSource: samples made on demand (decoded from files, augmented) for the Loader to gather on
// its background thread. A Dataset in memory converts to one.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>

#include "replica/core/config.hpp"
#include "replica/core/error.hpp"
#include "replica/data/dataset.hpp"

namespace REPLICA_NAMESPACE::data {

// `count` samples of `input_size` inputs (E: floats, or token ids for SampleSourceOf<std::int32_t>)
// and `label_size` class indices. read(index, epoch, input,
// label) writes sample `index` (in [0, count)) as epoch `epoch` sees it into input[0, input_size) and
// label[0, label_size); it may throw Error (a file that cannot be read). The Loader calls it from its
// background thread, or from `threads` threads at once for different samples (decoding files); what
// it refers to must outlive the loaders that use it.
template <class E>
struct SampleSourceOf {
    using element = E;
    std::size_t count = 0;
    std::size_t input_size = 0;
    std::size_t label_size = 1;
    std::function<void(std::size_t index, std::uint64_t epoch, E* input, std::int32_t* label)> read;
    std::size_t threads = 1;   // how many threads the Loader may call read() from at once (> 1: read must allow it)

    SampleSourceOf() = default;
    SampleSourceOf(std::size_t count_, std::size_t input_size_, std::size_t label_size_,
                   std::function<void(std::size_t, std::uint64_t, E*, std::int32_t*)> read_)
        : count(count_), input_size(input_size_), label_size(label_size_), read(std::move(read_))
    {
    }

    // The samples of `set` as they are (the same in every epoch); `set` must outlive the source.
    // Throws Error when set holds other than count x input_size inputs and count x label_size labels,
    // or an input that is NaN or infinite.
    SampleSourceOf(const DatasetOf<E>& set) // NOLINT: implicit, so that a Dataset goes wherever a source does
        : count(checked(set).count), input_size(set.input_size), label_size(set.label_size),
          read([&set](std::size_t index, std::uint64_t, E* input, std::int32_t* label) {
              const std::size_t in = set.input_size, out = set.label_size;
              if (in) std::memcpy(input, set.inputs.data() + index * in, in * sizeof(E));
              if (out) std::memcpy(label, set.labels.data() + index * out, out * sizeof(std::int32_t));
          })
    {
    }

private:
    static const DatasetOf<E>& checked(const DatasetOf<E>& set)
    {
        set.check_sizes("the data set");
        set.check_finite("the data set");   // once, here: never per batch
        return set;
    }
};

using SampleSource = SampleSourceOf<float>;
using TokenSampleSource = SampleSourceOf<std::int32_t>;

} // namespace replica::data

namespace REPLICA_NAMESPACE {
using data::SampleSource;
using data::SampleSourceOf;
using data::TokenSampleSource;
} // namespace replica
