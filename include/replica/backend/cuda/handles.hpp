#pragma once
// Owning types for the handles of the CUDA runtime, cuDNN and cuBLAS(Lt): each is move-only and its
// destructor gives the handle back, so an object that makes several of them leaks none when a later
// one fails (the ones made are destroyed as the exception leaves). A make_* function creates one and
// throws replica::Error, naming the call, if the library refuses. Only under nvcc.
//
// An owner converts to its raw handle, so it is passed to library calls as the handle itself; the
// raw handle must not outlive its owner.

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "replica/backend/cuda/check.hpp"
#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::backend::cuda {

// Owns one handle of type Raw; Release (a function object, it may carry a stream) gives it back.
// Raw{} is "none".
template <class Raw, class Release>
class Owned {
public:
    Owned() = default;
    explicit Owned(Raw raw, Release release = {}) noexcept : raw_(raw), release_(release) {}
    Owned(Owned&& other) noexcept : raw_(std::exchange(other.raw_, Raw{})), release_(other.release_) {}
    Owned& operator=(Owned&& other) noexcept
    {
        if (this != &other) {
            reset();
            raw_ = std::exchange(other.raw_, Raw{});
            release_ = other.release_;
        }
        return *this;
    }
    Owned(const Owned&) = delete;
    Owned& operator=(const Owned&) = delete;
    ~Owned() { reset(); }

    Raw get() const noexcept { return raw_; }
    operator Raw() const noexcept { return raw_; }
    explicit operator bool() const noexcept { return raw_ != Raw{}; }
    // Stops owning the handle and returns it (for a handle given back another way, as an aborted
    // NCCL communicator is).
    [[nodiscard]] Raw release() noexcept { return std::exchange(raw_, Raw{}); }
    // Gives the handle back now (errors are ignored: this runs in destructors).
    void reset() noexcept
    {
        if (raw_ != Raw{}) release_(raw_);
        raw_ = Raw{};
    }

private:
    Raw raw_{};
    [[no_unique_address]] Release release_{};
};

namespace release {
struct Stream {
    void operator()(cudaStream_t s) const noexcept { cudaStreamDestroy(s); }
};
struct Event {
    void operator()(cudaEvent_t e) const noexcept { cudaEventDestroy(e); }
};
struct Graph {
    void operator()(cudaGraph_t g) const noexcept { cudaGraphDestroy(g); }
};
struct GraphExec {
    void operator()(cudaGraphExec_t g) const noexcept { cudaGraphExecDestroy(g); }
};
struct PinnedHost {
    void operator()(void* p) const noexcept { cudaFreeHost(p); }
};
// Stream-ordered device memory (cudaMallocAsync): freed in order on the stream it was made on.
struct AsyncDevice {
    cudaStream_t stream = nullptr;
    void operator()(void* p) const noexcept { cudaFreeAsync(p, stream); }
};
struct Cudnn {
    void operator()(cudnnHandle_t h) const noexcept { cudnnDestroy(h); }
};
struct TensorDescriptor {
    void operator()(cudnnTensorDescriptor_t d) const noexcept { cudnnDestroyTensorDescriptor(d); }
};
struct FilterDescriptor {
    void operator()(cudnnFilterDescriptor_t d) const noexcept { cudnnDestroyFilterDescriptor(d); }
};
struct ConvolutionDescriptor {
    void operator()(cudnnConvolutionDescriptor_t d) const noexcept { cudnnDestroyConvolutionDescriptor(d); }
};
struct Cublas {
    void operator()(cublasHandle_t h) const noexcept { cublasDestroy(h); }
};
struct CublasLt {
    void operator()(cublasLtHandle_t h) const noexcept { cublasLtDestroy(h); }
};
struct MatmulDesc {
    void operator()(cublasLtMatmulDesc_t d) const noexcept { cublasLtMatmulDescDestroy(d); }
};
struct MatrixLayout {
    void operator()(cublasLtMatrixLayout_t l) const noexcept { cublasLtMatrixLayoutDestroy(l); }
};
struct MatmulPreference {
    void operator()(cublasLtMatmulPreference_t p) const noexcept { cublasLtMatmulPreferenceDestroy(p); }
};
} // namespace release

using Stream = Owned<cudaStream_t, release::Stream>;
using Event = Owned<cudaEvent_t, release::Event>;
using Graph = Owned<cudaGraph_t, release::Graph>;
using GraphExec = Owned<cudaGraphExec_t, release::GraphExec>;
using CudnnHandle = Owned<cudnnHandle_t, release::Cudnn>;
using TensorDescriptor = Owned<cudnnTensorDescriptor_t, release::TensorDescriptor>;
using FilterDescriptor = Owned<cudnnFilterDescriptor_t, release::FilterDescriptor>;
using ConvolutionDescriptor = Owned<cudnnConvolutionDescriptor_t, release::ConvolutionDescriptor>;
using CublasHandle = Owned<cublasHandle_t, release::Cublas>;
using CublasLtHandle = Owned<cublasLtHandle_t, release::CublasLt>;
using MatmulDesc = Owned<cublasLtMatmulDesc_t, release::MatmulDesc>;
using MatrixLayout = Owned<cublasLtMatrixLayout_t, release::MatrixLayout>;
using MatmulPreference = Owned<cublasLtMatmulPreference_t, release::MatmulPreference>;
using AsyncDeviceBlock = Owned<void*, release::AsyncDevice>;

// Page-locked host memory for n values of T, value-initialised (T must be trivially copyable: the
// device writes it).
template <class T>
class Pinned {
public:
    Pinned() = default;
    explicit Pinned(std::size_t n)
    {
        void* p = nullptr;
        REPLICA_CHECK(cudaMallocHost(&p, n * sizeof(T)));
        block_ = Owned<void*, release::PinnedHost>(p);
        for (std::size_t i = 0; i < n; ++i) data()[i] = T{};
    }
    T* data() const noexcept { return static_cast<T*>(block_.get()); }
    T& operator[](std::size_t i) const noexcept { return data()[i]; }

private:
    Owned<void*, release::PinnedHost> block_;
};

// A stream that does not synchronise with the legacy default stream.
inline Stream make_stream()
{
    cudaStream_t s = nullptr;
    REPLICA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return Stream(s);
}

// An event for ordering (no timing), or with cudaEventDefault one that times.
inline Event make_event(unsigned flags = cudaEventDisableTiming)
{
    cudaEvent_t e = nullptr;
    REPLICA_CHECK(cudaEventCreateWithFlags(&e, flags));
    return Event(e);
}

// Zero-filled device memory of `bytes` bytes, made and freed in order on `stream`; none for 0 bytes.
inline AsyncDeviceBlock make_async_block(std::size_t bytes, cudaStream_t stream)
{
    if (bytes == 0) return {};
    void* p = nullptr;
    REPLICA_CHECK(cudaMallocAsync(&p, bytes, stream));
    AsyncDeviceBlock block(p, release::AsyncDevice{stream});
    REPLICA_CHECK(cudaMemsetAsync(p, 0, bytes, stream));
    return block;
}

// A cuDNN handle on `stream`.
inline CudnnHandle make_cudnn(cudaStream_t stream)
{
    cudnnHandle_t h = nullptr;
    REPLICA_CHECK(cudnnCreate(&h));
    CudnnHandle owned(h);
    REPLICA_CHECK(cudnnSetStream(h, stream));
    return owned;
}

// A cuBLAS handle on `stream`, FP32 products (CUBLAS_PEDANTIC_MATH, as PyTorch by default), using
// `workspace` (so that cuBLAS allocates nothing inside a graph capture).
inline CublasHandle make_cublas(cudaStream_t stream, void* workspace, std::size_t bytes)
{
    cublasHandle_t h = nullptr;
    REPLICA_CHECK(cublasCreate(&h));
    CublasHandle owned(h);
    REPLICA_CHECK(cublasSetStream(h, stream));
    REPLICA_CHECK(cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH));
    REPLICA_CHECK(cublasSetWorkspace(h, workspace, bytes));
    return owned;
}

inline CublasLtHandle make_cublaslt()
{
    cublasLtHandle_t h = nullptr;
    REPLICA_CHECK(cublasLtCreate(&h));
    return CublasLtHandle(h);
}

inline TensorDescriptor make_tensor_descriptor()
{
    cudnnTensorDescriptor_t d = nullptr;
    REPLICA_CHECK(cudnnCreateTensorDescriptor(&d));
    return TensorDescriptor(d);
}
inline FilterDescriptor make_filter_descriptor()
{
    cudnnFilterDescriptor_t d = nullptr;
    REPLICA_CHECK(cudnnCreateFilterDescriptor(&d));
    return FilterDescriptor(d);
}
inline ConvolutionDescriptor make_convolution_descriptor()
{
    cudnnConvolutionDescriptor_t d = nullptr;
    REPLICA_CHECK(cudnnCreateConvolutionDescriptor(&d));
    return ConvolutionDescriptor(d);
}

inline MatmulDesc make_matmul_desc(cublasComputeType_t compute, cudaDataType_t scale)
{
    cublasLtMatmulDesc_t d = nullptr;
    REPLICA_CHECK(cublasLtMatmulDescCreate(&d, compute, scale));
    return MatmulDesc(d);
}
inline MatrixLayout make_matrix_layout(cudaDataType_t type, std::uint64_t rows, std::uint64_t cols, std::int64_t ld)
{
    cublasLtMatrixLayout_t l = nullptr;
    REPLICA_CHECK(cublasLtMatrixLayoutCreate(&l, type, rows, cols, ld));
    return MatrixLayout(l);
}
inline MatmulPreference make_matmul_preference()
{
    cublasLtMatmulPreference_t p = nullptr;
    REPLICA_CHECK(cublasLtMatmulPreferenceCreate(&p));
    return MatmulPreference(p);
}

} // namespace replica::backend::cuda
