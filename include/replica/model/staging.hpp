#pragma once
// Staging: where a model's inputs wait in its device's memory. On the CPU inputs are used where they
// are. On a GPU there are two staging buffers, one for each training step that can be in flight (a
// model queues the next step while this one computes: Sequential::step), used in turn:
//
//   auto [x, labels] = staging.take_for_step(ctx, batch.inputs, batch.labels, batch.size, slot);
//   auto [x, labels] = staging.take(ctx, inputs, labels, n);   // anything else: evaluate, predict
//   const T* x = staging.take_activations(ctx, activations, n);   // a nested model's input
//
// take_for_step() copies the batch into buffer `slot` on the context's copy stream, so that the copy
// overlaps the step before, and makes the compute stream wait for it. It does not wait for the
// compute stream: the caller guarantees that the work that last read that buffer has finished (the
// host waited for the step before the previous one). take() copies into buffer 0 on the compute
// stream, in order with everything queued before it. The host memory must stay unchanged until the
// step (or the call) that reads it has finished.

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "replica/core/config.hpp"
#include "replica/core/event.hpp"
#include "replica/core/tensor.hpp"

namespace REPLICA_NAMESPACE::model {

// E: the model's input element, float or std::int32_t (token ids).
template <class E, std::size_t InputSize, std::size_t LabelSize>
class Staging {
public:
    // Room for n samples in both buffers (device contexts; replaces them: nothing queued may still
    // read them).
    template <class Ctx>
    void reserve(Ctx& ctx, std::size_t n)
    {
        if constexpr (!Ctx::host_visible) {
            for (int slot : {0, 1}) {
                inputs_[slot] = ctx.template allocate<E>(n * InputSize);
                labels_[slot] = ctx.template allocate<std::int32_t>(n * LabelSize);
            }
        }
    }

    // A training step's n samples, in buffer `slot` (0 or 1) of the context's memory; see above.
    template <class Ctx>
    std::pair<const E*, const std::int32_t*> take_for_step(Ctx& ctx, const E* x, const std::int32_t* labels,
                                                               std::size_t n, int slot)
    {
        if constexpr (Ctx::host_visible) {
            return {x, labels};
        } else {
            ctx.begin_copies();
            ctx.copy_async(inputs_[slot].data(), x, n * InputSize);
            ctx.copy_async(labels_[slot].data(), labels, n * LabelSize);
            ctx.wait(ctx.end_copies());
            return {inputs_[slot].data(), labels_[slot].data()};
        }
    }

    // The n samples at x (and labels, unless null) in the context's memory, in order on the compute stream.
    template <class Ctx>
    std::pair<const E*, const std::int32_t*> take(Ctx& ctx, const E* x, const std::int32_t* labels, std::size_t n)
    {
        if constexpr (Ctx::host_visible) {
            return {x, labels};
        } else {
            ctx.stage(x, inputs_[0].data(), n * InputSize);
            if (labels) ctx.stage(labels, labels_[0].data(), n * LabelSize);
            return {inputs_[0].data(), labels_[0].data()};
        }
    }

    // A nested model's input: n samples of activations x (T, float or narrower), memory of this device
    // or another, in buffer 0 (as take's) or, on the CPU, where they are; in order on the compute stream.
    template <class T, class Ctx>
    const T* take_activations(Ctx& ctx, const T* x, std::size_t n)
    {
        static_assert(std::is_same_v<E, float> && sizeof(T) <= sizeof(float), "a buffer holds InputSize floats a sample");
        if constexpr (Ctx::host_visible) return x;
        else return ctx.stage(x, reinterpret_cast<T*>(inputs_[0].data()), n * InputSize);
    }

private:
    core::Buffer<E> inputs_[2];
    core::Buffer<std::int32_t> labels_[2];
};

} // namespace replica::model
