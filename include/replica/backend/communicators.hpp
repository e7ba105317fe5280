#pragma once
// make_communicator: the communicator for a set of replica contexts, in this process or (with a
// ProcessGroup) across processes. The one place that knows which communicators exist: host (CPU
// replicas; across processes layered over MPI) and, under nvcc, NCCL (GPU replicas on distinct GPUs,
// one NCCL communicator over every GPU of every process) and the shared-GPU one (replicas of one
// process sharing one GPU, summed on it: NCCL takes one rank per GPU).

#include <memory>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "replica/backend/backend.hpp"
#include "replica/backend/communicator.hpp"
#if defined(REPLICA_CUDA)
#include "replica/backend/cuda/nccl.hpp"
#include "replica/backend/cuda/shared_gpu.hpp"
#include "replica/core/config.hpp"
#endif

namespace REPLICA_NAMESPACE::backend {

namespace detail {
inline std::string device_list(std::span<const Device> devices)
{
    std::string s;
    for (std::size_t i = 0; i < devices.size(); ++i) s += (i ? "," : "") + devices[i].name();
    return s;
}
} // namespace detail

// True when `devices` names one GPU more than once and nothing else (its replicas share it).
inline bool shares_one_gpu(std::span<const Device> devices)
{
    if (devices.size() < 2 || !devices.front().is_cuda()) return false;
    for (const auto& d : devices)
        if (!(d == devices.front())) return false;
    return true;
}

// The replica device lists a communicator exists for: CPU devices; distinct GPUs (NCCL, in one process
// or across processes); one GPU named several times, in one process. Anything else throws an Error
// that says what to change.
inline void check_communicator_devices(std::span<const Device> devices, bool across_processes)
{
    core::require(!devices.empty(), "a communicator needs at least one replica");
    for (const auto& d : devices)
        core::require(d.kind() == devices.front().kind(),
                      "DataParallel replicas must all be CPU or all CUDA devices (got " + detail::device_list(devices) +
                          "): list cpu:N devices only, or cuda:N devices only");
    if (devices.front().is_cpu()) return;
    bool repeats = false;
    for (std::size_t i = 0; i < devices.size(); ++i)
        for (std::size_t j = 0; j < i; ++j) repeats = repeats || devices[i] == devices[j];
    if (!repeats) return;
    core::require(shares_one_gpu(devices),
                  "the device list " + detail::device_list(devices) + " repeats a GPU and names others: replicas can "
                  "share a GPU only when all of them are on it (as cuda:0,cuda:0); list distinct GPUs, or one GPU "
                  "once per replica");
    core::require(!across_processes,
                  "replicas sharing a GPU (" + detail::device_list(devices) + ") cannot span processes: NCCL takes one "
                  "rank per GPU; give each process distinct GPUs, or train in one process");
}

// `ids`: how many reductions a step numbers (gradient buckets, then sync points); `plan`: which of them
// are gradient buckets and how they travel (GradientReduction).
inline std::unique_ptr<Communicator> make_communicator(const std::vector<backend::AnyContext>& contexts,
                                                       std::size_t ids, ProcessGroup* processes = nullptr,
                                                       BucketPlan plan = {})
{
    std::vector<Device> devices;
    for (const auto& c : contexts) devices.push_back(std::visit([](const auto& ctx) { return ctx.device(); }, c));
    check_communicator_devices(devices, processes != nullptr);
    if (std::holds_alternative<cpu::Context>(contexts.front())) {
        auto local = std::make_unique<HostCommunicator>(contexts.size(), plan);
        if (processes == nullptr) return local;
        core::require(plan.reduction == GradientReduction::fp32,
                      "gradient_reduction bf16 across processes is carried by NCCL (GPU replicas) only: CPU replicas "
                      "over MPI reduce in fp32; leave gradient_reduction at fp32, or train in one process");
        return processes->span(std::move(local), contexts.size());
    }
#if defined(REPLICA_CUDA)
    std::vector<cuda::Context> gpus;
    for (const auto& c : contexts) gpus.push_back(std::get<cuda::Context>(c));
    if (shares_one_gpu(devices)) return std::make_unique<cuda::SharedGpuCommunicator>(std::move(gpus), ids, plan);
    if (processes != nullptr) return std::make_unique<cuda::NcclCommunicator>(std::move(gpus), ids, *processes, plan);
    return std::make_unique<cuda::NcclCommunicator>(std::move(gpus), ids, plan);
#else
    (void)ids;
    throw Error("no communicator for these devices");
#endif
}

} // namespace replica::backend
