#pragma once
// Communicators: sum gradient buffers across the replicas of a DataParallel. The interface every
// communicator implements (the host one here, cuda/nccl.hpp, cuda/shared_gpu.hpp, and over processes
// parallel/mpi.hpp), and the process group a run across processes provides; parallel/ re-exports
// them (parallel/communicator.hpp).
//
// The interface is NCCL's, in its two single-process forms:
//   group_all_reduce(buffers, count, bucket)  one thread calls for all ranks (ncclGroupStart/End style)
//   all_reduce(rank, buffer, count, bucket)   every rank calls from its own thread
// After either (on a GPU: once wait(rank) has ordered rank's later work after it), every rank's buffer
// holds the element-wise sum. `bucket` numbers the gradient bucket: produced(rank, bucket) says that
// rank's work producing it has been queued, so the reduction can start as soon as that work is done
// while later work runs. The host communicator sums in rank order, ((b0 + b1) + b2) + ..., in both
// forms, so SingleThread and Threaded dispatch agree bit for bit.
//
// A communicator is made for a BucketPlan: which ids are gradient buckets (the others are sync points,
// always summed as floats) and whether gradient buckets travel as bf16 (GradientReduction).

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "replica/core/config.hpp"
#include "replica/core/device.hpp"
#include "replica/core/error.hpp"
#include "replica/core/number.hpp"

namespace REPLICA_NAMESPACE::backend {

// How the all-reduce carries gradient buckets (DataParallelOptions::gradient_reduction).
//   fp32: summed as floats.
//   bf16: every replica's bucket is rounded to bf16 (to nearest, ties to even) before it is summed,
//         and every replica receives the sum rounded to bf16, widened back into its float gradient.
//         The host and shared-GPU communicators add the rounded values in float, in rank order, and
//         round once (sum_rounded_to_bf16); NCCL adds bf16 values hop by hop, rounding at each hop,
//         so its bits differ from theirs. Half the bytes on the wire; the gradient keeps 8
//         significant bits.
enum class GradientReduction { fp32, bf16 };

// What a communicator reduces: ids [0, buckets) are gradient buckets of at most `largest` floats,
// carried as `reduction` says; ids from `buckets` on are sync points (core/hook.hpp), always floats.
struct BucketPlan {
    std::size_t buckets = 0;
    std::size_t largest = 0;
    GradientReduction reduction = GradientReduction::fp32;

    bool in_bf16(std::size_t id) const { return reduction == GradientReduction::bf16 && id < buckets; }
};

// The bf16 rule for one element over the ranks' values b[0][i], b[1][i], ...: each rounded to bf16,
// added in float in rank order, the sum rounded to bf16 (returned as the float it widens to).
inline float sum_rounded_to_bf16(std::span<const float* const> b, std::size_t i)
{
    float s = core::round_through<core::bf16>(b[0][i]);
    for (std::size_t r = 1; r < b.size(); ++r) s += core::round_through<core::bf16>(b[r][i]);
    return core::round_through<core::bf16>(s);
}

class Communicator {
public:
    virtual ~Communicator() = default;
    virtual std::size_t size() const = 0;
    virtual void produced(std::size_t /*rank*/, std::size_t /*bucket*/) {}
    virtual void group_all_reduce(std::span<float* const> buffers, std::size_t count, std::size_t bucket) = 0;
    virtual void all_reduce(std::size_t rank, float* buffer, std::size_t count, std::size_t bucket) = 0;
    // Orders rank's work queued from now on after its reductions (a no-op where calls are synchronous).
    virtual void wait(std::size_t /*rank*/) {}
    // Releases every rank blocked in all_reduce with an Error (a peer failed and will not arrive).
    virtual void abort() = 0;

    // The reproducible mode's sum (one thread calls for all ranks): every rank's buffer of fixed-point
    // integers, in its replica's memory, becomes the element-wise sum over every replica of every
    // process. Integer addition is associative, so the result does not depend on the order or grouping
    // any implementation uses. On a GPU it is queued on the compute stream, after the work that wrote it.
    virtual void exact_all_reduce(std::span<std::int64_t* const> buffers, std::size_t count) = 0;

    // Several processes (ProcessGroup): sums, over the processes, of values that every local replica
    // already agrees on (a loss). One process: nothing to do.
    virtual void sum_across_processes(double* /*data*/, std::size_t /*count*/) {}
};

// A process's place among the processes of a run (MPI ranks): every process holds `local` replicas
// of a DataParallel; the global replica set is every replica of every process.
class ProcessGroup {
public:
    virtual ~ProcessGroup() = default;
    virtual int rank() const = 0;
    virtual int size() const = 0;
    // This process among the processes on its machine (to split the machine's GPUs between them).
    virtual int local_rank() const { return 0; }
    virtual int local_size() const { return 1; }
    // How long any wait for the other processes may last before it throws Error.
    virtual std::chrono::seconds timeout() const { return std::chrono::seconds(120); }

    // A communicator over every replica of every process, given the one over this process's replicas
    // (CPU replicas: host memory).
    virtual std::unique_ptr<Communicator> span(std::unique_ptr<Communicator> local, std::size_t local_replicas) = 0;
    // Rank 0's `bytes` bytes at `data`, on every process (an NCCL unique id).
    virtual void broadcast(void* data, std::size_t bytes) = 0;
    // In-place sums over the processes, bounded by timeout().
    virtual void sum(double* data, std::size_t count) = 0;
};

// This process's share of a machine's devices when local_size() processes run on it: a contiguous
// 1/local_size() of `machine` (every process must get as many), e.g. GPUs 2-3 of 4 for local rank 1
// of 2. One process per machine keeps them all; so does every process given the one CPU device.
inline std::vector<Device> process_devices(const ProcessGroup& processes, const std::vector<Device>& machine)
{
    if (machine.size() == 1 && machine.front().is_cpu()) return machine;
    const std::size_t local = std::size_t(processes.local_size()), mine = machine.size() / local;
    core::require(mine > 0 && machine.size() % local == 0,
                  std::to_string(local) + " processes on this machine cannot share its " + std::to_string(machine.size()) +
                      " devices evenly: start a number of processes per machine that divides it");
    const auto first = machine.begin() + std::ptrdiff_t(mine * std::size_t(processes.local_rank()));
    return {first, first + std::ptrdiff_t(mine)};
}

// Replicas in one process sharing host memory (CPU replicas).
class HostCommunicator final : public Communicator {
public:
    explicit HostCommunicator(std::size_t ranks, BucketPlan plan = {}) : buffers_(ranks), plan_(plan) {}

    std::size_t size() const override { return buffers_.size(); }

    void group_all_reduce(std::span<float* const> buffers, std::size_t count, std::size_t bucket) override
    {
        core::require(buffers.size() == size(), "group_all_reduce: one buffer per rank expected");
        if (plan_.in_bf16(bucket)) sum_range_bf16(buffers, 0, count);
        else sum_range(buffers, 0, count);
    }

    void exact_all_reduce(std::span<std::int64_t* const> buffers, std::size_t count) override
    {
        core::require(buffers.size() == size(), "exact_all_reduce: one buffer per rank expected");
        sum_range(buffers, 0, count);
    }

    // Each rank sums its own 1/size slice of the elements (in rank order), then all wait.
    void all_reduce(std::size_t rank, float* buffer, std::size_t count, std::size_t bucket) override
    {
        buffers_[rank] = buffer;
        arrive();
        const std::size_t per = (count + size() - 1) / size();
        const std::size_t begin = std::min(count, rank * per), end = std::min(count, begin + per);
        if (plan_.in_bf16(bucket)) sum_range_bf16(buffers_, begin, end);
        else sum_range<float>(buffers_, begin, end);
        arrive();
    }

    void abort() override
    {
        std::lock_guard lock(mutex_);
        aborted_ = true;
        cv_.notify_all();
    }

private:
    template <class T>
    static void sum_range(std::span<T* const> b, std::size_t begin, std::size_t end)
    {
        T* acc = b[0];
        for (std::size_t r = 1; r < b.size(); ++r)
            for (std::size_t i = begin; i < end; ++i) acc[i] += b[r][i];
        for (std::size_t r = 1; r < b.size(); ++r)
            std::copy(acc + begin, acc + end, b[r] + begin);
    }

    // Every element is read from every rank before it is written (a slice at a time in all_reduce).
    static void sum_range_bf16(std::span<float* const> b, std::size_t begin, std::size_t end)
    {
        const std::span<const float* const> in(b.data(), b.size());
        for (std::size_t i = begin; i < end; ++i) {
            const float s = sum_rounded_to_bf16(in, i);
            for (float* buffer : b) buffer[i] = s;
        }
    }

    // A reusable barrier that an abort can break.
    void arrive()
    {
        std::unique_lock lock(mutex_);
        if (aborted_) throw Error("all_reduce aborted: another replica failed (see its error)");
        const std::size_t phase = phase_;
        if (++arrived_ == size()) {
            arrived_ = 0;
            ++phase_;
            cv_.notify_all();
            return;
        }
        cv_.wait(lock, [&] { return phase_ != phase || aborted_; });
        if (phase_ == phase) throw Error("all_reduce aborted: another replica failed (see its error)");
    }

    std::vector<float*> buffers_;
    BucketPlan plan_;
    std::mutex mutex_;
    std::condition_variable cv_;
    std::size_t arrived_ = 0, phase_ = 0;
    bool aborted_ = false;
};

} // namespace replica::backend
