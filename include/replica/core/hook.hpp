#pragma once
// Backward hooks. An op's backward calls hook(offset) once the parameter gradients from `offset` to
// the end of its model's gradient buffer are final, so that a caller (a data-parallel replica) can
// start reducing them while the rest of backward runs.
//
// A hook may also take part in a pass: hook_sync(hook, data, count, id) sums `count` floats at
// `data` over the replicas of a data-parallel step, in place, before any work queued after the call
// reads them (BatchNorm's statistics over the global batch). `id` numbers the model's sync points
// (0, 1, ...), the same on every replica. A hook without sync() (NoHook: one model alone) leaves
// the values as they are: the replica's own batch is then the whole batch.

#include <concepts>
#include <cstddef>

#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::core {

// The hook of a backward whose gradients nobody waits for.
struct NoHook {
    void operator()(std::size_t) const {}
    bool acts(std::size_t) const { return false; }
};

// Whether hook(from) would do anything now (a step replayed from CUDA graphs is cut only where it
// does); a hook that cannot say is assumed to act every time.
template <class Hook>
bool hook_acts(const Hook& hook, std::size_t from)
{
    if constexpr (requires { { hook.acts(from) } -> std::convertible_to<bool>; }) return hook.acts(from);
    else return true;
}

// Whether a hook sums values over replicas at sync points.
template <class Hook>
concept SyncingHook = requires(Hook& h, float* data, std::size_t n) { h.sync(data, n, n); };

template <class Hook>
void hook_sync(Hook& hook, float* data, std::size_t count, std::size_t id)
{
    if constexpr (SyncingHook<Hook>) hook.sync(data, count, id);
}

// What the parts of a composite op (a Residual's body, a Concat's branches, a nested model) get:
// the sync points of the model's hook, not its gradient offsets (those are the outer chain's).
template <class Hook>
struct SyncOnly {
    Hook* hook;
    void operator()(std::size_t) const {}
    bool acts(std::size_t) const { return false; }
    void sync(float* data, std::size_t count, std::size_t id) const
        requires SyncingHook<Hook>
    {
        hook->sync(data, count, id);
    }
};

} // namespace replica::core
