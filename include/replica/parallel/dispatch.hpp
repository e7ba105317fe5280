#pragma once
// Dispatch policies: how the work of a DataParallel's replicas is issued. Empty tag types.
//
//   SingleThread  one host thread issues every replica's work in turn (on GPUs: asynchronously, so the
//                 devices still run concurrently). No thread hand-offs: best when steps are short.
//   Threaded      one persistent worker thread per replica, created with the DataParallel and woken
//                 once per phase. Replicas' host work runs concurrently: best when it is long.
//
// Both give bit-identical parameters: gradients are summed in the same fixed order either way.

#include <concepts>

namespace replica::parallel {

struct SingleThread {
    static constexpr const char* name = "single";
};

struct Threaded {
    static constexpr const char* name = "threaded";
};

template <class T>
concept DispatchPolicy = std::same_as<T, SingleThread> || std::same_as<T, Threaded>;

} // namespace replica::parallel

namespace replica {
using parallel::SingleThread;
using parallel::Threaded;
} // namespace replica
