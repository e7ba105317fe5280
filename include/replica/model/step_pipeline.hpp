#pragma once
// The step pipeline: how a model keeps two training steps in flight, so that a GPU goes from one
// step to the next without waiting for the host. One mechanism for every model type:
//
//   StepSlots   one model's side (a Sequential, or each replica of a DataParallel): two step slots
//               taken in turn, each with its staging buffer (model/staging.hpp), its loss slot and
//               the event the host waits for; a third loss slot for evaluate().
//   QueueAhead  the step that was queued ahead and the rule that uses it:
//
//     slot = in was queued ahead ? its slot : queue(in)
//     if next: queue(next) after this step's update      (queued before the host waits)
//     else:    update()
//     return finish(slot)                                (the host waits for this step's loss only)
//
// A call on other data than the step queued ahead, or set_parameters() in between, drops the step
// queued ahead (the host waits for it and forgets it), and the step is computed again.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>

#include "replica/backend/backend.hpp"
#include "replica/core/config.hpp"
#include "replica/core/event.hpp"
#include "replica/core/loss_slot.hpp"
#include "replica/model/concepts.hpp"
#include "replica/model/staging.hpp"

namespace REPLICA_NAMESPACE::model {

template <class E, std::size_t InputSize, std::size_t LabelSize>
class StepSlots {
public:
    static constexpr int evaluation = 2;   // the loss slot of evaluate()

    // The slot of the next step queued: 0 and 1 in turn. At most two steps may be queued and not
    // finished; the slot's previous step has finished when it is taken again (the host waited for it).
    int next() { return slot_ = 1 - slot_; }
    // The slot of the last step queued.
    int last() const { return slot_; }

    core::LossSlot* loss(int slot) { return &losses_[std::size_t(slot)]; }
    Staging<E, InputSize, LabelSize>& staging() { return staging_; }

    // What the host waits for of the step in `slot`, once all of it is queued.
    template <class Ctx>
    void mark(Ctx& ctx, int slot) { marks_[slot] = ctx.mark_for_host(slot); }
    // Waits for it.
    template <class Ctx>
    void wait(Ctx& ctx, int slot) { ctx.synchronize(marks_[slot]); }

private:
    Staging<E, InputSize, LabelSize> staging_;   // inputs in device memory, one buffer a step in flight
    // Page-locked: the losses of the two steps that may be in flight (by slot), then evaluate()'s.
    core::Buffer<core::LossSlot> losses_ = backend::host_buffer<core::LossSlot>(3);
    core::Event marks_[2];
    int slot_ = 1;   // the first step takes 0
};

template <class E>
class QueueAhead {
public:
    // The rule above. queue(input, update_first) queues a step's work, after this step's update when
    // update_first is true, and returns its slot; update() queues this step's update alone;
    // finish(slot) waits for a slot's step and returns its loss.
    template <class Queue, class Update, class Finish>
    double step(const StepInput<E>& in, const StepInput<E>* next, Queue&& queue, Update&& update, Finish&& finish)
    {
        int slot = 0;
        if (ahead_ && ahead_->first == in) {
            slot = ahead_->second;
        } else {
            drop(finish);
            slot = queue(in, false);
        }
        ahead_.reset();
        if (next != nullptr && next->n > 0) ahead_.emplace(*next, queue(*next, true));
        else update();
        return finish(slot);
    }

    // Waits for the step queued ahead, if any (finish(slot)), and forgets it: its buffers are about
    // to be reused, or it computed with parameters that are about to change.
    template <class Finish>
    void drop(Finish&& finish)
    {
        if (ahead_) finish(ahead_->second);
        ahead_.reset();
    }

private:
    std::optional<std::pair<StepInput<E>, int>> ahead_;   // the step queued ahead, and its slot
};

} // namespace replica::model
