#pragma once
// make_communicator: the communicator for a set of replica contexts, in this process or (with a
// ProcessGroup) across processes. The one place that knows which communicators exist: host (CPU
// replicas; across processes layered over MPI) and, under nvcc, NCCL (GPU replicas, one NCCL
// communicator over every GPU of every process).

#include <memory>
#include <variant>
#include <vector>

#include "replica/backend/backend.hpp"
#include "replica/parallel/communicator.hpp"
#if defined(REPLICA_CUDA)
#include "replica/parallel/nccl.hpp"
#endif

namespace replica::parallel {

inline std::unique_ptr<Communicator> make_communicator(const std::vector<backend::AnyContext>& contexts,
                                                       std::size_t buckets, ProcessGroup* processes = nullptr)
{
    core::require(!contexts.empty(), "a communicator needs at least one replica");
    const auto kind = contexts.front().index();
    for (const auto& c : contexts)
        core::require(c.index() == kind, "DataParallel replicas must all be CPU or all CUDA devices");
    if (std::holds_alternative<backend::cpu::Context>(contexts.front())) {
        auto local = std::make_unique<HostCommunicator>(contexts.size());
        if (processes == nullptr) return local;
        return processes->span(std::move(local), contexts.size());
    }
#if defined(REPLICA_CUDA)
    std::vector<backend::cuda::Context> gpus;
    for (const auto& c : contexts) gpus.push_back(std::get<backend::cuda::Context>(c));
    if (processes != nullptr) return std::make_unique<NcclCommunicator>(std::move(gpus), buckets, *processes);
    return std::make_unique<NcclCommunicator>(std::move(gpus), buckets);
#else
    (void)buckets;
    throw Error("no communicator for these devices");
#endif
}

} // namespace replica::parallel
