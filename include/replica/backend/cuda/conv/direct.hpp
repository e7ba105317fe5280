#pragma once
// The direct candidate (conv/candidate.hpp): our own kernels for convolutions with few weights per
// filter over small images (direct_conv<g>), whose windows stay in registers: the forward pass, with
// the bias and a following ReLU, and the filter gradient; the input gradient is cuDNN's
// (CudnnConv). Taken by a rule on the shape, never timed. Templated on the element type T of x, w, y
// and dz (float, bf16, fp16): values are loaded as floats, the sums are float, y is rounded to T once
// and the filter gradient is float. Only under nvcc.

#include <algorithm>
#include <cstddef>

#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/conv/bias.hpp"
#include "replica/backend/cuda/conv/candidate.hpp"
#include "replica/backend/cuda/conv/cudnn.hpp"
#include "replica/backend/cuda/conv/storage.hpp"
#include "replica/backend/cuda/launch.hpp"
#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::backend::cuda {

namespace kernels {
// The filter gradient of a convolution with few weights per filter (direct_conv<g>), pass 1:
// block (f * g.c + ci, part) takes filter f, input channel ci and samples [part * per_part, ...): each
// thread keeps the kh x kw sums of its output pixels in registers (the window unrolled), the warps add
// them by shuffles and the block in shared memory, in a fixed order; pass 2 (filter_grad_totals) adds
// the parts in order. So the result depends on the shape only.
// (The window comes as integers: nvcc's kernel stubs take no class-type template arguments.)
template <class T, int C, int H, int W, int KH, int KW, int SH, int SW, int PH, int PW, int OH, int OW>
__global__ void filter_grad_parts(const T* x, const T* dz, float* partial, unsigned cout, unsigned n, unsigned per_part)
{
    constexpr core::Window g{C, H, W, KH, KW, SH, SW, PH, PW, OH, OW};
    constexpr int K = g.kh * g.kw;
    constexpr unsigned pixels = unsigned(g.oh) * unsigned(g.ow);
    constexpr unsigned warps = detail::kThreads / 32;
    __shared__ float by_warp[warps][K];
    const unsigned fc = blockIdx.x, f = fc / unsigned(g.c), ci = fc % unsigned(g.c);
    const unsigned first = blockIdx.y * per_part, last = min(n, first + per_part);
    float acc[K];
#pragma unroll
    for (int k = 0; k < K; ++k) acc[k] = 0.0f;
    for (unsigned s = first; s < last; ++s) {
        const T* xs = x + (std::size_t(s) * g.c + ci) * std::size_t(g.h) * g.w;
        const T* ds = dz + (std::size_t(s) * cout + f) * pixels;
        for (unsigned p = threadIdx.x; p < pixels; p += detail::kThreads) {
            const int oh = int(p / unsigned(g.ow)), ow = int(p % unsigned(g.ow));
            const float d = kernels::widen(ds[p]);
#pragma unroll
            for (int i = 0; i < g.kh; ++i) {
                const int ih = oh * g.sh - g.ph + i;
#pragma unroll
                for (int j = 0; j < g.kw; ++j) {
                    const int iw = ow * g.sw - g.pw + j;
                    const bool inside = ih >= 0 && ih < g.h && iw >= 0 && iw < g.w;
                    acc[i * g.kw + j] = fmaf(d, inside ? kernels::widen(xs[ih * g.w + iw]) : 0.0f, acc[i * g.kw + j]);
                }
            }
        }
    }
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
    for (int k = 0; k < K; ++k) {
        float v = acc[k];
        for (unsigned offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
        if (lane == 0) by_warp[warp][k] = v;
    }
    __syncthreads();
    for (unsigned k = threadIdx.x; k < unsigned(K); k += detail::kThreads) {
        float v = 0.0f;
        for (unsigned w = 0; w < warps; ++w) v += by_warp[w][k];
        partial[(std::size_t(fc) * gridDim.y + blockIdx.y) * K + k] = v;
    }
}

// The forward pass of the same convolutions (direct_conv<g>): a thread per output pixel of a
// sample reads its window once into registers and writes every filter's output, bias added (none
// where b is null) and the ReLU applied when it follows (the filters and biases in shared memory).
template <class T, int C, int H, int W, int KH, int KW, int SH, int SW, int PH, int PW, int OH, int OW, bool Relu>
__global__ void conv_forward_direct(const T* w, const float* b, const T* x, T* y, unsigned cout, unsigned n)
{
    constexpr core::Window g{C, H, W, KH, KW, SH, SW, PH, PW, OH, OW};
    constexpr int K = g.c * g.kh * g.kw;
    constexpr unsigned pixels = unsigned(g.oh) * unsigned(g.ow);
    extern __shared__ float filters[];   // cout * K weights, then cout biases
    for (unsigned i = threadIdx.x; i < cout * K; i += blockDim.x) filters[i] = kernels::widen(w[i]);
    for (unsigned i = threadIdx.x; i < cout; i += blockDim.x) filters[cout * K + i] = b ? b[i] : 0.0f;
    __syncthreads();
    const std::size_t t = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= std::size_t(n) * pixels) return;
    const std::size_t s = t / pixels;
    const unsigned p = unsigned(t % pixels);
    const int oh = int(p / unsigned(g.ow)), ow = int(p % unsigned(g.ow));
    float window[K];
#pragma unroll
    for (int c = 0; c < g.c; ++c)
#pragma unroll
        for (int i = 0; i < g.kh; ++i)
#pragma unroll
            for (int j = 0; j < g.kw; ++j) {
                const int ih = oh * g.sh - g.ph + i, iw = ow * g.sw - g.pw + j;
                const bool inside = ih >= 0 && ih < g.h && iw >= 0 && iw < g.w;
                window[(c * g.kh + i) * g.kw + j] = inside ? kernels::widen(x[((s * g.c + c) * g.h + ih) * g.w + iw]) : 0.0f;
            }
    for (unsigned f = 0; f < cout; ++f) {
        float v = filters[cout * K + f];
#pragma unroll
        for (int k = 0; k < K; ++k) v = fmaf(filters[f * K + k], window[k], v);
        if constexpr (Relu) v = fmaxf(v, 0.0f);
        y[(s * cout + f) * pixels + p] = kernels::narrow<T>(v);
    }
}

// Pass 2: dw[fc * K + k] = the sum over parts, in order.
template <int = 0>
__global__ void filter_grad_totals(const float* partial, float* dw, unsigned weights_per_fc, unsigned fcs, unsigned parts)
{
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= fcs * weights_per_fc) return;
    const unsigned fc = i / weights_per_fc, k = i % weights_per_fc;
    float v = 0.0f;
    for (unsigned part = 0; part < parts; ++part) v += partial[(std::size_t(fc) * parts + part) * weights_per_fc + k];
    dw[i] = v;
}
} // namespace kernels

namespace detail {
// Convolutions whose filters have few weights per input channel and few input channels, over small
// images (LeNet's first layer: 1 x 5 x 5 over 24 x 24 output pixels) run forward and get their filter
// gradient by our kernels (conv_forward_direct, filter_grad_parts) rather than cuDNN's: a window stays
// in registers. Over large images (FCN's first layer, 3 x 3 x 3) a block per filter, channel and part
// of the batch is too little parallelism for the filter gradient, so those stay with cuDNN
// (docs/results/ has the measurements behind the limits).
template <core::Window g>
inline constexpr bool direct_conv = g.kh * g.kw <= 25 && g.c * g.kh * g.kw <= 32 && g.oh * g.ow <= 1024;

// Parts of the batch for filter_grad_parts: about 256 blocks in all, from the shape alone.
inline unsigned filter_grad_part_count(unsigned fcs, std::size_t n)
{
    return unsigned(std::clamp<std::size_t>((256 + fcs - 1) / fcs, 1, std::max<std::size_t>(n, 1)));
}

} // namespace detail

template <core::Window g>
struct DirectConv {
    static_assert(detail::direct_conv<g>, "DirectConv takes only the shapes of detail::direct_conv");

    // The forward pass runs here when the filters and biases fit the default shared memory;
    // otherwise by cuDNN (or the products where the autotuner took them).
    static bool takes_forward(int cout) { return std::size_t(cout) * (K + 1) * sizeof(float) <= 48 * 1024; }

    // Needs no plan.
    template <core::Storage T>
    static void forward(const Context& ctx, const ConvPlan*, const ConvForward<T>& a)
    {
        const std::size_t shared = std::size_t(a.cout) * (K + 1) * sizeof(float);
        const auto blocks = unsigned((a.n * pixels + detail::kThreads - 1) / detail::kThreads);
        if (a.relu)
            kernels::conv_forward_direct<T, g.c, g.h, g.w, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.oh, g.ow, true>
                <<<blocks, detail::kThreads, shared, ctx.stream()>>>(a.w, a.b, a.x, a.y, unsigned(a.cout), unsigned(a.n));
        else
            kernels::conv_forward_direct<T, g.c, g.h, g.w, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.oh, g.ow, false>
                <<<blocks, detail::kThreads, shared, ctx.stream()>>>(a.w, a.b, a.x, a.y, unsigned(a.cout), unsigned(a.n));
        detail::check_launch("conv_forward_direct");
    }

    // The bias gradient if any (conv/bias.hpp), the filter gradient by our kernels (the scratch holds their
    // partial sums after the bias's), the input gradient by cuDNN: `plan` is the layer's.
    template <core::Storage T>
    static void backward(const Context& ctx, const ConvPlan* plan, const ConvBackward<T>& a)
    {
        detail::bias_backward(ctx, a.dy, a.db, std::size_t(a.cout), a.n, pixels, a.scratch, a.relu_y, a.dz);
        const T* dz = a.relu_y ? a.dz : a.dy;
        const unsigned fcs = unsigned(a.cout) * unsigned(g.c), parts = detail::filter_grad_part_count(fcs, a.n);
        const unsigned per_part = unsigned((a.n + parts - 1) / parts);
        kernels::filter_grad_parts<T, g.c, g.h, g.w, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.oh, g.ow>
            <<<dim3(fcs, parts), detail::kThreads, 0, ctx.stream()>>>(a.x, dz, a.scratch, unsigned(a.cout), unsigned(a.n), per_part);
        detail::check_launch("filter_grad_parts");
        constexpr unsigned KW = unsigned(g.kh * g.kw);
        kernels::filter_grad_totals<<<detail::blocks_for(fcs * KW), detail::kThreads, 0, ctx.stream()>>>(a.scratch, a.dw, KW,
                                                                                                      fcs, parts);
        detail::check_launch("filter_grad_totals");
        if (a.dx) CudnnConv<g>::input_gradient(ctx, *plan, a);
    }

    // The scratch its backward needs: the bias's partial sums, then the filter gradient's (float for
    // every T).
    static std::size_t scratch_size(int cout, std::size_t n)
    {
        const unsigned fcs = unsigned(cout) * unsigned(g.c);
        return std::size_t(fcs) * detail::filter_grad_part_count(fcs, n) * g.kh * g.kw;
    }

private:
    static constexpr std::size_t K = std::size_t(g.c) * g.kh * g.kw, pixels = std::size_t(g.oh) * g.ow;
};

} // namespace replica::backend::cuda
