#pragma once
// NcclCommunicator: GPU replicas, one NCCL communicator per GPU, created once for the device set:
// the GPUs of one process (ncclCommInitAll), or every GPU of every process of a ProcessGroup
// (ncclCommInitRank with a unique id that rank 0 broadcasts). Reductions run on each GPU's
// communication stream and start when the compute stream has produced the bucket (an event per rank
// and bucket), so they overlap the rest of backward. Across processes every wait on the GPUs is
// bounded (a watchdog in the contexts' synchronize).
//
// Gradient buckets in bf16 (BucketPlan, GradientReduction::bf16): on the communication stream, each
// rank's bucket is rounded into a bf16 buffer of its own (made once, as long as the largest bucket),
// all-reduced as ncclBfloat16 and widened back into the float gradient. The stream runs one bucket
// after the other, so one buffer a rank serves every bucket. NCCL adds bf16 values hop by hop (its
// ring or tree), rounding each partial sum: the bits differ from the host's rule, which rounds once.
// Only under nvcc.

#include <nccl.h>

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "replica/backend/communicator.hpp"
#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/handles.hpp"
#include "replica/backend/cuda/reduce.hpp"
#include "replica/core/backoff.hpp"
#include "replica/core/config.hpp"
#include "replica/core/number.hpp"

namespace REPLICA_NAMESPACE::backend::cuda {

namespace detail {
inline void check_nccl(ncclResult_t r, const char* call)
{
    if (r == ncclSuccess || r == ncclInProgress) return;
    throw Error(std::string(call) + " failed: " + ncclGetErrorString(r) +
                ". Rerun with NCCL_DEBUG=INFO for details (keep NCCL_NVLS_ENABLE=0)");
}
} // namespace detail

#define REPLICA_NCCL_CHECK(call) ::replica::backend::cuda::detail::check_nccl((call), #call)

namespace detail {
struct ReleaseNcclComm {
    void operator()(ncclComm_t c) const noexcept { ncclCommDestroy(c); }
};
} // namespace detail
// An NCCL communicator of one rank, destroyed with its owner (or aborted: abort()).
using NcclComm = Owned<ncclComm_t, detail::ReleaseNcclComm>;

class NcclCommunicator final : public Communicator {
public:
    // buckets: how many reductions (gradient buckets, then sync points) a step numbers; plan: which are
    // gradient buckets, and in which precision.
    NcclCommunicator(std::vector<Context> contexts, std::size_t buckets, BucketPlan plan = {})
        : ctx_(std::move(contexts)), plan_(plan)
    {
        std::vector<int> devices;
        for (const auto& c : ctx_) devices.push_back(c.device().index());
        std::vector<ncclComm_t> made(ctx_.size(), nullptr);
        REPLICA_NCCL_CHECK(ncclCommInitAll(made.data(), int(ctx_.size()), devices.data()));
        for (ncclComm_t c : made) comms_.emplace_back(c);
        make_events(buckets);
    }

    // Every GPU of every process: this process's GPUs are global ranks rank * local .. rank * local +
    // local - 1 of size * local (every process must hold as many). Losses are summed through
    // `processes`, which must outlive the communicator.
    NcclCommunicator(std::vector<Context> contexts, std::size_t buckets, ProcessGroup& processes, BucketPlan plan = {})
        : ctx_(std::move(contexts)), plan_(plan), processes_(&processes)
    {
        const double local = double(ctx_.size());
        double counts[2] = {local, local * local};   // equal counts everywhere iff size * sum(l^2) == sum(l)^2
        processes.sum(counts, 2);
        core::require(double(processes.size()) * counts[1] == counts[0] * counts[0],
                      "every process must hold as many GPUs (this one holds " + std::to_string(ctx_.size()) +
                          "): give each process the same number of devices");
        ncclUniqueId id{};
        if (processes.rank() == 0) REPLICA_NCCL_CHECK(ncclGetUniqueId(&id));
        processes.broadcast(&id, sizeof id);
        const int ranks = int(ctx_.size()) * processes.size(), first = int(ctx_.size()) * processes.rank();
        // Non-blocking initialisation, polled, so that a process that died before joining stops the
        // others after the group's timeout instead of leaving them in ncclCommInitRank for ever.
        ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
        config.blocking = 0;
        REPLICA_NCCL_CHECK(ncclGroupStart());
        for (std::size_t r = 0; r < ctx_.size(); ++r) {
            ctx_[r].activate();
            ncclComm_t c = nullptr;
            const ncclResult_t made = ncclCommInitRankConfig(&c, ranks, id, first + int(r), &config);
            comms_.emplace_back(c);   // owned before a failure throws
            REPLICA_NCCL_CHECK(made);
        }
        REPLICA_NCCL_CHECK(ncclGroupEnd());
        for (std::size_t r = 0; r < ctx_.size(); ++r) settle(r, "creating the NCCL communicator");
        make_events(buckets);
        for (std::size_t r = 0; r < ctx_.size(); ++r)
            ctx_[r].set_watchdog([this, r](double waited) { watch(r, waited); });
    }

private:
    // A non-blocking communicator (the one across processes) may answer a call with ncclInProgress:
    // wait until rank r's communicator has finished it before the next call, bounded by the group's
    // timeout, so that a process that died or never joined stops this one with an error.
    void settle(std::size_t r, const char* what)
    {
        if (processes_ == nullptr) return;   // blocking communicators: every call has finished
        const core::Backoff wait;
        for (;;) {
            ncclResult_t state = ncclInProgress;
            if (comms_[r]) REPLICA_NCCL_CHECK(ncclCommGetAsyncError(comms_[r], &state));
            if (state == ncclSuccess) return;
            const bool late = wait.waited() > double(processes_->timeout().count());
            if (state == ncclInProgress && !late) {
                wait.pause();
                continue;
            }
            abort();
            throw Error("rank " + std::to_string(processes_->rank()) + ": " + what +
                        (state != ncclInProgress ? std::string(" failed: ") + ncclGetErrorString(state)
                                                 : " got no answer from the other processes within " +
                                                       std::to_string(long(processes_->timeout().count())) + " s") +
                        " (a process died, hangs, or cannot reach this one); stopping (the last checkpoint is intact). "
                        "Rerun with NCCL_DEBUG=INFO for details");
        }
    }

    // Rank r's share of a reduction, on its communication stream with its device current: a bf16
    // bucket is rounded into wire_[r] (round_in), summed there as ncclBfloat16 and widened back
    // (widen_out, once NCCL has queued the sum: settle); anything else is summed as floats in place.
    void round_in(std::size_t r, const float* buffer, std::size_t count, std::size_t bucket)
    {
        if (!plan_.in_bf16(bucket)) return;
        core::require(count <= plan_.largest, "a bf16 all-reduce of " + std::to_string(count) + " values, more than "
                                              "the largest bucket's " + std::to_string(plan_.largest));
        round_to_bf16(buffer, wire_[r].data(), count, ctx_[r].comm_stream());
    }
    void sum(std::size_t r, float* buffer, std::size_t count, std::size_t bucket)
    {
        if (plan_.in_bf16(bucket))
            REPLICA_NCCL_CHECK(ncclAllReduce(wire_[r].data(), wire_[r].data(), count, ncclBfloat16, ncclSum, comms_[r],
                                             ctx_[r].comm_stream()));
        else
            REPLICA_NCCL_CHECK(ncclAllReduce(buffer, buffer, count, ncclFloat, ncclSum, comms_[r], ctx_[r].comm_stream()));
    }
    void widen_out(std::size_t r, float* buffer, std::size_t count, std::size_t bucket)
    {
        if (plan_.in_bf16(bucket)) widen_bf16(wire_[r].data(), buffer, count, ctx_[r].comm_stream());
    }

    void make_events(std::size_t buckets)
    {
        events_.resize(ctx_.size());
        done_.resize(ctx_.size());
        for (std::size_t r = 0; r < ctx_.size(); ++r) {
            events_[r].resize(std::max<std::size_t>(buckets, 1));
            for (auto& e : events_[r]) e = make_event(ctx_[r]);
            done_[r] = make_event(ctx_[r]);
            if (plan_.reduction == GradientReduction::bf16) wire_.push_back(ctx_[r].allocate<core::bf16>(plan_.largest));
        }
    }

    // While rank r's context waits: stop on an NCCL error or after the group's timeout.
    void watch(std::size_t r, double waited)
    {
        ncclResult_t state = ncclSuccess;
        if (comms_[r]) ncclCommGetAsyncError(comms_[r], &state);
        const bool failed = state != ncclSuccess && state != ncclInProgress;
        const double limit = double(processes_->timeout().count());
        if (!failed && waited <= limit) return;
        abort();
        const std::string who = "rank " + std::to_string(processes_->rank()) + ": ";
        if (failed)
            throw Error(who + "NCCL reported " + ncclGetErrorString(state) + " (a process died or the network failed); "
                        "stopping (the last checkpoint is intact). Rerun with NCCL_DEBUG=INFO for details");
        throw Error(who + "no answer from the other processes for " + std::to_string(long(limit)) +
                    " s in a gradient all-reduce: a process died or hangs; stopping (the last checkpoint is intact)");
    }

public:
    NcclCommunicator(const NcclCommunicator&) = delete;
    NcclCommunicator& operator=(const NcclCommunicator&) = delete;
    ~NcclCommunicator() override
    {
        for (std::size_t r = 0; r < ctx_.size(); ++r) {
            ctx_[r].set_watchdog(nullptr);
            cudaSetDevice(ctx_[r].device().index());
            cudaStreamSynchronize(ctx_[r].comm_stream());
            events_[r].clear();
            done_[r].reset();
            comms_[r].reset();
        }
    }

    std::size_t size() const override { return ctx_.size(); }

    void produced(std::size_t rank, std::size_t bucket) override
    {
        ctx_[rank].activate();
        REPLICA_CHECK(cudaEventRecord(events_[rank][bucket], ctx_[rank].stream()));
    }

    void group_all_reduce(std::span<float* const> buffers, std::size_t count, std::size_t bucket) override
    {
        for (std::size_t r = 0; r < size(); ++r) {
            ctx_[r].activate();
            REPLICA_CHECK(cudaStreamWaitEvent(ctx_[r].comm_stream(), events_[r][bucket], 0));
            round_in(r, buffers[r], count, bucket);   // kernels outside the group
        }
        REPLICA_NCCL_CHECK(ncclGroupStart());
        for (std::size_t r = 0; r < size(); ++r) sum(r, buffers[r], count, bucket);
        REPLICA_NCCL_CHECK(ncclGroupEnd());
        for (std::size_t r = 0; r < size(); ++r) {
            settle(r, "a gradient all-reduce");
            ctx_[r].activate();
            widen_out(r, buffers[r], count, bucket);
        }
    }

    void all_reduce(std::size_t rank, float* buffer, std::size_t count, std::size_t bucket) override
    {
        produced(rank, bucket);
        REPLICA_CHECK(cudaStreamWaitEvent(ctx_[rank].comm_stream(), events_[rank][bucket], 0));
        round_in(rank, buffer, count, bucket);
        sum(rank, buffer, count, bucket);
        settle(rank, "a gradient all-reduce");
        widen_out(rank, buffer, count, bucket);
    }

    // On the compute streams: ordered after the shard loop that wrote the buffers and before the
    // conversion back to float, with no events needed.
    void exact_all_reduce(std::span<std::int64_t* const> buffers, std::size_t count) override
    {
        REPLICA_NCCL_CHECK(ncclGroupStart());
        for (std::size_t r = 0; r < size(); ++r)
            REPLICA_NCCL_CHECK(ncclAllReduce(buffers[r], buffers[r], count, ncclInt64, ncclSum, comms_[r], ctx_[r].stream()));
        REPLICA_NCCL_CHECK(ncclGroupEnd());
        for (std::size_t r = 0; r < size(); ++r) settle(r, "an exact all-reduce");
    }

    void wait(std::size_t rank) override
    {
        ctx_[rank].activate();
        REPLICA_CHECK(cudaEventRecord(done_[rank], ctx_[rank].comm_stream()));
        REPLICA_CHECK(cudaStreamWaitEvent(ctx_[rank].stream(), done_[rank], 0));
    }

    void abort() override
    {
        for (auto& c : comms_)
            if (c) ncclCommAbort(c.release());
    }

    void sum_across_processes(double* data, std::size_t count) override
    {
        if (processes_ != nullptr) processes_->sum(data, count);
    }

private:
    std::vector<Context> ctx_;
    std::vector<NcclComm> comms_;   // by rank; a constructor that throws destroys those it made
    std::vector<std::vector<Event>> events_;
    std::vector<Event> done_;
    BucketPlan plan_;
    std::vector<core::Buffer<core::bf16>> wire_;   // by rank: a bf16 bucket on its way (bf16 plans only)
    ProcessGroup* processes_ = nullptr;   // several processes
};

} // namespace replica::backend::cuda
