#pragma once
// Sums of several buffers of one GPU, for replicas that share it (backend/cuda/shared_gpu.hpp): every
// buffer becomes the element-wise sum of all of them, added in a fixed order, (b0 + b1) + b2 + ...,
// so the result is the same bits whichever thread queues it and equals the host communicator's sum
// of the same floats; in bf16 (GradientReduction::bf16), the host's bf16 rule. And the conversions
// that carry a bucket through NCCL in bf16. Only under nvcc.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "replica/backend/cuda/check.hpp"
#include "replica/backend/cuda/launch.hpp"
#include "replica/core/config.hpp"
#include "replica/core/error.hpp"
#include "replica/core/number.hpp"

namespace REPLICA_NAMESPACE::backend::cuda {

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

// The bf16 rule (backend::sum_rounded_to_bf16): s = bf16(b0[i]) + bf16(b1[i]) + ... in float, in rank
// order, then bf16(s) written to every buffer.
template <int = 0>
__global__ void sum_into_each_bf16(SummedBuffers<float> b, unsigned k, std::size_t count)
{
    REPLICA_GRID_LOOP(i, count)
    {
        float s = core::round_through<core::bf16>(b.buffer[0][i]);
        for (unsigned r = 1; r < k; ++r) s += core::round_through<core::bf16>(b.buffer[r][i]);
        s = core::round_through<core::bf16>(s);
        for (unsigned r = 0; r < k; ++r) b.buffer[r][i] = s;
    }
}

template <int = 0>
__global__ void round_to_bf16(const float* src, core::bf16* dst, std::size_t count)
{
    REPLICA_GRID_LOOP(i, count) dst[i] = core::from_float<core::bf16>(src[i]);
}

template <int = 0>
__global__ void widen_bf16(const core::bf16* src, float* dst, std::size_t count)
{
    REPLICA_GRID_LOOP(i, count) dst[i] = core::to_float(src[i]);
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

// As sum_into_each, by the bf16 rule: every buffer becomes bf16(bf16(b0) + bf16(b1) + ...), added in
// float in rank order, widened back to float. One buffer is rounded in place.
inline void sum_into_each_bf16(std::span<float* const> buffers, std::size_t count, cudaStream_t stream)
{
    core::require(buffers.size() <= max_summed_buffers,
                  "a sum on one GPU takes at most " + std::to_string(max_summed_buffers) + " buffers, got " +
                      std::to_string(buffers.size()) + ": put fewer replicas on one GPU");
    if (buffers.empty() || count == 0) return;
    kernels::SummedBuffers<float> b{};
    for (std::size_t r = 0; r < buffers.size(); ++r) b.buffer[r] = buffers[r];
    kernels::sum_into_each_bf16<<<detail::blocks_for(count), detail::kThreads, 0, stream>>>(b, unsigned(buffers.size()),
                                                                                          count);
    detail::check_launch("sum_into_each_bf16");
}

// dst[i] = src[i] rounded to bf16 (to nearest, ties to even), queued on `stream`.
inline void round_to_bf16(const float* src, core::bf16* dst, std::size_t count, cudaStream_t stream)
{
    if (count == 0) return;
    kernels::round_to_bf16<<<detail::blocks_for(count), detail::kThreads, 0, stream>>>(src, dst, count);
    detail::check_launch("round_to_bf16");
}

// dst[i] = src[i] as float (exact), queued on `stream`.
inline void widen_bf16(const core::bf16* src, float* dst, std::size_t count, cudaStream_t stream)
{
    if (count == 0) return;
    kernels::widen_bf16<<<detail::blocks_for(count), detail::kThreads, 0, stream>>>(src, dst, count);
    detail::check_launch("widen_bf16");
}

} // namespace replica::backend::cuda
