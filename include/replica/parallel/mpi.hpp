#pragma once
// MpiProcessGroup: data parallelism over several processes (and machines), launched by mpirun or
// srun. Include it only in programs built with MPI (dependency('mpi')).
//
//   parallel::MpiProcessGroup processes(argc, argv);   // MPI_Init_thread .. MPI_Finalize
//   DataParallel<LeNet, Threaded> dp{{Device::cpu(0)}, 0, {.processes = &processes}};
//
// Every process passes the same global batch to train_step; each of its replicas reads only its
// global replica's share. Gradients are summed first over the process's replicas (host
// communicator), then over the processes (MPI_Iallreduce, one duplicated MPI communicator per local
// replica, so that local replicas reduce concurrently). Every wait for other processes is bounded:
// after `timeout` without an answer it throws Error naming the rank, instead of hanging.
//
// GPU replicas do not go through MPI: every GPU of every process joins one NCCL communicator whose
// unique id rank 0 broadcasts over MPI (backend/communicators.hpp); only losses are summed over MPI.

// The C API only: the deprecated C++ bindings warn under -Wextra.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "replica/core/backoff.hpp"
#include "replica/core/config.hpp"
#include "replica/parallel/communicator.hpp"

namespace REPLICA_NAMESPACE::parallel {

namespace detail {
inline void check_mpi(int code, const char* call)
{
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(code, text, &length);
    throw Error(std::string(call) + " failed: " + std::string(text, std::size_t(length)));
}

// In-place sum over the processes of comm, waiting at most `timeout` (then Error naming the rank).
inline void bounded_sum(void* data, std::size_t count, MPI_Datatype type, MPI_Comm comm, int rank,
                        std::chrono::seconds timeout)
{
    if (count == 0) return;
    MPI_Request request;
    check_mpi(MPI_Iallreduce(MPI_IN_PLACE, data, int(count), type, MPI_SUM, comm, &request), "MPI_Iallreduce");
    const core::Backoff wait;
    for (int done = 0;;) {
        check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
        if (done) return;
        if (wait.waited() > double(timeout.count()))
            throw Error("rank " + std::to_string(rank) + ": no answer from the other processes for " +
                        std::to_string(timeout.count()) + " s in a gradient all-reduce: a process died or "
                        "hangs; stopping (the last checkpoint is intact)");
        wait.pause();
    }
}
} // namespace detail

class MpiCommunicator final : public Communicator {
public:
    MpiCommunicator(std::unique_ptr<Communicator> local, std::size_t local_replicas, int rank, std::chrono::seconds timeout)
        : local_(std::move(local)), comms_(local_replicas), rank_(rank), timeout_(timeout)
    {
        for (auto& c : comms_) detail::check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &c), "MPI_Comm_dup");
    }
    MpiCommunicator(const MpiCommunicator&) = delete;
    MpiCommunicator& operator=(const MpiCommunicator&) = delete;
    ~MpiCommunicator() override
    {
        for (auto& c : comms_) MPI_Comm_free(&c);
    }

    std::size_t size() const override { return local_->size(); }

    void group_all_reduce(std::span<float* const> buffers, std::size_t count, std::size_t bucket) override
    {
        local_->group_all_reduce(buffers, count, bucket);
        reduce(buffers[0], count, MPI_FLOAT, comms_[0]);
        for (std::size_t r = 1; r < buffers.size(); ++r) std::copy(buffers[0], buffers[0] + count, buffers[r]);
    }

    // Local replicas agree after the local reduction; each then sums over the processes on its own
    // MPI communicator, with the same inputs and algorithm everywhere, so all get the same result.
    void all_reduce(std::size_t rank, float* buffer, std::size_t count, std::size_t bucket) override
    {
        local_->all_reduce(rank, buffer, count, bucket);
        reduce(buffer, count, MPI_FLOAT, comms_[rank]);
    }

    void abort() override { local_->abort(); }

    void sum_across_processes(double* data, std::size_t count) override { reduce(data, count, MPI_DOUBLE, comms_[0]); }

    void exact_all_reduce(std::span<std::int64_t* const> buffers, std::size_t count) override
    {
        local_->exact_all_reduce(buffers, count);
        reduce(buffers[0], count, MPI_INT64_T, comms_[0]);
        for (std::size_t r = 1; r < buffers.size(); ++r) std::copy(buffers[0], buffers[0] + count, buffers[r]);
    }

private:
    void reduce(void* data, std::size_t count, MPI_Datatype type, MPI_Comm comm)
    {
        detail::bounded_sum(data, count, type, comm, rank_, timeout_);
    }

    std::unique_ptr<Communicator> local_;
    std::vector<MPI_Comm> comms_;
    int rank_;
    std::chrono::seconds timeout_;
};

class MpiProcessGroup final : public ProcessGroup {
public:
    // Initialises MPI (with MPI_THREAD_MULTIPLE: Threaded replicas reduce from their own threads)
    // unless the program already did; finalises it if it initialised it.
    MpiProcessGroup(int& argc, char**& argv, std::chrono::seconds timeout = std::chrono::seconds(120)) : timeout_(timeout)
    {
        int ready = 0;
        MPI_Initialized(&ready);
        if (!ready) {
            int provided = 0;
            detail::check_mpi(MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
            owner_ = true;
            core::require(provided == MPI_THREAD_MULTIPLE,
                          "this MPI library does not support MPI_THREAD_MULTIPLE, which Threaded replicas need");
        }
        MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
        MPI_Comm_size(MPI_COMM_WORLD, &size_);
        MPI_Comm node;
        detail::check_mpi(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node),
                          "MPI_Comm_split_type");
        MPI_Comm_rank(node, &local_rank_);
        MPI_Comm_size(node, &local_size_);
        MPI_Comm_free(&node);
        detail::check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    }
    MpiProcessGroup(const MpiProcessGroup&) = delete;
    MpiProcessGroup& operator=(const MpiProcessGroup&) = delete;
    ~MpiProcessGroup() override
    {
        MPI_Comm_free(&comm_);
        if (owner_) MPI_Finalize();
    }

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    int local_rank() const override { return local_rank_; }
    int local_size() const override { return local_size_; }
    std::chrono::seconds timeout() const override { return timeout_; }

    void broadcast(void* data, std::size_t bytes) override
    {
        detail::check_mpi(MPI_Bcast(data, int(bytes), MPI_BYTE, 0, comm_), "MPI_Bcast");
    }
    void sum(double* data, std::size_t count) override
    {
        detail::bounded_sum(data, count, MPI_DOUBLE, comm_, rank_, timeout_);
    }

    std::unique_ptr<Communicator> span(std::unique_ptr<Communicator> local, std::size_t local_replicas) override
    {
        return std::make_unique<MpiCommunicator>(std::move(local), local_replicas, rank_, timeout_);
    }

private:
    std::chrono::seconds timeout_;
    bool owner_ = false;
    int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
    MPI_Comm comm_ = MPI_COMM_NULL;   // the group's own broadcasts and sums
};

} // namespace replica::parallel
