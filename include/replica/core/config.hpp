#pragma once
// Portability macros: code shared by host and device compiles under nvcc and any C++20 compiler.

#if defined(__CUDACC__)
#define REPLICA_HOST_DEVICE __host__ __device__ inline
#define REPLICA_CUDA 1
#else
#define REPLICA_HOST_DEVICE inline
#endif

// Where the library's names live: replica::X is replica::with_cuda::X in a translation unit compiled
// by nvcc and replica::host_only::X in one compiled by a plain compiler. The two see different
// definitions of the same names (a model's context may be a GPU's only under nvcc), and the inline
// namespace keeps the linker from merging them into one: a program may hold both kinds of translation
// unit, and a replica type passed between the two kinds is a link error, not a silent mismatch.
// Code names replica::X either way; headers open `namespace REPLICA_NAMESPACE::folder {`.
#if defined(REPLICA_CUDA)
#define REPLICA_NAMESPACE replica::inline with_cuda
#else
#define REPLICA_NAMESPACE replica::inline host_only
#endif

// oneDNN for the CPU backend's convolutions (backend/cpu/onednn/): builds that find it define
// REPLICA_ONEDNN (Meson does, through dependency('replica')). C++ translation units only: under nvcc
// the CPU replicas of a CUDA build keep im2col, and oneDNN's headers stay out of nvcc's way.
#if defined(REPLICA_CUDA) && defined(REPLICA_ONEDNN)
#undef REPLICA_ONEDNN
#endif
