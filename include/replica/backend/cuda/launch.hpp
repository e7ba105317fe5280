#pragma once
// Kernel launch helpers.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

#include "replica/backend/cuda/check.hpp"

namespace replica::backend::cuda::detail {

inline constexpr int kThreads = 256;

inline unsigned blocks_for(std::size_t count)
{
    return unsigned(std::clamp<std::size_t>((count + kThreads - 1) / kThreads, 1, 65535u * 8u));
}

// Grid-stride loop over [0, count).
#define REPLICA_GRID_LOOP(i, count) \
    for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < (count); i += std::size_t(blockDim.x) * gridDim.x)

inline void check_launch(const char* kernel) { ::replica::backend::cuda::detail::check(cudaGetLastError(), kernel, __FILE__, __LINE__); }

} // namespace replica::backend::cuda::detail
