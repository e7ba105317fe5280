#pragma once
// What a model holds on a device, counted from its type: the bytes that auto_parallel compares with a
// memory budget (AutoOptions::memory_budget) for each layout it may choose.
//
//   model        parameters and their gradients (floats), and the products' 16-bit copy of the
//                parameters in a bf16 or fp16 model
//   optimizer    the optimizer's state: state_per_param floats for each trainable parameter held
//   activations  for `samples` samples in each of `slots` activation slots: the outputs every layer
//                keeps from forward to backward (kept_size, saved_size), the model's output and its
//                gradient, its input in the activations' type, and a device's copies of the input
//                and the labels (model/arena.hpp, model/stage.hpp)
//
// Scratch, which a layer holds only during its own call, is not counted: the figure is what a step
// keeps, a lower bound of its peak.

#include <cstddef>
#include <cstdint>
#include <string>

#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::parallel {

struct DeviceMemory {
    std::size_t model = 0;
    std::size_t optimizer = 0;
    std::size_t activations = 0;
    std::size_t total() const { return model + optimizer + activations; }
};

// Bytes of one sample's activations in model S (a Sequential: one Stage).
template <class S>
inline constexpr std::size_t activation_bytes_per_sample =
    sizeof(typename S::storage) * (S::chain::kept_size + 2 * S::output_shape::size + S::input_shape::size) +
    sizeof(float) * S::chain::saved_size + sizeof(typename S::input_element) * S::input_shape::size +
    sizeof(std::int32_t) * S::label_size;

// What model S holds on its device when it keeps the optimizer state of `trainable` of its trainable
// parameters and `slots` activation slots of `samples` samples each.
template <class S>
DeviceMemory memory_of(std::size_t samples, std::size_t slots, std::size_t state_per_param, std::size_t trainable)
{
    constexpr bool reduced = sizeof(typename S::storage) != sizeof(float);
    return {.model = S::param_count * (2 * sizeof(float) + (reduced ? sizeof(typename S::storage) : 0)),
            .optimizer = trainable * state_per_param * sizeof(float),
            .activations = slots * samples * activation_bytes_per_sample<S>};
}

// "1.25 GiB"-style text for a count of bytes.
inline std::string bytes_text(std::size_t bytes)
{
    const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = double(bytes);
    int u = 0;
    while (v >= 1024.0 && u < 4) v /= 1024.0, ++u;
    std::string s = std::to_string(v);
    return s.substr(0, s.find('.') + (u == 0 ? 0 : 3)) + " " + unit[u];
}

} // namespace replica::parallel
