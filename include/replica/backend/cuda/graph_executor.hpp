#pragma once
// A training step on a GPU, replayed from CUDA graphs (Options::graphs; see backend/step_run.hpp).
//
// The first step of a key (batch size, step slot) runs eagerly: plans, workspaces and scratch grow
// then. The second is captured, and later ones replay it. The step's seed and first sample are
// copied into device memory first (set_step), where the captured kernels read them. Where the hook
// has work (core::hook_acts), the capture is cut: the segment so far is kept and launched, the hook
// runs eagerly (a data-parallel replica queues an all-reduce on its communication stream), and the
// capture goes on in a new segment; a replay launches the segments and calls the hook at the same
// cuts. So a graph never holds a collective, and communication still overlaps backward. Sync points
// (core/hook.hpp: BatchNorm's statistics summed over replicas) cut the capture the same way.

#include <cstddef>
#include <exception>
#include <string>

#include "replica/backend/cuda/context.hpp"
#include "replica/backend/step_run.hpp"
#include "replica/core/config.hpp"
#include "replica/core/error.hpp"
#include "replica/core/hook.hpp"

namespace REPLICA_NAMESPACE::backend::cuda {

namespace detail {
// One replayed segment, then the step's hook at its cut.
template <class Hook>
void launch_segment(Context& ctx, const Segment& segment, Hook& hook)
{
    ctx.launch(segment.exec);
    if (segment.sync.data) core::hook_sync(hook, segment.sync.data, segment.sync.count, segment.sync.id);
    else if (segment.cut != Segment::no_cut) hook(segment.cut);
}

// The hook a step being captured sees: where the step's own hook acts, the capture is cut.
template <class Hook>
struct CaptureCut {
    Context& ctx;
    const GraphKey& key;
    Hook& hook;
    bool in_hook = false;   // an error now is the hook's (a failed all-reduce), not the capture's

    void operator()(std::size_t from)
    {
        if (!core::hook_acts(hook, from)) return;
        ctx.end_segment(key, from);
        in_hook = true;
        hook(from);
        in_hook = false;
        ctx.begin_capture();
    }
    void sync(float* data, std::size_t count, std::size_t id)
        requires core::SyncingHook<Hook>
    {
        ctx.end_segment(key, Segment::no_cut, {data, count, id});
        in_hook = true;
        hook.sync(data, count, id);
        in_hook = false;
        ctx.begin_capture();
    }
};
} // namespace detail

template <class Work, class Hook>
std::size_t execute_step(Context& ctx, const StepRun& run, Work& work, Hook& hook)
{
    if (!run.capturable || !ctx.options().graphs) {
        work(false, hook);
        return 0;
    }
    const GraphKey key{run.n, run.key};
    ctx.set_step(run.params_slot, run.seed, run.first_sample);
    if (const auto* segments = ctx.graph(key)) {
        if (run.defer) return segments->size();   // launch_deferred_segment() launches them
        for (const auto& s : *segments) detail::launch_segment(ctx, s, hook);
        return 0;
    }
    if (ctx.first_time(key)) {
        work(false, hook);
        return 0;
    }
    detail::CaptureCut<Hook> cut{ctx, key, hook};
    ctx.begin_capture();
    try {
        work(true, cut);
        ctx.end_capture(key);
        return 0;
    } catch (const std::exception& e) {
        ctx.abandon_capture(key);
        if (cut.in_hook) throw;   // the hook's own error (a failed all-reduce), not the capture's
        throw Error(std::string("capturing a training step in a CUDA graph failed: ") + e.what() +
                    ". Turn backend::cuda::default_options().graphs off");
    }
}

// Segment k of the step that execute_step() left with `defer`.
template <class Hook>
void launch_deferred_segment(Context& ctx, const StepRun& run, std::size_t k, Hook& hook)
{
    detail::launch_segment(ctx, (*ctx.graph(GraphKey{run.n, run.key}))[k], hook);
}

} // namespace replica::backend::cuda
