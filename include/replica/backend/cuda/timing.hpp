#pragma once
// Choosing among a library's algorithms by timing them as a training step runs them
// (Options::benchmark): cuDNN's convolution algorithms (conv.hpp) and cuBLASLt's matrix products
// (linear.hpp). Each candidate of the library's own heuristic list is called four times in a CUDA
// graph and the graph replayed (called eagerly when graphs are off, so that the library's host work
// counts too); the fastest is kept unless the library's first choice is within 3%, so that near ties
// do not change from run to run. A candidate that cannot be captured is never chosen (the step's
// capture would fail), nor one whose first timed call takes over four times the best so far (not
// timed further). Choices are kept process-wide per kind of GPU and shape (measured_mutex guards
// them), so a model's replicas on identical GPUs run the same algorithms. Only under nvcc.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <mutex>
#include <string>
#include <vector>

#include "replica/backend/cuda/context.hpp"

namespace replica::backend::cuda::detail {

// Zero-filled device memory for timing, stream-ordered (cudaMallocAsync, so that no call waits for
// the whole device, a peer's all-reduce included) and given back when the scratch goes (the caching
// allocator would keep it).
class TimingScratch {
public:
    TimingScratch(const Context& ctx, std::initializer_list<std::size_t> bytes) : stream_(ctx.stream())
    {
        core::require(!ctx.state().capturing, "an algorithm was chosen while a step was captured in a CUDA graph");
        ctx.activate();
        for (std::size_t b : bytes) {
            void* p = nullptr;
            if (b) {
                REPLICA_CHECK(cudaMallocAsync(&p, b, stream_));
                REPLICA_CHECK(cudaMemsetAsync(p, 0, b, stream_));   // the kernels' times do not depend on values
            }
            blocks_.push_back(p);
        }
    }
    TimingScratch(const TimingScratch&) = delete;
    TimingScratch& operator=(const TimingScratch&) = delete;
    ~TimingScratch()
    {
        for (void* p : blocks_)
            if (p) cudaFreeAsync(p, stream_);
    }
    float* floats(std::size_t i) const { return static_cast<float*>(blocks_[i]); }
    void* bytes(std::size_t i) const { return blocks_[i]; }

private:
    cudaStream_t stream_;
    std::vector<void*> blocks_;
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

    explicit CallTimer(const Context& ctx) : ctx_(ctx)
    {
        REPLICA_CHECK(cudaEventCreate(&start_));
        REPLICA_CHECK(cudaEventCreate(&stop_));
    }
    CallTimer(const CallTimer&) = delete;
    CallTimer& operator=(const CallTimer&) = delete;
    ~CallTimer()
    {
        cudaEventDestroy(start_);
        cudaEventDestroy(stop_);
    }

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
        return best * 1.03 < first ? chosen : 0;
    }

    // Seconds per call of run() (which queues one call on the context's stream and says whether it
    // could) as a step runs it; `never` if it cannot run or be captured; the first timed call's
    // seconds if they exceed give_up.
    template <class Run>
    double seconds(Run&& run, double give_up)
    {
        cudaStream_t s = ctx_.stream();
        if (!run()) return never;   // loads its kernels
        REPLICA_CHECK(cudaEventRecord(start_, s));
        if (!run()) return never;
        REPLICA_CHECK(cudaEventRecord(stop_, s));
        const double once = elapsed();
        if (once > give_up) return once;
        double best = never;
        if (ctx_.options().graphs) {
            cudaGraph_t g = nullptr;
            cudaGraphExec_t exec = nullptr;
            REPLICA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            bool ok = true;
            for (int k = 0; k < kCalls; ++k) ok = ok && run();
            if (cudaStreamEndCapture(s, &g) == cudaSuccess && ok && g && cudaGraphInstantiate(&exec, g, 0) == cudaSuccess) {
                REPLICA_CHECK(cudaGraphLaunch(exec, s));   // warm
                for (int r = 0; r < kRounds; ++r) {
                    REPLICA_CHECK(cudaEventRecord(start_, s));
                    REPLICA_CHECK(cudaGraphLaunch(exec, s));
                    REPLICA_CHECK(cudaEventRecord(stop_, s));
                    best = std::min(best, elapsed() / kCalls);
                }
            }
            if (exec) cudaGraphExecDestroy(exec);
            if (g) cudaGraphDestroy(g);
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
    cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// What makes two GPUs time the same: model, compute capability, multiprocessors (a MIG slice has fewer).
inline const std::string& device_kind(const Context& ctx)
{
    std::string& kind = ctx.state().kind;
    if (kind.empty()) {
        cudaDeviceProp prop{};
        REPLICA_CHECK(cudaGetDeviceProperties(&prop, ctx.device().index()));
        kind = std::string(prop.name) + " sm" + std::to_string(prop.major * 10 + prop.minor) + " " +
               std::to_string(prop.multiProcessorCount);
    }
    return kind;
}

// Held while a choice is looked up or timed: one thread times a shape, the others then reuse it.
inline std::mutex& measured_mutex()
{
    static std::mutex m;
    return m;
}

} // namespace replica::backend::cuda::detail
