#pragma once
// Choosing among a library's algorithms by timing them as a training step runs them
// (Options::benchmark): cuDNN's convolution algorithms (conv/cudnn.hpp) and cuBLASLt's matrix products
// (linear.hpp). Each candidate of the library's own heuristic list is called four times in a CUDA
// graph and the graph replayed (called eagerly when graphs are off, so that the library's host work
// counts too); the fastest is kept unless the library's first choice is within 3%, so that near ties
// do not change from run to run. A candidate that cannot be captured is never chosen (the step's
// capture would fail), nor one whose first timed call takes over four times the best so far (not
// timed further). Choices are kept process-wide per kind of GPU and shape (measured_mutex guards
// them), so a model's replicas on identical GPUs run the same algorithms, and on disk for later runs
// (tuning.hpp). Only under nvcc.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <mutex>
#include <string>
#include <vector>

#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/handles.hpp"
#include "replica/backend/cuda/tuning.hpp"
#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::backend::cuda::detail {

// Zero-filled device memory for timing, stream-ordered (cudaMallocAsync, so that no call waits for
// the whole device, a peer's all-reduce included) and given back when the scratch goes (the caching
// allocator would keep it).
class TimingScratch {
public:
    TimingScratch(const Context& ctx, std::initializer_list<std::size_t> bytes)
    {
        core::require(!ctx.capturing(), "an algorithm was chosen while a step was captured in a CUDA graph");
        ctx.activate();
        // The kernels' times do not depend on values: zeros.
        for (std::size_t b : bytes) blocks_.push_back(make_async_block(b, ctx.stream()));
    }
    float* floats(std::size_t i) const { return static_cast<float*>(blocks_[i].get()); }
    void* bytes(std::size_t i) const { return blocks_[i].get(); }

private:
    std::vector<AsyncDeviceBlock> blocks_;
};

// The most workspace a candidate may ask for: a quarter of the free memory, and at most `most`.
inline std::size_t workspace_limit(std::size_t most)
{
    std::size_t free = 0, total = 0;
    REPLICA_CHECK(cudaMemGetInfo(&free, &total));
    return std::min(most, free / 4);
}

class CallTimer {
public:
    static constexpr double never = 1e30;

    explicit CallTimer(const Context& ctx) : ctx_(ctx), start_(make_event(cudaEventDefault)), stop_(make_event(cudaEventDefault)) {}

    // Of `count` candidates, the one to keep: time(i, give_up) gives candidate i's seconds per call
    // (seconds() below); candidate 0, the library's first choice, stays unless another is 3% faster.
    template <class Time>
    static int fastest(int count, Time&& time)
    {
        if (count <= 1) return 0;
        const double first = time(0, never);
        double best = first;
        int chosen = 0;
        for (int i = 1; i < count; ++i) {
            // An eager call takes up to ~0.1 ms of the library's host work more than a replayed one.
            const double t = time(i, 4.0 * best + 1e-4);
            if (t < best) {
                best = t;
                chosen = i;
            }
        }
        return clearly_faster(best, first) ? chosen : 0;
    }

    // Whether `seconds` beat `incumbent` by more than the margin that keeps near ties with the
    // incumbent (the library's first choice, or cuDNN against the products), so that they do not
    // change from run to run.
    static bool clearly_faster(double seconds, double incumbent) { return seconds * 1.03 < incumbent; }

    // Seconds per call of run() (which queues one call on the context's stream and says whether it
    // could) as a step runs it; `never` if it cannot run or be captured; the first timed call's
    // seconds if they exceed give_up. Counted in tuning_counts().candidates_timed.
    template <class Run>
    double seconds(Run&& run, double give_up)
    {
        ++tuning_counters().timed;
        cudaStream_t s = ctx_.stream();
        if (!run()) return never;   // loads its kernels
        REPLICA_CHECK(cudaEventRecord(start_, s));
        if (!run()) return never;
        REPLICA_CHECK(cudaEventRecord(stop_, s));
        const double once = elapsed();
        if (once > give_up) return once;
        double best = never;
        if (ctx_.options().graphs) {
            REPLICA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            bool ok = true;
            for (int k = 0; k < kCalls; ++k) ok = ok && run();
            cudaGraph_t raw = nullptr;
            const bool ended = cudaStreamEndCapture(s, &raw) == cudaSuccess;
            const Graph g(raw);
            cudaGraphExec_t raw_exec = nullptr;
            if (ended && ok && g && cudaGraphInstantiate(&raw_exec, g.get(), 0) == cudaSuccess) {
                const GraphExec exec(raw_exec);
                REPLICA_CHECK(cudaGraphLaunch(exec.get(), s));   // warm
                for (int r = 0; r < kRounds; ++r) {
                    REPLICA_CHECK(cudaEventRecord(start_, s));
                    REPLICA_CHECK(cudaGraphLaunch(exec.get(), s));
                    REPLICA_CHECK(cudaEventRecord(stop_, s));
                    best = std::min(best, elapsed() / kCalls);
                }
            }
            cudaGetLastError();   // a failed capture leaves an error to clear, and the stream usable
        } else {
            for (int r = 0; r < kRounds; ++r) {
                REPLICA_CHECK(cudaEventRecord(start_, s));
                for (int k = 0; k < kCalls; ++k)
                    if (!run()) return never;
                REPLICA_CHECK(cudaEventRecord(stop_, s));
                best = std::min(best, elapsed() / kCalls);
            }
        }
        return best;
    }

private:
    static constexpr int kCalls = 4, kRounds = 3;

    double elapsed() const
    {
        REPLICA_CHECK(cudaEventSynchronize(stop_));
        float ms = 0.0f;
        REPLICA_CHECK(cudaEventElapsedTime(&ms, start_, stop_));
        return ms * 1e-3;
    }

    const Context& ctx_;
    Event start_, stop_;
};

// What makes two GPUs time the same (Context::device_kind).
inline const std::string& device_kind(const Context& ctx) { return ctx.device_kind(); }

// Held while a choice is looked up or timed: one thread times a shape, the others then reuse it.
inline std::mutex& measured_mutex()
{
    static std::mutex m;
    return m;
}

} // namespace replica::backend::cuda::detail
