#pragma once
// The cuDNN candidate (conv/candidate.hpp): cuDNN's convolution algorithms. Its plan is the
// layer's descriptors and one algorithm per pass (forward, data gradient, filter gradient): cuDNN's
// heuristic choice (deterministic ones only on request), or its heuristic candidates timed as a step
// runs them (Options::benchmark, timing.hpp). The bias gradient is ours (conv/bias.hpp). A transposed
// convolution runs the adjoint passes of the convolution from its output to its input. For T = bf16
// or fp16 the tensors and filters are T, computed in FP32 on tensor cores; cuDNN's filter gradient
// then comes out in T, into the scratch after the bias's partial sums (cudnn_scratch_size), and is
// widened to the float dw. Only under nvcc.

#include <cudnn.h>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <string>
#include <vector>

#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/conv/bias.hpp"
#include "replica/backend/cuda/conv/candidate.hpp"
#include "replica/backend/cuda/conv/storage.hpp"
#include "replica/backend/cuda/elementwise.hpp"
#include "replica/backend/cuda/layout.hpp"
#include "replica/backend/cuda/timing.hpp"
#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::backend::cuda {

namespace detail {
template <class Perf>
int pick(const Perf* perf, int found, bool deterministic)
{
    for (int i = 0; i < found; ++i)
        if (perf[i].status == CUDNN_STATUS_SUCCESS && (!deterministic || perf[i].determinism == CUDNN_DETERMINISTIC))
            return i;
    throw Error("cuDNN offers no usable convolution algorithm for this layer" +
                std::string(deterministic ? " among its deterministic ones: turn deterministic mode off" : ""));
}

// Options::benchmark: cuDNN's candidates timed as a step runs them (timing.hpp), with scratch
// tensors of the layer's sizes. cudnnFind* is not used: its times, taken outside a replayed step,
// rank the candidates differently from a step's (docs/results/).
class AlgorithmTimer {
public:
    // Scratch for tensors x, y, w of these sizes (as floats: enough for any element type) and for the
    // candidates' workspaces (up to 1 GiB; larger candidates are left out).
    template <class F, class D, class B>
    AlgorithmTimer(const Context& ctx, std::size_t x, std::size_t y, std::size_t w, const F* f, int nf, const D* d,
                   int nd, const B* b, int nb)
        : limit_(workspace_limit(std::size_t{1} << 30)),
          scratch_(ctx, {x * sizeof(float), y * sizeof(float), w * sizeof(float), most(f, nf, d, nd, b, nb)}),
          timer_(ctx)
    {
    }
    float* x() const { return scratch_.floats(0); }
    float* y() const { return scratch_.floats(1); }
    float* w() const { return scratch_.floats(2); }

    // The chosen one of perf[0, found): run(algo, workspace, bytes) queues one call of a candidate.
    // Adds its seconds per call to `seconds` (CallTimer::never if none could be timed).
    template <class Perf, class Run>
    auto choose(const Perf* perf, int found, Run&& run, double& seconds)
    {
        std::vector<int> usable;
        for (int i = 0; i < found; ++i)
            if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= limit_) usable.push_back(i);
        if (usable.empty()) {
            seconds = CallTimer::never;
            return perf[pick(perf, found, false)].algo;
        }
        std::vector<double> took(usable.size(), -1.0);
        auto time = [&](int i, double give_up) {
            const Perf& c = perf[usable[std::size_t(i)]];
            return took[std::size_t(i)] = timer_.seconds(
                       [&] { return run(c.algo, scratch_.bytes(3), c.memory) == CUDNN_STATUS_SUCCESS; }, give_up);
        };
        const int k = CallTimer::fastest(int(usable.size()), time);
        seconds += took[std::size_t(k)] >= 0.0 ? took[std::size_t(k)] : time(k, CallTimer::never);
        return perf[usable[std::size_t(k)]].algo;
    }

private:
    template <class F, class D, class B>
    std::size_t most(const F* f, int nf, const D* d, int nd, const B* b, int nb) const
    {
        std::size_t m = 0;
        auto fit = [&](const auto* perf, int found) {
            for (int i = 0; i < found; ++i)
                if (perf[i].status == CUDNN_STATUS_SUCCESS && perf[i].memory <= limit_) m = std::max(m, perf[i].memory);
        };
        fit(f, nf);
        fit(d, nd);
        fit(b, nb);
        return m;
    }

    std::size_t limit_;
    TimingScratch scratch_;
    CallTimer timer_;
};

// The descriptors of a convolution of window g with `cout` filters over n samples: x (n, g.c, g.h,
// g.w), w (cout, g.c, g.kh, g.kw), y (n, cout, g.oh, g.ow), of type T, x and y in the context's
// layout for T (layout.hpp), computed in FP32: for float TF32 allowed where Options::allow_tf32, for
// bf16 and fp16 on tensor cores.
template <core::Storage T>
void describe(const Context& ctx, ConvPlan& p, const core::Window& g, int cout, std::size_t n)
{
    constexpr cudnnDataType_t type = cudnn_type<T>;
    const cudnnTensorFormat_t format = channels_last<T>(ctx) ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    p.x = make_tensor_descriptor();
    p.y = make_tensor_descriptor();
    p.w = make_filter_descriptor();
    p.conv = make_convolution_descriptor();
    REPLICA_CHECK(cudnnSetTensor4dDescriptor(p.x, format, type, int(n), g.c, g.h, g.w));
    REPLICA_CHECK(cudnnSetTensor4dDescriptor(p.y, format, type, int(n), cout, g.oh, g.ow));
    REPLICA_CHECK(cudnnSetFilter4dDescriptor(p.w, type, format, cout, g.c, g.kh, g.kw));
    REPLICA_CHECK(cudnnSetConvolution2dDescriptor(p.conv, g.ph, g.pw, g.sh, g.sw, 1, 1, CUDNN_CROSS_CORRELATION,
                                                  CUDNN_DATA_FLOAT));
    const cudnnMathType_t math = !std::same_as<T, float>   ? CUDNN_TENSOR_OP_MATH
                                 : ctx.options().allow_tf32 ? CUDNN_DEFAULT_MATH
                                                            : CUDNN_FMA_MATH;
    REPLICA_CHECK(cudnnSetConvolutionMathType(p.conv, math));
}

// The scratch of a pass with cuDNN's filter gradient, in floats: the bias gradient's partial sums
// (`bias` floats), then for T other than float the filter gradient in T (`weights` values), from
// the next 256-byte boundary on (cudnn_filter_scratch), then the filter reordered for channels-last
// activations (the same size, from the next boundary: cudnn_reordered_filter).
template <core::Storage T>
std::size_t cudnn_scratch_size(std::size_t bias, std::size_t weights)
{
    const std::size_t filter = (weights * sizeof(T) + 255) / 256 * 64;
    if constexpr (std::same_as<T, float>) return bias;
    else return (bias + 63) / 64 * 64 + 2 * filter;
}
template <core::Storage T>
T* cudnn_filter_scratch(float* scratch, std::size_t bias)
{
    return reinterpret_cast<T*>(scratch + (bias + 63) / 64 * 64);
}
template <core::Storage T>
T* cudnn_reordered_filter(float* scratch, std::size_t bias, std::size_t weights)
{
    return reinterpret_cast<T*>(scratch + (bias + 63) / 64 * 64 + (weights * sizeof(T) + 255) / 256 * 64);
}

// The filter cuDNN reads: w (k, c, kh, kw) itself, or for channels-last activations w reordered to
// (k, kh, kw, c) into `reordered` (the layout of cuDNN's NHWC filters), which for a 1x1 window is w's.
template <core::Storage T>
const T* cudnn_filter(const Context& ctx, const T* w, T* reordered, std::size_t k, std::size_t c, std::size_t window)
{
    if (!channels_last<T>(ctx) || window == 1) return w;
    transpose_planes(ctx, w, reordered, k, c, window);
    return reordered;
}

// dw (`weights` floats) = cuDNN's filter gradient of the plan's convolution, whose input (p.x) is
// `in` and whose output's gradient (p.y) is `dout`; for T other than float through `filter` (T,
// cudnn_filter_scratch), widened. ws: the context's workspace.
// For channels-last activations the filter gradient comes out (k, kh, kw, c) and is reordered to dw's
// (k, c, kh, kw) as it is widened (k filters of c channels over `window` positions).
template <core::Storage T>
void cudnn_filter_gradient(const Context& ctx, const ConvPlan& p, const T* in, const T* dout, float* dw, T* filter,
                           std::size_t k, std::size_t c, std::size_t window, void* ws)
{
    const float one = 1.0f, zero = 0.0f;
    if constexpr (std::same_as<T, float>) {
        REPLICA_CHECK(cudnnConvolutionBackwardFilter(ctx.cudnn(), &one, p.x, in, p.y, dout, p.conv, p.bwd_filter, ws,
                                                     p.workspace, &zero, p.w, dw));
    } else {
        REPLICA_CHECK(cudnnConvolutionBackwardFilter(ctx.cudnn(), &one, p.x, in, p.y, dout, p.conv, p.bwd_filter, ws,
                                                     p.workspace, &zero, p.w, filter));
        if (channels_last<T>(ctx) && window > 1) transpose_planes(ctx, filter, dw, k, window, c);
        else convert(ctx, filter, dw, k * c * window);
    }
}

// cuDNN's heuristic candidates for the three passes of a described plan, best first.
struct CudnnCandidates {
    static constexpr int kMax = 16;
    cudnnConvolutionFwdAlgoPerf_t forward[kMax];
    cudnnConvolutionBwdDataAlgoPerf_t data[kMax];
    cudnnConvolutionBwdFilterAlgoPerf_t filter[kMax];
    int forward_count = 0, data_count = 0, filter_count = 0;

    CudnnCandidates(const Context& ctx, const ConvPlan& p)
    {
        cudnnHandle_t h = ctx.cudnn();
        REPLICA_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, p.x, p.w, p.conv, p.y, kMax, &forward_count, forward));
        REPLICA_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, p.w, p.y, p.conv, p.x, kMax, &data_count, data));
        REPLICA_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, p.x, p.y, p.conv, p.w, kMax, &filter_count, filter));
    }
};

// cuDNN's algorithms for the three passes and, when timed, their seconds per call (the forward
// algorithm's; the two gradients' together, of which the input gradient's alone in data_seconds).
struct CudnnAlgorithms {
    cudnnConvolutionFwdAlgo_t fwd{};
    cudnnConvolutionBwdDataAlgo_t bwd_data{};
    cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
    PassSeconds seconds;
    double data_seconds = 0.0;
};

// cuDNN's own choice: its first usable candidate of each pass (deterministic: its first deterministic one).
inline CudnnAlgorithms cudnn_heuristic(const CudnnCandidates& c, bool deterministic)
{
    CudnnAlgorithms a;
    a.fwd = c.forward[pick(c.forward, c.forward_count, deterministic)].algo;
    a.bwd_data = c.data[pick(c.data, c.data_count, deterministic)].algo;
    a.bwd_filter = c.filter[pick(c.filter, c.filter_count, deterministic)].algo;
    return a;
}

// The candidates timed (AlgorithmTimer) on scratch tensors of the plan's sizes, for window g with
// `cout` filters over n samples (the plan's geometry).
inline CudnnAlgorithms cudnn_timed(const Context& ctx, const ConvPlan& p, const CudnnCandidates& c, const core::Window& g,
                                   int cout, std::size_t n)
{
    AlgorithmTimer timer(ctx, n * g.c * g.h * g.w, n * std::size_t(cout) * g.oh * g.ow, std::size_t(cout) * g.c * g.kh * g.kw,
                         c.forward, c.forward_count, c.data, c.data_count, c.filter, c.filter_count);
    float *x = timer.x(), *y = timer.y(), *w = timer.w();
    const float one = 1.0f, zero = 0.0f;
    cudnnHandle_t h = ctx.cudnn();
    CudnnAlgorithms a;
    a.fwd = timer.choose(c.forward, c.forward_count, [&](cudnnConvolutionFwdAlgo_t algo, void* ws, std::size_t bytes) {
        return cudnnConvolutionForward(h, &one, p.x, x, p.w, w, p.conv, algo, ws, bytes, &zero, p.y, y);
    }, a.seconds.forward);
    a.bwd_data = timer.choose(c.data, c.data_count, [&](cudnnConvolutionBwdDataAlgo_t algo, void* ws, std::size_t bytes) {
        return cudnnConvolutionBackwardData(h, &one, p.w, w, p.y, y, p.conv, algo, ws, bytes, &zero, p.x, x);
    }, a.data_seconds);
    a.seconds.backward = a.data_seconds;
    a.bwd_filter = timer.choose(c.filter, c.filter_count, [&](cudnnConvolutionBwdFilterAlgo_t algo, void* ws, std::size_t bytes) {
        return cudnnConvolutionBackwardFilter(h, &one, p.x, x, p.y, y, p.conv, algo, ws, bytes, &zero, p.w, w);
    }, a.seconds.backward);
    return a;
}

// The workspace the plan's cuDNN algorithms need (the largest of the three passes').
inline std::size_t cudnn_workspace(const Context& ctx, const ConvPlan& p)
{
    cudnnHandle_t h = ctx.cudnn();
    std::size_t s1 = 0, s2 = 0, s3 = 0;
    REPLICA_CHECK(cudnnGetConvolutionForwardWorkspaceSize(h, p.x, p.w, p.conv, p.y, p.fwd, &s1));
    REPLICA_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(h, p.w, p.y, p.conv, p.x, p.bwd_data, &s2));
    REPLICA_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(h, p.x, p.y, p.conv, p.w, p.bwd_filter, &s3));
    return std::max({s1, s2, s3});
}
} // namespace detail

template <core::Window g>
struct CudnnConv {
    // The scratch its backward needs (floats).
    template <core::Storage T>
    static std::size_t scratch_size(int cout, std::size_t n)
    {
        return detail::cudnn_scratch_size<T>(bias_scratch<T>(cout, n), weights(cout));
    }

    // The plan's forward algorithm, then the bias (if any) and the ReLU by our kernel.
    template <core::Storage T>
    static void forward(const Context& ctx, const ConvPlan* plan, const ConvForward<T>& a)
    {
        const ConvPlan& p = *plan;
        const float one = 1.0f, zero = 0.0f;
        const T* w = filter(ctx, a.w, a.scratch, a.cout, a.n);
        REPLICA_CHECK(cudnnConvolutionForward(ctx.cudnn(), &one, p.x, a.x, p.w, w, p.conv, p.fwd, ctx.workspace(0), p.workspace,
                                              &zero, p.y, a.y));
        detail::bias_forward(ctx, a.b, a.y, a.n, std::size_t(a.cout), std::size_t(g.oh) * g.ow, a.relu);
    }

    // The bias gradient (if any; with the ReLU's backward where relu_y: dz), then the filter and the
    // input gradients by the plan's algorithms.
    template <core::Storage T>
    static void backward(const Context& ctx, const ConvPlan* plan, const ConvBackward<T>& a)
    {
        const ConvPlan& p = *plan;
        detail::bias_backward(ctx, a.dy, a.db, std::size_t(a.cout), a.n, std::size_t(g.oh) * g.ow, a.scratch, a.relu_y, a.dz);
        const T* dz = a.relu_y ? a.dz : a.dy;
        void* ws = ctx.workspace(0);
        detail::cudnn_filter_gradient(ctx, p, a.x, dz, a.dw, detail::cudnn_filter_scratch<T>(a.scratch, bias_scratch<T>(a.cout, a.n)),
                                      std::size_t(a.cout), std::size_t(g.c), window(), ws);
        if (a.dx) input_gradient(ctx, p, a);
    }

    // a.dx = the input gradient by the plan's algorithm (a.dx + it, with a.accumulate: cuDNN's beta),
    // from the output's gradient (a.dz where a.relu_y, else a.dy), after the bias pass that wrote a.dz.
    template <core::Storage T>
    static void input_gradient(const Context& ctx, const ConvPlan& p, const ConvBackward<T>& a)
    {
        const float one = 1.0f, beta = a.accumulate ? 1.0f : 0.0f;
        const T* dz = a.relu_y ? a.dz : a.dy;
        REPLICA_CHECK(cudnnConvolutionBackwardData(ctx.cudnn(), &one, p.w, filter(ctx, a.w, a.scratch, a.cout, a.n), p.y, dz,
                                                   p.conv, p.bwd_data, ctx.workspace(0), p.workspace, &beta, p.x, a.dx));
    }

private:
    template <core::Storage T>
    static std::size_t bias_scratch(int cout, std::size_t n)
    {
        return detail::bias_scratch<T>(std::size_t(cout), n * g.oh * g.ow);
    }
    static std::size_t weights(int cout) { return std::size_t(cout) * g.c * g.kh * g.kw; }
    static constexpr std::size_t window() { return std::size_t(g.kh) * g.kw; }
    // The filter cuDNN reads (detail::cudnn_filter), reordered into the scratch's last region.
    template <core::Storage T>
    static const T* filter(const Context& ctx, const T* w, float* scratch, int cout, std::size_t n)
    {
        if constexpr (std::same_as<T, float>) return w;
        else return detail::cudnn_filter(ctx, w, detail::cudnn_reordered_filter<T>(scratch, bias_scratch<T>(cout, n), weights(cout)),
                                         std::size_t(cout), std::size_t(g.c), window());
    }
};

// A transposed convolution by cuDNN: window g maps its OUTPUT (g.c = cout channels, g.h x g.w) to
// its input (c channels, g.oh x g.ow), and the weight (c, cout, kh, kw) is that convolution's filter;
// the plan is that convolution's. Forward is its data gradient, backward its filter gradient and
// forward pass.
template <core::Window g>
struct CudnnConvTranspose {
    // The scratch its backward needs (floats), for c input channels.
    template <core::Storage T>
    static std::size_t scratch_size(int c, std::size_t n)
    {
        return detail::cudnn_scratch_size<T>(bias_scratch<T>(n), weights(c));
    }

    template <core::Storage T>
    static void forward(const Context& ctx, const ConvPlan& p, int c, const T* w, const float* b, const T* x, T* y, std::size_t n,
                        float* scratch)
    {
        const float one = 1.0f, zero = 0.0f;
        REPLICA_CHECK(cudnnConvolutionBackwardData(ctx.cudnn(), &one, p.w, filter(ctx, w, scratch, c, n), p.y, x, p.conv,
                                                   p.bwd_data, ctx.workspace(0), p.workspace, &zero, p.x, y));
        // Bias over the output's channels: the output is the plan's "x" tensor.
        detail::bias_forward(ctx, b, y, n, std::size_t(g.c), std::size_t(g.h) * g.w, false);
    }

    // c: the input's channels (the plan's filters).
    template <core::Storage T>
    static void backward(const Context& ctx, const ConvPlan& p, int c, const T* w, const T* x, const T* dy, T* dx, float* dw,
                         float* db, std::size_t n, float* scratch)
    {
        const float one = 1.0f, zero = 0.0f;
        void* ws = ctx.workspace(0);
        // Bias over the output's channels (g.c, g.h x g.w): dy is the output's gradient.
        detail::bias_backward(ctx, dy, db, std::size_t(g.c), n, std::size_t(g.h) * g.w, scratch);
        detail::cudnn_filter_gradient(ctx, p, dy, x, dw, detail::cudnn_filter_scratch<T>(scratch, bias_scratch<T>(n)),
                                      std::size_t(c), std::size_t(g.c), window(), ws);
        if (dx)
            REPLICA_CHECK(cudnnConvolutionForward(ctx.cudnn(), &one, p.x, dy, p.w, filter(ctx, w, scratch, c, n), p.conv, p.fwd,
                                                  ws, p.workspace, &zero, p.y, dx));
    }

private:
    template <core::Storage T>
    static std::size_t bias_scratch(std::size_t n) { return detail::bias_scratch<T>(std::size_t(g.c), n * g.h * g.w); }
    static std::size_t weights(int c) { return std::size_t(c) * g.c * g.kh * g.kw; }
    static constexpr std::size_t window() { return std::size_t(g.kh) * g.kw; }
    template <core::Storage T>
    static const T* filter(const Context& ctx, const T* w, float* scratch, int c, std::size_t n)
    {
        if constexpr (std::same_as<T, float>) return w;
        else return detail::cudnn_filter(ctx, w, detail::cudnn_reordered_filter<T>(scratch, bias_scratch<T>(n), weights(c)),
                                         std::size_t(c), std::size_t(g.c), window());
    }
};

} // namespace replica::backend::cuda
