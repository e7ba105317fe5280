#pragma once
// Softmax cross-entropy on the GPU, over logits (n, classes, pixels) in the context's layout (layout.hpp:
// channels-last, (n, pixels, classes)) and labels (n, pixels): one
// thread per labelled element (a block per sample for classifiers) writes its gradient and its loss;
// the losses are then summed in an order fixed by their count (no atomics), in double, so the sum is
// the same every run. Logits and their gradient are activations of one type T (float, bf16, fp16),
// read as float, each gradient rounded once to T. The softmax runs in double for float logits and for
// images; a classifier's 16-bit logits (GPT-2's 50,304 a position) take float exponentials and one
// read fewer (softmax_cross_entropy_rows_16).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/launch.hpp"
#include "replica/backend/cuda/layout.hpp"
#include "replica/backend/cuda/packed.hpp"
#include "replica/core/config.hpp"
#include "replica/core/loss_slot.hpp"

namespace REPLICA_NAMESPACE::backend::cuda {

namespace kernels {
template <core::Storage T>
__global__ void softmax_cross_entropy(int classes, int pixels, const T* logits, const std::int32_t* labels,
                                      std::size_t count, float scale, T* dlogits, double* loss, double* bad_label, bool last)
{
    REPLICA_GRID_LOOP(i, count)
    {
        const std::size_t s = i / pixels, p = i % pixels, stride = last ? 1 : std::size_t(pixels);
        const std::size_t at = last ? i * std::size_t(classes) : s * std::size_t(classes) * pixels + p;
        const T* zp = logits + at;
        const auto z = [&](std::size_t k) { return widen(zp[k]); };
        const std::int32_t label = labels[i];
        if (label < 0 || label >= classes) {
            bad_label[0] = double(label);
            bad_label[1] = double(i + 1);
            loss[i] = 0.0;
            continue;
        }
        float zmax = z(0);
        for (int c = 1; c < classes; ++c) zmax = fmaxf(zmax, z(std::size_t(c) * stride));
        double sum = 0.0;
        for (int c = 0; c < classes; ++c) sum += exp(double(z(std::size_t(c) * stride) - zmax));
        const double log_sum = log(sum);
        loss[i] = log_sum - double(z(std::size_t(label) * stride) - zmax);
        if (dlogits) {
            T* d = dlogits + at;
            for (int c = 0; c < classes; ++c) {
                const double prob = exp(double(z(std::size_t(c) * stride) - zmax) - log_sum);
                d[std::size_t(c) * stride] = narrow<T>(float((prob - (c == label ? 1.0 : 0.0)) * scale));
            }
        }
    }
}

// A label outside [0, classes) for row i: its value and position (from 1) into bad_label and the
// row's loss 0 (by thread 0), and true.
__device__ inline bool refused_label(std::int32_t label, int classes, std::size_t i, double* loss, double* bad_label)
{
    if (label >= 0 && label < classes) return false;
    if (threadIdx.x == 0) {
        bad_label[0] = double(label);
        bad_label[1] = double(i + 1);
        loss[i] = 0.0;
    }
    return true;
}

// The same for classifiers (one label per sample, pixels == 1): a block per sample, its threads
// striding over the classes, reduced in shared memory in a fixed order (a thread per sample would go
// through a thousand classes serially).
template <core::Storage T>
__global__ void softmax_cross_entropy_rows(int classes, const T* logits, const std::int32_t* labels, float scale,
                                           T* dlogits, double* loss, double* bad_label)
{
    __shared__ double lane[detail::kThreads];
    __shared__ float top[detail::kThreads];
    const std::size_t i = blockIdx.x;
    const T* zp = logits + i * std::size_t(classes);
    const auto z = [&](int k) { return widen(zp[k]); };
    const std::int32_t label = labels[i];
    if (refused_label(label, classes, i, loss, bad_label)) return;   // the whole block returns
    float m = -INFINITY;
    for (int c = threadIdx.x; c < classes; c += blockDim.x) m = fmaxf(m, z(c));
    const float zmax = detail::block_reduce(top, m, [](float a, float b) { return fmaxf(a, b); });
    double sum = 0.0;
    for (int c = threadIdx.x; c < classes; c += blockDim.x) sum += exp(double(z(c) - zmax));
    const double log_sum = log(detail::block_reduce(lane, sum, [](double a, double b) { return a + b; }));
    if (threadIdx.x == 0) loss[i] = log_sum - double(z(label) - zmax);
    if (dlogits) {
        T* d = dlogits + i * std::size_t(classes);
        for (int c = threadIdx.x; c < classes; c += blockDim.x)
            d[c] = narrow<T>(float((exp(double(z(c) - zmax) - log_sum) - (c == label ? 1.0 : 0.0)) * scale));
    }
}

// The same for 16-bit logits, whose gradient keeps 8 or 11 bits: one read of the row for its maximum
// and sum (a thread's running maximum and float sum, rescaled when the maximum grows; the block's sum
// in double) and one for the gradient, in float arithmetic, V values a load (8: the rows 16-byte
// aligned; else 1).
template <int V, core::Storage T>
__global__ void softmax_cross_entropy_rows_16(int classes, const T* logits, const std::int32_t* labels, float scale,
                                              T* dlogits, double* loss, double* bad_label)
{
    __shared__ double lane[detail::kThreads];
    __shared__ float top[detail::kThreads];
    const std::size_t i = blockIdx.x;
    const T* zp = logits + i * std::size_t(classes);
    const std::int32_t label = labels[i];
    if (refused_label(label, classes, i, loss, bad_label)) return;   // the whole block returns
    float m = -INFINITY, sum = 0.0f;
    for (int c = int(threadIdx.x) * V; c < classes; c += int(blockDim.x) * V) {
        float v[8];
        load_v<V>(zp + c, v);
        float most = v[0];
#pragma unroll
        for (int k = 1; k < V; ++k) most = fmaxf(most, v[k]);
        if (most > m) {
            sum *= expf(m - most);   // zero while m is -infinity
            m = most;
        }
#pragma unroll
        for (int k = 0; k < V; ++k) sum += expf(v[k] - m);
    }
    const float zmax = detail::block_reduce(top, m, [](float a, float b) { return fmaxf(a, b); });
    const double part = m == -INFINITY ? 0.0 : double(sum) * double(expf(m - zmax));   // a thread without classes: 0
    const double log_sum = log(detail::block_reduce(lane, part, [](double a, double b) { return a + b; }));
    if (threadIdx.x == 0) loss[i] = log_sum - double(widen(zp[label]) - zmax);
    if (dlogits) {
        T* d = dlogits + i * std::size_t(classes);
        const float shift = float(log_sum);
        for (int c = int(threadIdx.x) * V; c < classes; c += int(blockDim.x) * V) {
            float v[8];
            load_v<V>(zp + c, v);
#pragma unroll
            for (int k = 0; k < V; ++k) v[k] = (expf((v[k] - zmax) - shift) - (c + k == label ? 1.0f : 0.0f)) * scale;
            store_v<V>(d + c, v);
        }
    }
}

template <core::Storage T>
__global__ void correct(int classes, int pixels, const T* logits, const std::int32_t* labels, std::size_t count,
                        double* hit, bool last)
{
    REPLICA_GRID_LOOP(i, count)
    {
        const std::size_t s = i / pixels, p = i % pixels, stride = last ? 1 : std::size_t(pixels);
        const std::size_t at = last ? i * std::size_t(classes) : s * std::size_t(classes) * pixels + p;
        const T* zp = logits + at;
        const auto z = [&](std::size_t k) { return widen(zp[k]); };
        int best = 0;
        for (int c = 1; c < classes; ++c)
            if (z(std::size_t(c) * stride) > z(std::size_t(best) * stride)) best = c;
        hit[i] = best == labels[i] ? 1.0 : 0.0;
    }
}

// out[b] = sum of v[b * per_block .. (b + 1) * per_block) (clipped to count), by block b of 1024
// threads in a fixed order. One block sums everything; many blocks leave partial sums for a second
// launch of one block. Given a loss slot (page-locked host memory, which a kernel writes directly),
// the sum and the two label flags also go there.
template <int = 0>
__global__ void sum_fixed_order(const double* v, std::size_t count, double* out, std::size_t per_block,
                                core::LossSlot* slot = nullptr, const double* flag = nullptr)
{
    __shared__ double part[1024];
    const std::size_t begin = blockIdx.x * per_block, end = min(count, begin + per_block);
    double s = 0.0;
    for (std::size_t i = begin + threadIdx.x; i < end; i += 1024) s += v[i];
    s = detail::block_reduce(part, s, [](double a, double b) { return a + b; });
    if (threadIdx.x == 0) {
        out[blockIdx.x] = s;
        if (slot != nullptr) {
            slot->sum = s;
            slot->bad_label = flag[0];
            slot->bad_position = flag[1];
        }
    }
}
} // namespace kernels

namespace detail {
inline constexpr std::size_t kSumParts = 128, kSumPerPart = 8192;

// Two flags, then count doubles, then room for sum_fixed's partial sums.
inline double* element_scratch(const Context& ctx, std::size_t count)
{
    auto& b = ctx.reductions().device;
    if (b.size() < count + 2 + kSumParts) {
        ctx.drop_graphs();
        ctx.synchronize();
        b = ctx.allocate<double>(count + 2 + kSumParts);
    }
    return b.data() + 2;
}

// *out = the sum of v[0..count) in an order fixed by count alone (so the same every run and on every
// GPU); v must come from element_scratch(ctx, count + 1) with out == v + count. Large counts (FCN: a
// million pixels) are split over up to kSumParts blocks, then summed by one.
// With a loss slot, the sum and the label flags (flag[0..1]) are written there too (see the kernel).
inline void sum_fixed(const Context& ctx, const double* v, std::size_t count, double* out,
                      core::LossSlot* slot = nullptr, const double* flag = nullptr)
{
    const std::size_t per = std::max(kSumPerPart, (count + kSumParts - 1) / kSumParts), parts = (count + per - 1) / per;
    if (parts <= 1) {
        kernels::sum_fixed_order<<<1, 1024, 0, ctx.stream()>>>(v, count, out, count, slot, flag);
    } else {
        double* partial = out + 1;
        kernels::sum_fixed_order<<<unsigned(parts), 1024, 0, ctx.stream()>>>(v, count, partial, per);
        kernels::sum_fixed_order<<<1, 1024, 0, ctx.stream()>>>(partial, parts, out, parts, slot, flag);
    }
    check_launch("sum_fixed_order");
}

} // namespace detail

// Queues the loss and gradient kernels; the last writes the result into *slot (page-locked host
// memory, written by the kernel rather than copied: a copy to the host in the middle of a step holds
// the next kernel back): read it after synchronize(). dlogits may be null (T is taken from logits).
template <core::Storage T>
void softmax_cross_entropy(const Context& ctx, int classes, int pixels, const T* logits, const std::int32_t* labels,
                           std::size_t n, float scale, std::type_identity_t<T>* dlogits, core::LossSlot* slot)
{
    const std::size_t count = n * std::size_t(pixels);
    double* loss = detail::element_scratch(ctx, count + 1);   // [bad label, position | losses... | sum]
    double* flag = loss - 2;
    double* sum = loss + count;
    REPLICA_CHECK(cudaMemsetAsync(flag, 0, 2 * sizeof(double), ctx.stream()));
    const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
    if (pixels == 1) {
        if constexpr (std::is_same_v<T, float>)
            kernels::softmax_cross_entropy_rows<<<unsigned(n), detail::kThreads, 0, ctx.stream()>>>(
                classes, logits, labels, scale, dlogits, loss, flag);
        else if (classes % 8 == 0 && aligned(logits) && aligned(dlogits))
            kernels::softmax_cross_entropy_rows_16<8><<<unsigned(n), detail::kThreads, 0, ctx.stream()>>>(
                classes, logits, labels, scale, dlogits, loss, flag);
        else
            kernels::softmax_cross_entropy_rows_16<1><<<unsigned(n), detail::kThreads, 0, ctx.stream()>>>(
                classes, logits, labels, scale, dlogits, loss, flag);
        detail::check_launch("softmax_cross_entropy_rows");
    } else {
        kernels::softmax_cross_entropy<<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(
            classes, pixels, logits, labels, count, scale, dlogits, loss, flag, channels_last<T>(ctx));
        detail::check_launch("softmax_cross_entropy");
    }
    cudaPointerAttributes where{};
    const bool page_locked = cudaPointerGetAttributes(&where, slot) == cudaSuccess && where.type == cudaMemoryTypeHost;
    if (page_locked) {
        detail::sum_fixed(ctx, loss, count, sum, slot, flag);
    } else {   // plain host memory (no page-locked memory was to be had): copied
        cudaGetLastError();
        detail::sum_fixed(ctx, loss, count, sum);
        REPLICA_CHECK(cudaMemcpyAsync(&slot->sum, sum, sizeof(double), cudaMemcpyDeviceToHost, ctx.stream()));
        REPLICA_CHECK(cudaMemcpyAsync(&slot->bad_label, flag, 2 * sizeof(double), cudaMemcpyDeviceToHost, ctx.stream()));
    }
}

template <core::Storage T>
std::size_t count_correct(const Context& ctx, int classes, int pixels, const T* logits, const std::int32_t* labels,
                          std::size_t n)
{
    const std::size_t count = n * std::size_t(pixels);
    double* hit = detail::element_scratch(ctx, count + 1);
    kernels::correct<<<detail::blocks_for(count), detail::kThreads, 0, ctx.stream()>>>(classes, pixels, logits, labels, count, hit,
                                                                                   channels_last<T>(ctx));
    detail::check_launch("correct");
    detail::sum_fixed(ctx, hit, count, hit + count);
    double* host = ctx.reductions().host.data();
    REPLICA_CHECK(cudaMemcpyAsync(host + 2, hit + count, sizeof(double), cudaMemcpyDeviceToHost, ctx.stream()));
    ctx.synchronize();
    return std::size_t(host[2] + 0.5);
}

} // namespace replica::backend::cuda
