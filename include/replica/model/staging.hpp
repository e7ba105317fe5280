#pragma once
// Staging: where a model's inputs wait in its device's memory. On the CPU inputs are used where they
// are. On a GPU there are two staging buffers, so that the next step's batch (announced with
// announce()) is copied on the context's copy stream while this step computes:
//
//   staging.announce(next.inputs, next.labels, next.size);   // the step after the next one
//   auto [x, labels] = staging.take(ctx, batch.inputs, batch.labels, batch.size, capacity);
//
// take() returns the batch in device memory: copied ahead if it was announced (the compute stream
// waits for that copy), otherwise copied now on the compute stream; then it starts the announced
// copy into the other buffer. The compute stream waits for every copy ahead before going on, used or
// not, so no buffer is ever written while it is read. The announced host memory must stay unchanged
// until its step.

#include <cstddef>
#include <cstdint>
#include <utility>

#include "replica/core/event.hpp"
#include "replica/core/tensor.hpp"

namespace replica::model {

template <std::size_t InputSize, std::size_t LabelSize>
class Staging {
public:
    void announce(const float* x, const std::int32_t* labels, std::size_t n) { next_ = {x, labels, n, 0, {}}; }

    // Room for n samples in both buffers (device contexts; replaces them: call before take()).
    template <class Ctx>
    void reserve(Ctx& ctx, std::size_t n)
    {
        if constexpr (!Ctx::host_visible) {
            if (ahead_.x != nullptr) ctx.wait(ahead_.ready);   // a copy ahead must not land in freed memory
            ahead_ = {};
            for (int slot : {0, 1}) {
                inputs_[slot] = ctx.template allocate<float>(n * InputSize);
                labels_[slot] = ctx.template allocate<std::int32_t>(n * LabelSize);
            }
            capacity_ = n;
        }
    }

    // The n samples at x (and labels, unless null) in the context's memory; see above.
    template <class Ctx>
    std::pair<const float*, const std::int32_t*> take(Ctx& ctx, const float* x, const std::int32_t* labels, std::size_t n)
    {
        if constexpr (Ctx::host_visible) {
            return {x, labels};
        } else {
            const bool ready = ahead_.x != nullptr && ahead_.x == x && ahead_.labels == labels && ahead_.n == n;
            const int slot = ready ? ahead_.slot : ahead_.x != nullptr ? 1 - ahead_.slot : 0;
            if (ahead_.x != nullptr) ctx.wait(ahead_.ready);
            if (!ready) {
                ctx.stage(x, inputs_[slot].data(), n * InputSize);
                if (labels) ctx.stage(labels, labels_[slot].data(), n * LabelSize);
            }
            ahead_ = {};
            if (next_.x != nullptr && next_.n > 0 && next_.n <= capacity_) {
                const int other = 1 - slot;
                ctx.begin_copies();
                ctx.copy_async(inputs_[other].data(), next_.x, next_.n * InputSize);
                ctx.copy_async(labels_[other].data(), next_.labels, next_.n * LabelSize);
                ahead_ = {next_.x, next_.labels, next_.n, other, ctx.end_copies()};
            }
            next_ = {};
            return {inputs_[slot].data(), labels_[slot].data()};
        }
    }

    // Which buffer take() returned x in (0 or 1): CUDA graphs are kept per buffer.
    int slot_of(const float* x) const { return x == inputs_[0].data() ? 0 : 1; }

private:
    struct Copy {
        const float* x = nullptr;
        const std::int32_t* labels = nullptr;
        std::size_t n = 0;
        int slot = 0;
        core::Event ready = {};
    };
    core::Buffer<float> inputs_[2];
    core::Buffer<std::int32_t> labels_[2];
    std::size_t capacity_ = 0;
    Copy ahead_;   // being copied (or copied) into buffer ahead_.slot, for the step on ahead_.x
    Copy next_;    // announced: copied when the next step takes its input
};

} // namespace replica::model
