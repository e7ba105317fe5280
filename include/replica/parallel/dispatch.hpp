#pragma once
// Dispatch policies: how the work of a DataParallel's replicas is issued. Each policy is a tag type
// whose nested Issuer carries everything that differs between them, so DataParallel never asks
// which one it holds:
//
//   SingleThread  one host thread issues every replica's work in turn (on GPUs: asynchronously, so the
//                 devices still run concurrently). No thread hand-offs: best when steps are short.
//   Threaded      one persistent worker thread per replica, created with the DataParallel and woken
//                 once per phase. Replicas' host work runs concurrently: best when it is long.
//
// An Issuer, made once per replica set (ReplicaSet, parallel/replica_set.hpp), offers:
//   Issuer(count, device)        for `count` replicas, the first on `device`
//   each(f)                      f(r) for every replica r; returns when all calls have returned
//   bucket_ready(comm, r, gradient, bucket, last)  replica r's backward completed gradient bucket
//                                `bucket` (a span of its buffer); `last`: the final bucket
//   after_backward(comm, buckets, gradient_of)     every replica's backward has been queued
//   queue_step(comm, count, queue, launch, mark)   one training step queued on every replica:
//                                queue(r, defer) queues replica r's step (returns the CUDA graph
//                                segments it left to launch(r, k) when it may defer), mark(r) after
//                                its reductions are ordered before what the host waits for.
//   sync(comm, r, data, count, id)  (Threaded only) sums a sync point's values (core/hook.hpp) over
//                                the replicas, in the middle of replica r's step. SingleThread cannot:
//                                its one thread would wait in replica 0's step for the others'.
// The tag says which: `static constexpr bool syncs_in_step`.
// Both give bit-identical parameters: gradients are summed in the same fixed order either way.

#include <concepts>

#include "replica/core/config.hpp"
#include "replica/parallel/dispatch/single_thread.hpp"
#include "replica/parallel/dispatch/threaded.hpp"

namespace REPLICA_NAMESPACE::parallel {

template <class T>
concept DispatchPolicy = requires {
    { T::name } -> std::convertible_to<const char*>;
    { T::syncs_in_step } -> std::convertible_to<bool>;
    typename T::Issuer;
};

} // namespace replica::parallel

namespace REPLICA_NAMESPACE {
using parallel::SingleThread;
using parallel::Threaded;
} // namespace replica
