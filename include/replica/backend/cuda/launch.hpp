#pragma once
// Kernel launch helpers, and the rule that lets any number of translation units include a kernel:
// every __global__ function is a template, one without parameters of its own `template <int = 0>`.
// nvcc gives each translation unit's instantiation of a kernel template its own host stub (internal
// linkage), where a plain kernel's stub and handle are external symbols defined again by every
// translation unit that includes the header. A kernel no translation unit launches is not compiled.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "replica/backend/cuda/check.hpp"
#include "replica/core/config.hpp"

// A window as the template arguments of a kernel (nvcc cannot pass a class-type template argument
// from namespace scope to a __global__ function): the kernel rebuilds it as a constant.
#define REPLICA_WINDOW_INTS(g) g.c, g.h, g.w, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.oh, g.ow

namespace REPLICA_NAMESPACE::backend::cuda::detail {

inline constexpr int kThreads = 256;

inline unsigned blocks_for(std::size_t count)
{
    return unsigned(std::clamp<std::size_t>((count + kThreads - 1) / kThreads, 1, 65535u * 8u));
}

// Every thread of the block passes its v; all get op over them, combined in a tree fixed by the
// block size (a power of two), so the result is the same every run. lane: blockDim.x shared values.
template <class T, class Op>
__device__ T block_reduce(T* lane, T v, Op op)
{
    lane[threadIdx.x] = v;
    __syncthreads();
    for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) lane[threadIdx.x] = op(lane[threadIdx.x], lane[threadIdx.x + half]);
        __syncthreads();
    }
    return lane[0];
}

// Grid-stride loop over [0, count).
#define REPLICA_GRID_LOOP(i, count) \
    for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < (count); i += std::size_t(blockDim.x) * gridDim.x)

// Grid-stride loop with an index of type I: 32 bits where the count allows (see indexed() below), so that
// the index arithmetic is single instructions.
#define REPLICA_GRID_LOOP_AS(I, i, count) \
    for (I i = I(blockIdx.x) * I(blockDim.x) + I(threadIdx.x); i < (count); i += I(blockDim.x) * I(gridDim.x))

// f(I{}) with I = 32-bit where count < 2^31 (the grid-stride index cannot wrap), else 64-bit.
template <class F>
void indexed(std::size_t count, F&& f)
{
    if (count < (std::size_t{1} << 31)) f(std::uint32_t{});
    else f(std::size_t{});
}

inline void check_launch(const char* kernel) { ::replica::backend::cuda::detail::check(cudaGetLastError(), kernel, __FILE__, __LINE__); }

} // namespace replica::backend::cuda::detail
