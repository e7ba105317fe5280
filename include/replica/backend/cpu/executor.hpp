#pragma once
// The CPU executes a step as it is queued: every call has finished when it returns.

#include <cstddef>

#include "replica/backend/cpu/context.hpp"
#include "replica/backend/step_run.hpp"
#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::backend::cpu {

template <class Work, class Hook>
std::size_t execute_step(Context&, const StepRun&, Work& work, Hook& hook)
{
    work(false, hook);
    return 0;
}

// Nothing is ever deferred on the CPU.
template <class Hook>
void launch_deferred_segment(Context&, const StepRun&, std::size_t, Hook&) {}

} // namespace replica::backend::cpu
