#pragma once
// Status checks for CUDA, cuDNN and cuBLAS calls: a failure throws replica::Error naming the call,
// the device and what to do about it. Only under nvcc.

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <string>

#include "replica/core/config.hpp"
#include "replica/core/error.hpp"

namespace REPLICA_NAMESPACE::backend::cuda::detail {

inline std::string where(const char* call, const char* file, int line)
{
    int device = -1;
    cudaGetDevice(&device);
    return std::string(call) + " failed on cuda:" + std::to_string(device) + " (" + file + ":" + std::to_string(line) + ")";
}

inline void check(cudaError_t e, const char* call, const char* file, int line)
{
    if (e == cudaSuccess) return;
    cudaGetLastError();   // clear the sticky-free error state so the next call is not blamed
    const char* hint = e == cudaErrorMemoryAllocation ? "out of device memory: use a smaller batch size or model"
                       : e == cudaErrorInvalidDevice  ? "no such device: pick an index from cuda_devices() "
                                                        "(CUDA_VISIBLE_DEVICES renumbers them)"
                       : e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver
                           ? "no usable GPU: check the driver with nvidia-smi, or train on cpu devices"
                           : "a CUDA failure: rerun with CUDA_LAUNCH_BLOCKING=1 to find the kernel";
    throw Error(where(call, file, line) + ": " + cudaGetErrorString(e) + ". " + hint);
}

inline void check(cudnnStatus_t s, const char* call, const char* file, int line)
{
    if (s == CUDNN_STATUS_SUCCESS) return;
    const char* hint = s == CUDNN_STATUS_ALLOC_FAILED ? "out of device memory: use a smaller batch size or model"
                       : s == CUDNN_STATUS_NOT_SUPPORTED ? "cuDNN does not support this layer configuration"
                                                         : "a cuDNN failure: set CUDNN_LOGERR_DBG=1 for details";
    throw Error(where(call, file, line) + ": " + cudnnGetErrorString(s) + ". " + hint);
}

inline void check(cublasStatus_t s, const char* call, const char* file, int line)
{
    if (s == CUBLAS_STATUS_SUCCESS) return;
    const char* hint = s == CUBLAS_STATUS_ALLOC_FAILED ? "out of device memory: use a smaller batch size or model"
                                                       : "a cuBLAS failure";
    throw Error(where(call, file, line) + ": " + cublasGetStatusString(s) + ". " + hint);
}

} // namespace replica::backend::cuda::detail

#define REPLICA_CHECK(call) ::replica::backend::cuda::detail::check((call), #call, __FILE__, __LINE__)
