#pragma once
// Backward hooks. An op's backward calls hook(offset) once the parameter gradients from `offset` to
// the end of its model's gradient buffer are final, so that a caller (a data-parallel replica) can
// start reducing them while the rest of backward runs.

#include <concepts>
#include <cstddef>

namespace replica::core {

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

} // namespace replica::core
