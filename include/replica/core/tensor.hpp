#pragma once
// Memory: Buffer<T> owns an allocation on one device. Everything else views memory as a pointer and a
// sample count, the shape of a sample being a compile-time Shape: (n, dims...) row-major, samples
// contiguous (model::ForwardArgs and BackwardArgs are those views for one op).

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <span>
#include <utility>

#include "replica/core/config.hpp"
#include "replica/core/error.hpp"

namespace REPLICA_NAMESPACE::core {

// An owning, move-only array. Host buffers are 64-byte aligned; device buffers come from the backend's
// allocator, which supplies the release function.
template <class T>
class Buffer {
public:
    using Release = void (*)(void* memory, void* owner);

    Buffer() = default;
    Buffer(T* data, std::size_t size, Release release, void* owner)
        : data_(data), size_(size), release_(release), owner_(owner) {}
    Buffer(Buffer&& other) noexcept { swap(other); }
    Buffer& operator=(Buffer&& other) noexcept
    {
        Buffer(std::move(other)).swap(*this);
        return *this;
    }
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    ~Buffer()
    {
        if (data_ != nullptr) release_(data_, owner_);
    }

    // Zero-initialised host memory.
    static Buffer host(std::size_t size)
    {
        if (size == 0) return {};
        std::size_t bytes = (size * sizeof(T) + 63) / 64 * 64;
        void* p = std::aligned_alloc(64, bytes);
        if (p == nullptr)
            throw Error("out of host memory allocating " + std::to_string(bytes) +
                        " bytes: use a smaller batch size or model");
        std::memset(p, 0, bytes);
        return Buffer(static_cast<T*>(p), size, [](void* m, void*) { std::free(m); }, nullptr);
    }

    T* data() { return data_; }
    const T* data() const { return data_; }
    std::size_t size() const { return size_; }
    bool empty() const { return size_ == 0; }
    std::span<T> span() { return {data_, size_}; }
    std::span<const T> span() const { return {data_, size_}; }
    T& operator[](std::size_t i) { return data_[i]; }
    const T& operator[](std::size_t i) const { return data_[i]; }

    void swap(Buffer& other) noexcept
    {
        std::swap(data_, other.data_);
        std::swap(size_, other.size_);
        std::swap(release_, other.release_);
        std::swap(owner_, other.owner_);
    }

private:
    T* data_ = nullptr;
    std::size_t size_ = 0;
    Release release_ = nullptr;
    void* owner_ = nullptr;
};

} // namespace replica::core
