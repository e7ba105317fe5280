#pragma once
// SharedGpuCommunicator: the replicas of one process that share one GPU (a device list such as
// cuda:0,cuda:0), each with its own context (streams, allocator, CUDA graphs). NCCL takes one rank
// per GPU, so these replicas are summed by a kernel on the GPU instead (backend/cuda/reduce.hpp):
// every buffer becomes ((b0 + b1) + b2) + ..., in rank order, so SingleThread and Threaded dispatch
// get the same bits, and every replica gets the same floats. Gradient buckets in bf16 (BucketPlan)
// follow the host's bf16 rule, bit for bit.
//
// Gradient sums run on one stream, rank 0's communication stream, each after an event per rank and
// bucket that says the rank's compute stream has produced the bucket; wait(rank) orders the rank's
// later work after the last sum queued. So a sum overlaps the rest of backward, as NCCL's does. The
// reproducible mode's integer sum runs on rank 0's compute stream, ordered with the others' by events.
//
// Threaded dispatch (all_reduce from each replica's thread): the last rank to join a bucket queues
// its sum; an earlier one records its event and returns. A rank joins bucket b's next sum only once
// the one before it is queued (its event is then free to record again). wait(rank) blocks until
// every sum the rank has joined is queued, that is until every rank has joined them: the ranks of one
// step join the same buckets in the same order and the GPUs never wait for work not yet queued, so
// this cannot deadlock; abort() releases a rank blocked here with an Error. Every call is made
// outside a CUDA graph capture (the hook runs between captured segments). Only under nvcc.

#include <cuda_runtime.h>

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "replica/backend/communicator.hpp"
#include "replica/backend/cuda/check.hpp"
#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/handles.hpp"
#include "replica/backend/cuda/reduce.hpp"
#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::backend::cuda {

class SharedGpuCommunicator final : public Communicator {
public:
    // One context per replica, all of one GPU; buckets: how many reductions (gradient buckets, then
    // sync points) a step numbers; plan: which are gradient buckets, and in which precision.
    SharedGpuCommunicator(std::vector<Context> contexts, std::size_t buckets, BucketPlan plan = {})
        : ctx_(checked(std::move(contexts))), plan_(plan), rounds_(std::max<std::size_t>(buckets, 1)),
          joined_(ctx_.size(), std::vector<std::size_t>(rounds_.size(), 0)), summed_(make_event(ctx_.front())),
          exact_summed_(make_event(ctx_.front()))
    {
        produced_.resize(ctx_.size());
        for (auto& events : produced_)
            for (std::size_t b = 0; b < rounds_.size(); ++b) events.push_back(make_event(ctx_.front()));
        for (std::size_t r = 0; r < ctx_.size(); ++r) written_.push_back(make_event(ctx_.front()));
        for (auto& round : rounds_) round.buffers.assign(ctx_.size(), nullptr);
    }
    SharedGpuCommunicator(const SharedGpuCommunicator&) = delete;
    SharedGpuCommunicator& operator=(const SharedGpuCommunicator&) = delete;
    ~SharedGpuCommunicator() override
    {
        // The sums read and write the replicas' buffers, which may be freed once this is gone.
        cudaSetDevice(ctx_.front().device().index());
        cudaStreamSynchronize(ctx_.front().comm_stream());
        cudaStreamSynchronize(ctx_.front().stream());
    }

    std::size_t size() const override { return ctx_.size(); }

    void produced(std::size_t rank, std::size_t bucket) override
    {
        check_bucket(bucket);
        ctx_.front().activate();
        REPLICA_CHECK(cudaEventRecord(produced_[rank][bucket].get(), ctx_[rank].stream()));
    }

    // Every rank's produced(rank, bucket) has been called.
    void group_all_reduce(std::span<float* const> buffers, std::size_t count, std::size_t bucket) override
    {
        core::require(buffers.size() == size(), "group_all_reduce: one buffer per rank expected");
        check_bucket(bucket);
        std::lock_guard lock(mutex_);
        throw_if_aborted();
        ctx_.front().activate();
        sum(buffers, count, bucket);
    }

    void all_reduce(std::size_t rank, float* buffer, std::size_t count, std::size_t bucket) override
    {
        check_bucket(bucket);
        std::unique_lock lock(mutex_);
        Round& round = rounds_[bucket];
        // This rank's previous sum of the bucket must be queued before its event is recorded again.
        cv_.wait(lock, [&] { return aborted_ || round.queued == joined_[rank][bucket]; });
        throw_if_aborted();
        if (round.arrived == 0) round.count = count;
        core::require(round.count == count, "all_reduce: rank " + std::to_string(rank) + " reduces " + std::to_string(count) +
                                                " values of bucket " + std::to_string(bucket) + ", another rank " +
                                                std::to_string(round.count));
        ctx_.front().activate();
        REPLICA_CHECK(cudaEventRecord(produced_[rank][bucket].get(), ctx_[rank].stream()));
        round.buffers[rank] = buffer;
        ++joined_[rank][bucket];
        if (++round.arrived < size()) return;
        sum(round.buffers, count, bucket);
        round.arrived = 0;
        ++round.queued;
        cv_.notify_all();
    }

    // Waits (on the host) until every sum `rank` has joined is queued, then orders the rank's compute
    // stream after them.
    void wait(std::size_t rank) override
    {
        std::unique_lock lock(mutex_);
        auto all_queued = [&] {
            for (std::size_t b = 0; b < rounds_.size(); ++b)
                if (rounds_[b].queued < joined_[rank][b]) return false;
            return true;
        };
        cv_.wait(lock, [&] { return aborted_ || all_queued(); });
        if (!all_queued()) throw_if_aborted();
        ctx_.front().activate();
        REPLICA_CHECK(cudaStreamWaitEvent(ctx_[rank].stream(), summed_.get(), 0));
    }

    void abort() override
    {
        std::lock_guard lock(mutex_);
        aborted_ = true;
        cv_.notify_all();
    }

    // On the compute streams: rank 0's waits for every rank's work so far, sums, and every rank's later
    // work waits for the sum.
    void exact_all_reduce(std::span<std::int64_t* const> buffers, std::size_t count) override
    {
        core::require(buffers.size() == size(), "exact_all_reduce: one buffer per rank expected");
        std::lock_guard lock(mutex_);
        throw_if_aborted();
        ctx_.front().activate();
        const cudaStream_t first = ctx_.front().stream();
        for (std::size_t r = 1; r < size(); ++r) {
            REPLICA_CHECK(cudaEventRecord(written_[r].get(), ctx_[r].stream()));
            REPLICA_CHECK(cudaStreamWaitEvent(first, written_[r].get(), 0));
        }
        sum_into_each(buffers, count, first);
        REPLICA_CHECK(cudaEventRecord(exact_summed_.get(), first));
        for (std::size_t r = 1; r < size(); ++r) REPLICA_CHECK(cudaStreamWaitEvent(ctx_[r].stream(), exact_summed_.get(), 0));
    }

private:
    // Bucket b's sums: how many have been queued, and the one being joined (Threaded dispatch).
    struct Round {
        std::size_t queued = 0, arrived = 0, count = 0;
        std::vector<float*> buffers;   // by rank
    };

    static std::vector<Context> checked(std::vector<Context> ctx)
    {
        core::require(!ctx.empty(), "a communicator needs at least one replica");
        core::require(ctx.size() <= max_summed_buffers,
                      std::to_string(ctx.size()) + " replicas on " + ctx.front().device().name() + ": at most " +
                          std::to_string(max_summed_buffers) + " replicas can share one GPU");
        for (const auto& c : ctx)
            core::require(c.device() == ctx.front().device(),
                          "SharedGpuCommunicator: every replica must be on one GPU (got " + ctx.front().device().name() +
                              " and " + c.device().name() + ")");
        return ctx;
    }
    void check_bucket(std::size_t bucket) const
    {
        core::require(bucket < rounds_.size(), "bucket " + std::to_string(bucket) + " of a communicator made for " +
                                                   std::to_string(rounds_.size()));
    }
    void throw_if_aborted() const
    {
        if (aborted_) throw Error("all_reduce aborted: another replica failed (see its error)");
    }

    // With the mutex held and the device current: on rank 0's communication stream, after every
    // rank's produced event of the bucket, the sum into every buffer; then summed_ marks it.
    void sum(std::span<float* const> buffers, std::size_t count, std::size_t bucket)
    {
        const cudaStream_t comm = ctx_.front().comm_stream();
        for (std::size_t r = 0; r < size(); ++r) REPLICA_CHECK(cudaStreamWaitEvent(comm, produced_[r][bucket].get(), 0));
        if (plan_.in_bf16(bucket)) sum_into_each_bf16(buffers, count, comm);
        else sum_into_each(buffers, count, comm);
        REPLICA_CHECK(cudaEventRecord(summed_.get(), comm));
    }

    std::vector<Context> ctx_;
    BucketPlan plan_;
    std::vector<Round> rounds_;                                 // by bucket
    std::vector<std::vector<std::size_t>> joined_;              // [rank][bucket]: sums the rank has joined
    std::vector<std::vector<Event>> produced_;   // [rank][bucket]: the rank's bucket is written
    Event summed_;                               // after the last float sum queued
    std::vector<Event> written_;                 // exact_all_reduce: rank r's buffer written (r > 0)
    Event exact_summed_;                         // exact_all_reduce: after the sum
    std::mutex mutex_;
    std::condition_variable cv_;
    bool aborted_ = false;
};

} // namespace replica::backend::cuda
