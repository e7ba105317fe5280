#pragma once
// The communicator interface and the process group of a run across processes, as parallel/ and its
// users name them. They are the backend's (backend/communicator.hpp): a communicator moves a
// backend's memory.

#include "replica/backend/communicator.hpp"
#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::parallel {

using backend::BucketPlan;
using backend::Communicator;
using backend::GradientReduction;
using backend::HostCommunicator;
using backend::process_devices;
using backend::ProcessGroup;

// The reproducible mode sums the gradient exactly (fixed point) and refuses a bf16 all-reduce, which
// would round it: throws Error unless `reduction` is fp32.
inline void check_reproducible_reduction(GradientReduction reduction)
{
    core::require(reduction == GradientReduction::fp32,
                  "the reproducible mode sums the gradient exactly, and a bf16 all-reduce would round it: set "
                  "DataParallelOptions::gradient_reduction to fp32 (the CLI: --gradient-reduction fp32), or train "
                  "without the reproducible mode");
}

} // namespace replica::parallel
