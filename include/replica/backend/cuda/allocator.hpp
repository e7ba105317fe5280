#pragma once
// A caching device allocator: freed blocks are kept, by exact size, and handed out again, so that a
// warm training loop never calls cudaMalloc or cudaFree. One per context (device).
//
// Memory is zero-filled on the context's compute stream, and the fill has finished when allocate()
// returns, so that work on any stream may use the block at once. (A fill on the legacy default
// stream would not be ordered before the context's streams, which do not synchronise with it: a
// block could be written, or a reused one read, before its fill ran.)

#include <cuda_runtime.h>

#include <cstddef>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "replica/backend/cuda/check.hpp"
#include "replica/core/config.hpp"
#include "replica/core/tensor.hpp"

namespace REPLICA_NAMESPACE::backend::cuda {

class CachingAllocator {
public:
    // `fill`: the stream the zero fill runs on (the context's compute stream, made before this).
    CachingAllocator(int device, cudaStream_t fill) : device_(device), fill_(fill) {}
    CachingAllocator(const CachingAllocator&) = delete;
    CachingAllocator& operator=(const CachingAllocator&) = delete;
    ~CachingAllocator()
    {
        cudaSetDevice(device_);
        for (auto& [size, blocks] : free_)
            for (void* p : blocks) cudaFree(p);
    }

    // Zero-filled memory of at least `bytes` bytes, 256-byte aligned; the host waits for the fill (and
    // for what was queued on the fill stream before it).
    void* allocate(std::size_t bytes)
    {
        bytes = (bytes + 511) / 512 * 512;
        std::lock_guard lock(mutex_);
        void* p = nullptr;
        if (auto it = free_.find(bytes); it != free_.end() && !it->second.empty()) {
            p = it->second.back();
            it->second.pop_back();
        } else {
            REPLICA_CHECK(cudaSetDevice(device_));
            if (cudaMalloc(&p, bytes) != cudaSuccess) {
                cudaGetLastError();
                trim();   // give cached blocks back and try once more
                if (cudaMalloc(&p, bytes) != cudaSuccess) {
                    cudaGetLastError();
                    throw Error("out of memory on cuda:" + std::to_string(device_) + " allocating " +
                                std::to_string(bytes >> 20) + " MiB (" + std::to_string(reserved_ >> 20) +
                                " MiB already held): use a smaller batch size or model");
                }
            }
            reserved_ += bytes;
        }
        cudaError_t e = cudaMemsetAsync(p, 0, bytes, fill_);
        if (e == cudaSuccess) e = cudaStreamSynchronize(fill_);
        if (e != cudaSuccess) {
            free_[bytes].push_back(p);   // kept for reuse, not lost, when the fill fails
            REPLICA_CHECK(e);
        }
        size_[p] = bytes;
        return p;
    }

    // n zero-filled values of T (allocate()), given back to this allocator when the buffer goes; the
    // buffer must not outlive the allocator.
    template <class T>
    core::Buffer<T> buffer(std::size_t n)
    {
        if (n == 0) return {};
        return core::Buffer<T>(static_cast<T*>(allocate(n * sizeof(T))), n,
                               [](void* m, void* owner) { static_cast<CachingAllocator*>(owner)->release(m); }, this);
    }

    void release(void* p)
    {
        std::lock_guard lock(mutex_);
        auto it = size_.find(p);
        if (it == size_.end()) return;
        free_[it->second].push_back(p);
        size_.erase(it);
    }

    std::size_t reserved_bytes() const { return reserved_; }

private:
    void trim()
    {
        for (auto& [size, blocks] : free_)
            for (void* p : blocks) {
                cudaFree(p);
                reserved_ -= size;
            }
        free_.clear();
    }

    int device_;
    cudaStream_t fill_;
    std::mutex mutex_;
    std::unordered_map<std::size_t, std::vector<void*>> free_;
    std::unordered_map<void*, std::size_t> size_;
    std::size_t reserved_ = 0;
};

} // namespace replica::backend::cuda
