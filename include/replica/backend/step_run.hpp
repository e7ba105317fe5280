#pragma once
// How a training step is executed is the backend's business: eagerly on the CPU
// (backend/cpu/executor.hpp), replayed from CUDA graphs on a GPU (backend/cuda/graph_executor.hpp).
// A model describes the step and hands over its work:
//
//   std::size_t left = execute_step(ctx, StepRun{...}, work, hook);
//
// work(captured, hook) queues the step (forward, loss, backward) on ctx, calling hook(offset) as
// backward makes gradients final (core/hook.hpp). `captured` says that the work is being recorded
// for replay: it must then read the step's seed and first sample from the context's step parameters
// (the captured kernels' arguments are frozen), so it passes first_sample 0 to its kernels. The
// executor calls hook at the same points whether it runs, records or replays the work. With
// `defer`, a replayed step only says how many segments it left (launch_deferred_segment launches them).

#include <cstddef>
#include <cstdint>

#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::backend {

struct StepRun {
    std::uint64_t seed = 0;           // the step's seed and global first sample (dropout)
    std::uint64_t first_sample = 0;
    std::size_t n = 0;                // samples: with key, what a replayed step is kept under
    int key = 0;                      // the step slot (0, 1), or a negative number for other work
    int params_slot = 0;              // which of the two step-parameter slots the step reads
    bool capturable = true;           // false: run eagerly (work on other devices cannot be captured)
    bool defer = false;
};

} // namespace replica::backend
