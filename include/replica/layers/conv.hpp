#pragma once
// Convolutions.
//   Conv1d<Out, K, Stride = 1, Pad = 0, B = Bias::yes>          (c, l)    -> (Out, (l + 2 Pad - K) / Stride + 1)
//   Conv2d<Out, K, Stride = 1, Pad = 0, B = Bias::yes>          (c, h, w) -> (Out, oh, ow), square kernel
//   ConvTranspose2d<Out, K, Stride = 1, Pad = 0, B = Bias::yes> (c, h, w) -> (Out, (h - 1) Stride - 2 Pad + K, ...)
// Parameters: weights then, with Bias::yes, one bias per output channel; with Bias::none the weights
// alone (PyTorch's bias=False: a convolution followed by a batch normalisation, whose shift makes a
// bias redundant). Weight layout as PyTorch: (Out, c, K[, K]) for a convolution, (c, Out, K, K) for a
// transposed one. Initialised U(-1/sqrt(fan_in), 1/sqrt(fan_in)); a layer's weights are the same
// with or without its bias.

#include <array>
#include <cmath>
#include <cstddef>

#include "replica/backend/layout_rules.hpp"
#include "replica/core/config.hpp"
#include "replica/core/window.hpp"
#include "replica/layers/op.hpp"

namespace REPLICA_NAMESPACE::layers {

using core::Window;

// Whether a convolution adds a learned bias per output channel.
enum class Bias { yes, none };

namespace detail {
inline void conv_init(float* params, std::uint64_t seed, std::uint32_t id, std::size_t weights, std::size_t biases,
               std::size_t fan_in)
{
    const float bound = 1.0f / std::sqrt(float(fan_in));
    init_uniform(params, weights + biases, bound, seed, id);
}

// The bias of a layer with `weights` weights in its parameters p (weights first), or null without one:
// the backends take a null bias (and a null bias gradient) as "no bias", with no pass for it.
template <Bias B, class T>
constexpr T* bias_of(T* p, std::size_t weights)
{
    return B == Bias::yes ? p + weights : nullptr;
}

// A convolution over the window that its geometry G gives (G::window, G::input_shape, G::output_shape,
// G::weight_count, G::fan_in): Conv1d's and Conv2d's op, which differ only in their geometry.
template <std::size_t Out, class G, Bias B, class T>
struct ConvOp : LeafOp {
    using input_shape = typename G::input_shape;
    using output_shape = typename G::output_shape;
    static constexpr std::size_t weight_count = G::weight_count;
    static constexpr std::size_t bias_count = B == Bias::yes ? Out : 0;
    static constexpr std::size_t param_count = weight_count + bias_count;
    static constexpr std::array param_blocks{core::ParamBlock{weight_count, core::ParamKind::weight},
                                             core::ParamBlock{bias_count, core::ParamKind::bias}};
    static constexpr Window window = G::window;
    static constexpr bool wants_channels_last = !backend::detours_channels_last(window);

    using LeafOp::LeafOp;
    void init(float* p, std::uint64_t seed) const { conv_init(p, seed, id, weight_count, bias_count, G::fan_in); }
    template <class Ctx>
    std::size_t scratch_size(const Ctx& ctx, std::size_t n) const { return conv_scratch_size<window, T>(ctx, Out, n); }
    template <class Ctx>
    void forward(Ctx& ctx, const Pass&, const ForwardArgs<T>& a) const
    {
        conv_forward<window>(ctx, Out, a.weights, bias_of<B>(a.params, weight_count), a.x, a.y, a.n, a.scratch, false);
    }
    // Forward followed by a ReLU, which then does not run: the bias and the ReLU take one pass; in
    // backward, the ReLU's rule runs in the bias-gradient pass. Without a bias, each backend applies
    // the ReLU and its rule where it saves most (backend/*/conv.hpp).
    static constexpr bool fuses_relu = true;
    template <class Ctx>
    void forward_relu(Ctx& ctx, const Pass&, const ForwardArgs<T>& a) const
    {
        conv_forward<window>(ctx, Out, a.weights, bias_of<B>(a.params, weight_count), a.x, a.y, a.n, a.scratch, true);
    }
    // The input gradient may be added to dx (a.accumulate): a Residual's shortcut gradient is then
    // summed in the pass that writes it.
    static constexpr bool accumulates_input_gradient = true;
    template <class Ctx>
    void backward(Ctx& ctx, const Pass&, const BackwardArgs<T>& a) const
    {
        conv_backward<window>(ctx, Out, a.weights, a.x, a.dy, a.dx, a.dparams, bias_of<B>(a.dparams, weight_count), a.n,
                              a.scratch, a.accumulate);
    }
    // Backward of both: a.y and a.dy are the ReLU's output and its gradient; dz receives this op's.
    template <class Ctx>
    void backward_relu(Ctx& ctx, const Pass&, const BackwardArgs<T>& a, T* dz) const
    {
        conv_backward_relu<window>(ctx, Out, a.weights, a.x, a.y, a.dy, dz, a.dx, a.dparams,
                                   bias_of<B>(a.dparams, weight_count), a.n, a.scratch, a.accumulate);
    }
};

template <class In, std::size_t Out, std::size_t K, std::size_t Stride, std::size_t Pad>
struct Conv2dGeometry {
    static_assert(In::rank == 3,
                  "Conv2d needs a (channels, height, width) input; use Conv1d for (channels, length), "
                  "and put Flatten after convolutions, not before");
    static constexpr std::size_t C = In::dims[0], H = In::dims[1], W = In::dims[2];
    static_assert(K <= H + 2 * Pad && K <= W + 2 * Pad,
                  "Conv2d kernel is larger than its (padded) input: use a smaller kernel, more padding, "
                  "or fewer pooling layers before it");
    static constexpr std::size_t OH = (H + 2 * Pad - K) / Stride + 1, OW = (W + 2 * Pad - K) / Stride + 1;
    using input_shape = In;
    using output_shape = Shape<Out, OH, OW>;
    static constexpr std::size_t weight_count = Out * C * K * K, fan_in = C * K * K;
    static constexpr Window window{int(C), int(H), int(W), int(K), int(K), int(Stride), int(Stride),
                                   int(Pad), int(Pad), int(OH), int(OW)};
};

// A length is a row of an image one pixel high.
template <class In, std::size_t Out, std::size_t K, std::size_t Stride, std::size_t Pad>
struct Conv1dGeometry {
    static_assert(In::rank == 2, "Conv1d needs a (channels, length) input; use Conv2d for images");
    static constexpr std::size_t C = In::dims[0], L = In::dims[1];
    static_assert(K <= L + 2 * Pad,
                  "Conv1d kernel is longer than its (padded) input: use a smaller kernel, more padding, "
                  "or fewer pooling layers before it");
    static constexpr std::size_t OL = (L + 2 * Pad - K) / Stride + 1;
    using input_shape = In;
    using output_shape = Shape<Out, OL>;
    static constexpr std::size_t weight_count = Out * C * K, fan_in = C * K;
    static constexpr Window window{int(C), 1, int(L), 1, int(K), 1, int(Stride), 0, int(Pad), 1, int(OL)};
};
} // namespace detail

template <std::size_t Out, std::size_t K, std::size_t Stride = 1, std::size_t Pad = 0, Bias B = Bias::yes>
struct Conv2d {
    static_assert(Out > 0 && K > 0 && Stride > 0, "Conv2d needs at least one output channel, a kernel and a stride");
    template <class In, class T = float>
    using op = detail::ConvOp<Out, detail::Conv2dGeometry<In, Out, K, Stride, Pad>, B, T>;
};

template <std::size_t Out, std::size_t K, std::size_t Stride = 1, std::size_t Pad = 0, Bias B = Bias::yes>
struct Conv1d {
    static_assert(Out > 0 && K > 0 && Stride > 0, "Conv1d needs at least one output channel, a kernel and a stride");
    template <class In, class T = float>
    using op = detail::ConvOp<Out, detail::Conv1dGeometry<In, Out, K, Stride, Pad>, B, T>;
};

template <std::size_t Out, std::size_t K, std::size_t Stride = 1, std::size_t Pad = 0, Bias B = Bias::yes>
struct ConvTranspose2d {
    static_assert(Out > 0 && K > 0 && Stride > 0,
                  "ConvTranspose2d needs at least one output channel, a kernel and a stride");

    template <class In, class T = float>
    struct op : LeafOp {
        static_assert(In::rank == 3, "ConvTranspose2d needs a (channels, height, width) input");
        static constexpr std::size_t C = In::dims[0], H = In::dims[1], W = In::dims[2];
        static_assert((H - 1) * Stride + K > 2 * Pad && (W - 1) * Stride + K > 2 * Pad,
                      "ConvTranspose2d padding removes the whole output: use less padding or a larger kernel");
        static constexpr std::size_t OH = (H - 1) * Stride + K - 2 * Pad, OW = (W - 1) * Stride + K - 2 * Pad;
        using input_shape = In;
        using output_shape = Shape<Out, OH, OW>;
        static constexpr std::size_t weight_count = C * Out * K * K;
        static constexpr std::size_t bias_count = B == Bias::yes ? Out : 0;
        static constexpr std::size_t param_count = weight_count + bias_count;
        static constexpr std::array param_blocks{core::ParamBlock{weight_count, core::ParamKind::weight},
                                                 core::ParamBlock{bias_count, core::ParamKind::bias}};
        // The convolution whose adjoint this is: from the output (Out, OH, OW) to the input (C, H, W).
        static constexpr Window window{int(Out), int(OH), int(OW), int(K), int(K), int(Stride), int(Stride),
                                       int(Pad), int(Pad), int(H), int(W)};
        static constexpr bool wants_channels_last = true;   // it runs on cuDNN in either layout, never detours

        using LeafOp::LeafOp;
        void init(float* p, std::uint64_t seed) const
        {
            detail::conv_init(p, seed, id, weight_count, bias_count, Out * K * K);
        }
        template <class Ctx>
        std::size_t scratch_size(const Ctx& ctx, std::size_t n) const
        {
            return conv_transpose_scratch_size<window, T>(ctx, C, n);
        }
        template <class Ctx>
        void forward(Ctx& ctx, const Pass&, const ForwardArgs<T>& a) const
        {
            conv_transpose_forward<window>(ctx, C, a.weights, detail::bias_of<B>(a.params, weight_count), a.x, a.y, a.n,
                                           a.scratch);
        }
        template <class Ctx>
        void backward(Ctx& ctx, const Pass&, const BackwardArgs<T>& a) const
        {
            conv_transpose_backward<window>(ctx, C, a.weights, a.x, a.dy, a.dx, a.dparams,
                                            detail::bias_of<B>(a.dparams, weight_count), a.n, a.scratch);
        }
    };
};

} // namespace replica::layers

namespace REPLICA_NAMESPACE {
using layers::Bias;
using layers::Conv1d;
using layers::Conv2d;
using layers::ConvTranspose2d;
} // namespace replica
