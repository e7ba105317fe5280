#pragma once
// What a backend's context provides to layers and models: the contract that cpu::Context and
// cuda::Context both satisfy (each static_asserts it). Layer code is written against it; what only
// one backend has (CUDA graphs, the copy stream, convolution plans) is not part of it.
//
// A context is a handle to one replica's device and its queue of work. Copies are cheap and refer
// to the same device, queue and memory pool. "Queued" below means: ordered after the work queued
// before on the context's queue (the compute stream under CUDA) and possibly not finished when the
// call returns; on the CPU every call has finished when it returns.

#include <concepts>
#include <cstddef>
#include <type_traits>

#include "replica/core/config.hpp"
#include "replica/core/device.hpp"
#include "replica/core/event.hpp"
#include "replica/core/tensor.hpp"

namespace REPLICA_NAMESPACE::backend {

template <class C>
concept Context = std::copy_constructible<C> &&
    requires(const C& ctx, float* dst, const float* src, std::size_t n, core::Event event, int k) {
        // True when host pointers are valid in the context's kernels (inputs are used where they are,
        // never staged); a compile-time constant.
        typename std::bool_constant<C::host_visible>;
        // The device this context runs on; the same for every copy.
        { ctx.device() } -> std::same_as<const Device&>;
        // n zero-filled values in the context's memory, owned by the returned Buffer, which must not
        // outlive the context's last copy. May wait for queued work (a reused block may still be read).
        { ctx.template allocate<float>(n) } -> std::same_as<core::Buffer<float>>;
        // Host -> context memory: finished when it returns (the host values may be reused at once).
        ctx.upload(dst, src, n);
        // Context memory -> host: queued; synchronize() before reading dst.
        ctx.download(dst, src, n);
        // A pointer to n host values usable by the context's kernels: the host pointer itself where
        // host_visible, else `staging` (context memory of n values) filled by a queued copy; the host
        // values must stay unchanged until the work that reads them has finished.
        { ctx.stage(src, dst, n) } -> std::same_as<const float*>;
        // Makes the context's device current for the calling thread (before raw library calls).
        ctx.activate();
        // The host waits until everything queued so far has finished.
        ctx.synchronize();
        // An event at the end of the work queued so far, for another context's queue to wait for.
        // One per context, re-recorded: wait for it before the next mark().
        { ctx.mark() } -> std::same_as<core::Event>;
        // Work queued from now on waits for `event` (a null event: nothing to wait for).
        ctx.wait(event);
        // An event for the host (k = 0 or 1: two steps in flight), re-recorded: synchronize(event)
        // before the next mark_for_host(k) of the same k.
        { ctx.mark_for_host(k) } -> std::same_as<core::Event>;
        // The host waits until the work queued before `event` was made has finished.
        ctx.synchronize(event);
    };

} // namespace replica::backend
