#pragma once
// Where a CUDA context keeps the channels of activations of type T. An image-shaped activation of a
// sample is (channels, pixels) on the CPU and for float (NCHW); for bf16 and fp16 under
// Options::channels_last it is (pixels, channels) (NHWC), the layout of cuDNN's tensor-core kernels.
// A flat activation (one pixel) is the same in both. Every kernel that knows what a channel is (the
// convolutions' descriptors and biases, pooling, BatchNorm, channel slices, dropout's mask, the loss)
// asks channels_last<T>(ctx); elementwise kernels need not. What crosses into or out of a model in
// NCHW (its input, predict's outputs, Flatten before a fully connected layer, so that parameters keep
// one layout) passes through to_activation_layout / from_activation_layout (elementwise.hpp), which
// transpose with detail::transpose_planes. Only under nvcc.

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <type_traits>

#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/launch.hpp"
#include "replica/backend/cuda/packed.hpp"
#include "replica/core/config.hpp"
#include "replica/core/number.hpp"

namespace REPLICA_NAMESPACE::backend::cuda {

// True when ctx keeps activations of type T channels-last.
template <core::Storage T>
bool channels_last(const Context& ctx)
{
    return !std::same_as<T, float> && ctx.keeps_channels_last();
}

namespace detail {
// f(std::true_type{}) where ctx keeps activations of type T channels-last, else f(std::false_type{}):
// the layout as a compile-time constant for kernels. Float never instantiates the channels-last form.
template <core::Storage T, class F>
decltype(auto) by_layout(const Context& ctx, F&& f)
{
    if constexpr (std::same_as<T, float>) return f(std::false_type{});
    else if (channels_last<T>(ctx)) return f(std::true_type{});
    else return f(std::false_type{});
}
} // namespace detail

namespace kernels {
// dst (planes, b, a) = src (planes, a, b) converted to D, through 32 x 32 tiles in shared memory so that
// both the reads and the writes are of neighbouring values. Block (32, 8); grid (b tiles, a tiles, planes).
template <core::Storage S, core::Storage D>
__global__ void transpose_planes(const S* src, D* dst, unsigned a, unsigned b)
{
    __shared__ float tile[32][33];
    const std::size_t plane = std::size_t(blockIdx.z) * a * b;
    const unsigned i0 = blockIdx.y * 32, j0 = blockIdx.x * 32;
    for (unsigned k = threadIdx.y; k < 32; k += 8) {
        const unsigned i = i0 + k, j = j0 + threadIdx.x;
        if (i < a && j < b) tile[k][threadIdx.x] = widen(src[plane + std::size_t(i) * b + j]);
    }
    __syncthreads();
    for (unsigned k = threadIdx.y; k < 32; k += 8) {
        const unsigned j = j0 + k, i = i0 + threadIdx.x;
        if (i < a && j < b) dst[plane + std::size_t(j) * a + i] = narrow<D>(tile[threadIdx.x][k]);
    }
}
// transpose_planes where one side is short (a or b at most kThinSide: an image's 3 channels, a 3x3
// window): a tile would be mostly idle, so a thread takes one index of the long side and loops over the
// short one; across a warp the long side's neighbours are read (ShortA) or written (!ShortA) together,
// and the short side's values lie next to each other. Grid (long side, planes): blockIdx.y is the
// plane, so no thread divides by a size known only at run time.
template <core::Storage S, core::Storage D, bool ShortA>
__global__ void transpose_thin(const S* src, D* dst, unsigned a, unsigned b)
{
    const unsigned along = ShortA ? b : a, across = ShortA ? a : b;
    const std::size_t plane = std::size_t(blockIdx.y) * a * b;
    src += plane, dst += plane;
    for (unsigned l = blockIdx.x * blockDim.x + threadIdx.x; l < along; l += blockDim.x * gridDim.x)
        for (unsigned s = 0; s < across; ++s) {
            const unsigned i = ShortA ? s : l, j = ShortA ? l : s;
            dst[std::size_t(j) * a + i] = narrow<D>(widen(src[std::size_t(i) * b + j]));
        }
}
} // namespace kernels

namespace detail {
inline constexpr std::size_t kThinSide = 16;

// dst (n, b, a) = src (n, a, b) converted to D.
template <core::Storage S, core::Storage D>
void transpose_planes(const Context& ctx, const S* src, D* dst, std::size_t n, std::size_t a, std::size_t b)
{
    if (n == 0 || a == 0 || b == 0) return;
    core::require(n < 65536 && a * b < (std::size_t(1) << 32), "a layout transpose of 65536 samples or more: use a smaller batch");
    if (std::min(a, b) <= kThinSide) {
        const dim3 grid(std::min(blocks_for(std::max(a, b)), 65535u), unsigned(n));
        if (a <= b) kernels::transpose_thin<S, D, true><<<grid, kThreads, 0, ctx.stream()>>>(src, dst, unsigned(a), unsigned(b));
        else kernels::transpose_thin<S, D, false><<<grid, kThreads, 0, ctx.stream()>>>(src, dst, unsigned(a), unsigned(b));
        check_launch("transpose_planes");
        return;
    }
    const dim3 grid(unsigned((b + 31) / 32), unsigned((a + 31) / 32), unsigned(n));
    kernels::transpose_planes<S, D><<<grid, dim3(32, 8), 0, ctx.stream()>>>(src, dst, unsigned(a), unsigned(b));
    check_launch("transpose_planes");
}
} // namespace detail

} // namespace replica::backend::cuda
