#pragma once
// The one place that knows which backends exist. A model holds an AnyContext and visits it once per
// call; layer code below is written once against the context type it is given.

#include <algorithm>
#include <cstring>
#include <thread>
#include <variant>
#include <vector>

#include "replica/backend/cpu/cpu.hpp"
#include "replica/backend/cpu/executor.hpp"
#include "replica/core/config.hpp"
#if defined(REPLICA_CUDA)
#include "replica/backend/cuda/cuda.hpp"
#include "replica/backend/cuda/graph_executor.hpp"
#endif

namespace REPLICA_NAMESPACE::backend {

#if defined(REPLICA_CUDA)
using AnyContext = std::variant<cpu::Context, cuda::Context>;
#else
using AnyContext = std::variant<cpu::Context>;
#endif

// channels_first: a GPU's 16-bit activations stay channels-first whatever its Options say (a model
// that asks it: model/sequential.hpp's keeps_channels_first); the CPU's always are.
inline AnyContext make_context(const Device& device, [[maybe_unused]] bool channels_first = false)
{
#if defined(REPLICA_CUDA)
    if (device.is_cuda()) {
        cuda::Context ctx(device);
        return channels_first ? AnyContext(ctx.channels_first()) : AnyContext(std::move(ctx));
    }
#endif
    core::require(device.is_cpu(), "device " + device.name() +
                                       " needs the CUDA backend: build with -Dcuda=enabled on a machine with "
                                       "nvcc, cuDNN and NCCL, or use cpu:N");
    return AnyContext(std::in_place_type<cpu::Context>, device);
}

// Host memory for batches: page-locked under CUDA (so copies to the devices are asynchronous DMA),
// plain aligned memory otherwise or when no GPU can pin it. Zero-filled.
template <class T>
core::Buffer<T> host_buffer(std::size_t n)
{
#if defined(REPLICA_CUDA)
    void* p = nullptr;
    if (n != 0 && cudaMallocHost(&p, n * sizeof(T)) == cudaSuccess) {
        std::memset(p, 0, n * sizeof(T));
        return core::Buffer<T>(static_cast<T*>(p), n, [](void* m, void*) { cudaFreeHost(m); }, nullptr);
    }
    cudaGetLastError();
#endif
    return core::Buffer<T>::host(n);
}

// While it lives, each call of the host's math libraries (BLAS, oneDNN) runs on one thread when
// `device` is a CPU and `when` holds (nothing otherwise), and the old setting comes back after; the CPU
// convolutions' choice of code is then a rule on the shape, not a timing (cpu/onednn/choice.hpp). CPU
// replicas driven by their own threads then share the cores instead of oversubscribing them, and sums
// do not depend on how many threads the libraries may use or on the timings of a run (the reproducible
// mode). The setting is process-wide.
class SerialHostKernels {
public:
    explicit SerialHostKernels(const Device& device, bool when = true) : active_(when && device.is_cpu())
    {
        if (active_) {
            before_ = cpu::blas_threads();
            cpu::set_blas_threads(1);
            ++cpu::detail::serial_scopes();
        }
    }
    SerialHostKernels(const SerialHostKernels&) = delete;
    SerialHostKernels& operator=(const SerialHostKernels&) = delete;
    ~SerialHostKernels()
    {
        if (active_) {
            --cpu::detail::serial_scopes();
            cpu::set_blas_threads(before_);
        }
    }

private:
    bool active_;
    int before_ = 1;
};

// Every visible GPU (honouring CUDA_VISIBLE_DEVICES); empty without the CUDA backend or a GPU.
inline std::vector<Device> cuda_devices()
{
#if defined(REPLICA_CUDA)
    return cuda::visible_devices();
#else
    return {};
#endif
}

// Every device a default run uses: all visible GPUs, or the CPU.
inline std::vector<Device> default_devices()
{
#if defined(REPLICA_CUDA)
    auto gpus = cuda::visible_devices();
    if (!gpus.empty()) return gpus;
#endif
    return {Device::cpu(0)};
}

// Every visible GPU or, without one, one CPU replica per hardware thread: the devices that data
// parallelism can spread a model over.
inline std::vector<Device> all_devices()
{
    auto gpus = cuda_devices();
    if (!gpus.empty()) return gpus;
    std::vector<Device> cpus;
    for (unsigned i = 0; i < std::max(1u, std::thread::hardware_concurrency()); ++i) cpus.push_back(Device::cpu(int(i)));
    return cpus;
}

} // namespace replica::backend

namespace REPLICA_NAMESPACE {
using backend::all_devices;
using backend::cuda_devices;
using backend::default_devices;
#if defined(REPLICA_CUDA)
namespace cuda = backend::cuda;   // replica::cuda::default_options(), replica::cuda::Context
#endif
} // namespace replica
