#pragma once
// Optimizer updates on the GPU: one fused pass over parameters, gradients and state, every segment of
// the model's plan in one launch.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/launch.hpp"
#include "replica/core/config.hpp"
#include "replica/core/param_kind.hpp"

namespace REPLICA_NAMESPACE::backend::cuda {

namespace detail {
// The updates go segment by segment (core/param_kind.hpp), all segments of a batch in one launch: block
// b updates kSegmentBlock consecutive parameters of the segment whose blocks hold b. A batch travels
// as the kernel's parameter (__grid_constant__: read in place, never copied per thread).
inline constexpr unsigned kPerThread = 4;
inline constexpr std::size_t kSegmentBlock = std::size_t(kThreads) * kPerThread;
inline constexpr unsigned kSegmentBatch = 96;   // keeps a launch's parameters under 4 KiB
struct SegmentBatch {
    unsigned size;
    unsigned first_block[kSegmentBatch + 1];
    core::ParamSegment segment[kSegmentBatch];
};

// launch(batch, blocks) for consecutive batches of at most kSegmentBatch segments.
template <class Launch>
void for_segment_batches(std::span<const core::ParamSegment> segments, Launch&& launch)
{
    for (std::size_t at = 0; at < segments.size(); at += kSegmentBatch) {
        SegmentBatch b{};
        b.size = unsigned(std::min<std::size_t>(kSegmentBatch, segments.size() - at));
        unsigned blocks = 0;
        for (unsigned k = 0; k < b.size; ++k) {
            b.segment[k] = segments[at + k];
            b.first_block[k] = blocks;
            blocks += unsigned((segments[at + k].count + kSegmentBlock - 1) / kSegmentBlock);
        }
        b.first_block[b.size] = blocks;
        if (blocks > 0) launch(b, blocks);
    }
}

// This block's segment (the last k with first_block[k] <= blockIdx.x) and its first index in it.
__device__ inline const core::ParamSegment& block_segment(const SegmentBatch& b, std::size_t& first)
{
    unsigned lo = 0, hi = b.size - 1;
    while (lo < hi) {
        const unsigned mid = (lo + hi + 1) / 2;
        if (b.first_block[mid] <= blockIdx.x) lo = mid;
        else hi = mid - 1;
    }
    first = std::size_t(blockIdx.x - b.first_block[lo]) * kSegmentBlock;
    return b.segment[lo];
}
} // namespace detail

namespace kernels {
template <int = 0>
__global__ void sgd(const __grid_constant__ detail::SegmentBatch b, float* w, const float* grad, bool grad_at_state,
                    float* velocity, float lr, float momentum, float weight_decay, bool nesterov)
{
    std::size_t first;
    const core::ParamSegment& s = detail::block_segment(b, first);
    const float wd = weight_decay * s.decay, rate = lr * s.lr_scale;
    const float* g = grad + (grad_at_state ? s.state : s.begin);
    for (unsigned k = 0; k < detail::kPerThread; ++k) {
        const std::size_t j = first + threadIdx.x + std::size_t(k) * blockDim.x;
        if (j >= s.count) break;
        const float wj = w[s.begin + j];
        const float gj = g[j] + wd * wj;
        const float vj = momentum * velocity[s.state + j] + gj;
        velocity[s.state + j] = vj;
        w[s.begin + j] = wj - rate * (nesterov ? gj + momentum * vj : vj);
    }
}
// (m, v) of parameter j are mv[2j], mv[2j + 1]: read and written as one float2 where mv is 8-byte
// aligned (Paired), else as two floats (an Accumulate's plane of sums before them holds an odd count).
template <bool Paired>
__global__ void adam(const __grid_constant__ detail::SegmentBatch b, float* w, const float* grad, bool grad_at_state,
                     float* mv, float lr, float beta1, float beta2, float eps, float weight_decay, bool decoupled,
                     float step_size, float bias2_sqrt)
{
    std::size_t first;
    const core::ParamSegment& s = detail::block_segment(b, first);
    const float wd = weight_decay * s.decay, step = step_size * s.lr_scale;
    const float shrink = 1.0f - lr * s.lr_scale * wd;
    const float* g = grad + (grad_at_state ? s.state : s.begin);
    for (unsigned k = 0; k < detail::kPerThread; ++k) {
        const std::size_t j = first + threadIdx.x + std::size_t(k) * blockDim.x;
        if (j >= s.count) break;
        float gj = g[j];
        float wj = w[s.begin + j];
        if (decoupled) wj *= shrink;
        else gj += wd * wj;
        float* at = mv + 2 * (s.state + j);
        float2 m;
        if constexpr (Paired) m = *reinterpret_cast<const float2*>(at);
        else m = make_float2(at[0], at[1]);
        m.x = beta1 * m.x + (1.0f - beta1) * gj;
        m.y = beta2 * m.y + (1.0f - beta2) * gj * gj;
        if constexpr (Paired) *reinterpret_cast<float2*>(at) = m;
        else at[0] = m.x, at[1] = m.y;
        w[s.begin + j] = wj - step * m.x / (sqrtf(m.y) / bias2_sqrt + eps);
    }
}
template <int = 0>
__global__ void accumulate_gradient(const __grid_constant__ detail::SegmentBatch b, const float* grad, float* acc,
                                    bool last, float scale)
{
    std::size_t first;
    const core::ParamSegment& s = detail::block_segment(b, first);
    for (unsigned k = 0; k < detail::kPerThread; ++k) {
        const std::size_t j = first + threadIdx.x + std::size_t(k) * blockDim.x;
        if (j >= s.count) break;
        const float a = acc[s.state + j] + grad[s.begin + j];
        acc[s.state + j] = last ? a * scale : a;
    }
}
} // namespace kernels

// The CPU backend's rule, PyTorch's SGD, segment by segment.
inline void sgd_update(const Context& ctx, float* w, const float* grad, float* velocity,
                       std::span<const core::ParamSegment> segments, core::GradientAt at, float lr, float momentum,
                       float weight_decay, bool nesterov)
{
    detail::for_segment_batches(segments, [&](const detail::SegmentBatch& b, unsigned blocks) {
        kernels::sgd<<<blocks, detail::kThreads, 0, ctx.stream()>>>(b, w, grad, at == core::GradientAt::state, velocity,
                                                                    lr, momentum, weight_decay, nesterov);
        detail::check_launch("sgd");
    });
}

// The CPU backend's rule, PyTorch's Adam and AdamW: state holds (m, v) per trainable parameter,
// interleaved. It is 4-byte aligned only where an Accumulate's sums (one float a parameter) come first.
inline void adam_update(const Context& ctx, float* w, const float* grad, float* state,
                        std::span<const core::ParamSegment> segments, core::GradientAt at, float lr, float beta1,
                        float beta2, float eps, float weight_decay, bool decoupled, float step_size, float bias2_sqrt)
{
    const bool paired = reinterpret_cast<std::uintptr_t>(state) % alignof(float2) == 0;
    detail::for_segment_batches(segments, [&](const detail::SegmentBatch& b, unsigned blocks) {
        auto* kernel = paired ? kernels::adam<true> : kernels::adam<false>;
        kernel<<<blocks, detail::kThreads, 0, ctx.stream()>>>(b, w, grad, at == core::GradientAt::state, state, lr, beta1,
                                                              beta2, eps, weight_decay, decoupled, step_size, bias2_sqrt);
        detail::check_launch("adam");
    });
}

// The CPU backend's rule: acc[state + j] += grad[begin + j], then acc *= scale when `last`.
inline void accumulate_gradient(const Context& ctx, const float* grad, float* acc,
                                std::span<const core::ParamSegment> segments, bool last, float scale)
{
    detail::for_segment_batches(segments, [&](const detail::SegmentBatch& b, unsigned blocks) {
        kernels::accumulate_gradient<<<blocks, detail::kThreads, 0, ctx.stream()>>>(b, grad, acc, last, scale);
        detail::check_launch("accumulate_gradient");
    });
}

namespace kernels {
inline constexpr unsigned kClipBlocks = 256;

// Block b: the sum of squares (double) of its part of g, the parts cut by count alone, in a block tree
// of fixed shape, into squares[b].
template <int = 0>
__global__ void clip_squares(const float* g, std::size_t count, double* squares)
{
    __shared__ double lane[detail::kThreads];
    const std::size_t per = (count + kClipBlocks - 1) / kClipBlocks;
    const std::size_t begin = min(count, std::size_t(blockIdx.x) * per), end = min(count, begin + per);
    double s = 0.0;
    for (std::size_t i = begin + threadIdx.x; i < end; i += blockDim.x) s += double(g[i]) * double(g[i]);
    s = detail::block_reduce(lane, s, [](double a, double b) { return a + b; });
    if (threadIdx.x == 0) squares[blockIdx.x] = s;
}

// One block: the parts' sum, in a tree of fixed shape, into *squares.
template <int = 0>
__global__ void sum_parts(const double* parts, double* squares)
{
    __shared__ double lane[detail::kThreads];
    double s = 0.0;
    for (unsigned b = threadIdx.x; b < kClipBlocks; b += blockDim.x) s += parts[b];
    s = detail::block_reduce(lane, s, [](double a, double b) { return a + b; });
    if (threadIdx.x == 0) *squares = s;
}

// g *= max_norm / (norm + 1e-6) when norm = sqrt(*squares) exceeds max_norm; every thread computes
// the same factor.
template <int = 0>
__global__ void clip_apply(float* g, std::size_t count, const double* squares, float max_norm)
{
    const double norm = sqrt(*squares);
    if (!(norm > double(max_norm))) return;
    const float k = float(double(max_norm) / (norm + 1e-6));
    REPLICA_GRID_LOOP(i, count) g[i] *= k;
}
} // namespace kernels

namespace detail {
// *squares = the sum of g[i]^2 in double, over kClipBlocks parts of g (cut by count alone) into
// parts (kClipBlocks doubles), then over the parts, each in a tree of fixed shape.
inline void queue_squares(const Context& ctx, const float* g, std::size_t count, double* parts, double* squares)
{
    kernels::clip_squares<<<kernels::kClipBlocks, kThreads, 0, ctx.stream()>>>(g, count, parts);
    kernels::sum_parts<<<1, kThreads, 0, ctx.stream()>>>(parts, squares);
    check_launch("sum_of_squares");
}
} // namespace detail

// *squares (one double of device memory, outside the context's workspace) = the sum of g[i]^2 in
// double, in a fixed order (detail::queue_squares): the same bits on every run, and the whole GPU
// reads g. Its scratch is the context's workspace.
inline void sum_of_squares(const Context& ctx, const float* g, std::size_t count, double* squares)
{
    auto* parts = static_cast<double*>(ctx.workspace(kernels::kClipBlocks * sizeof(double)));
    detail::queue_squares(ctx, g, count, parts, squares);
}

// g *= max_norm / (norm + 1e-6) when norm = sqrt(*squares) exceeds max_norm; squares: device memory.
inline void clip_to_norm(const Context& ctx, float* g, std::size_t count, const double* squares, float max_norm)
{
    if (count == 0) return;
    kernels::clip_apply<<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(g, count, squares, max_norm);
    detail::check_launch("clip_to_norm");
}

// g *= max_norm / (|g| + 1e-6) when the L2 norm |g| exceeds max_norm (clip_grad_norm): sum_of_squares
// and clip_to_norm, the sum kept in the context's workspace beside the parts.
inline void clip_by_norm(const Context& ctx, float* g, std::size_t count, float max_norm)
{
    auto* parts = static_cast<double*>(ctx.workspace(kernels::kClipBlocks * sizeof(double) + sizeof(double)));
    double* squares = parts + kernels::kClipBlocks;
    detail::queue_squares(ctx, g, count, parts, squares);
    clip_to_norm(ctx, g, count, squares, max_norm);
}

namespace kernels {
template <int = 0>
__global__ void unscale_gradient(float* g, std::size_t count, float inv_scale, int* non_finite)
{
    REPLICA_GRID_LOOP(i, count)
    {
        const float v = g[i];
        if (!isfinite(v)) *non_finite = 1;
        g[i] = v * inv_scale;
    }
}
} // namespace kernels

// The CPU backend's rule: g *= inv_scale, and whether every value of g was finite before. The host
// needs the answer (it decides whether the optimizer runs), so this waits for the compute stream.
inline bool unscale_gradient(const Context& ctx, float* g, std::size_t count, float inv_scale)
{
    core::Buffer<int> flag = ctx.allocate<int>(1);
    REPLICA_CHECK(cudaMemsetAsync(flag.data(), 0, sizeof(int), ctx.stream()));
    if (count > 0) {
        kernels::unscale_gradient<<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(g, count, inv_scale,
                                                                                                   flag.data());
        detail::check_launch("unscale_gradient");
    }
    int non_finite = 0;
    ctx.download(&non_finite, flag.data(), 1);
    ctx.synchronize();
    return non_finite == 0;
}

} // namespace replica::backend::cuda

