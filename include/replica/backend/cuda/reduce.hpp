#pragma once
// Sums of several buffers of one GPU, for replicas that share it (backend/cuda/shared_gpu.hpp): every
// buffer becomes the element-wise sum of all of them, added in a fixed order, (b0 + b1) + b2 + ...,
// so the result is the same bits whichever thread queues it and equals the host communicator's sum
// of the same floats. Only under nvcc.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "replica/backend/cuda/check.hpp"
#include "replica/backend/cuda/launch.hpp"
#include "replica/core/error.hpp"

namespace replica::backend::cuda {

// How many buffers one sum takes: their pointers travel as a kernel argument.
inline constexpr std::size_t max_summed_buffers = 32;

namespace kernels {
template <class T>
struct SummedBuffers {
    T* buffer[max_summed_buffers];
};

// Each element: s = b0[i] + b1[i] + ... in rank order, then s written to every buffer.
template <class T>
__global__ void sum_into_each(SummedBuffers<T> b, unsigned k, std::size_t count)
{
    REPLICA_GRID_LOOP(i, count)
    {
        T s = b.buffer[0][i];
        for (unsigned r = 1; r < k; ++r) s += b.buffer[r][i];
        for (unsigned r = 0; r < k; ++r) b.buffer[r][i] = s;
    }
}
} // namespace kernels

// Every one of `buffers` (count elements each, distinct, in memory of the current device) becomes the
// element-wise sum ((b0 + b1) + b2) + ..., queued on `stream` (of the current device). float for
// gradients, std::int64_t for the reproducible mode's fixed-point sums (exact in any order).
template <class T>
void sum_into_each(std::span<T* const> buffers, std::size_t count, cudaStream_t stream)
{
    core::require(buffers.size() <= max_summed_buffers,
                  "a sum on one GPU takes at most " + std::to_string(max_summed_buffers) + " buffers, got " +
                      std::to_string(buffers.size()) + ": put fewer replicas on one GPU");
    if (buffers.size() < 2 || count == 0) return;
    kernels::SummedBuffers<T> b{};
    for (std::size_t r = 0; r < buffers.size(); ++r) b.buffer[r] = buffers[r];
    kernels::sum_into_each<T><<<detail::blocks_for(count), detail::kThreads, 0, stream>>>(b, unsigned(buffers.size()), count);
    detail::check_launch("sum_into_each");
}

} // namespace replica::backend::cuda
