#pragma once
// Portability macros: code shared by host and device compiles under nvcc and any C++20 compiler.

#if defined(__CUDACC__)
#define REPLICA_HOST_DEVICE __host__ __device__ inline
#define REPLICA_CUDA 1
#else
#define REPLICA_HOST_DEVICE inline
#endif
