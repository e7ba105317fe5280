#pragma once
// Pooling.
//   MaxPool1d<K, Stride = K>                               (c, l)    -> (c, (l - K) / Stride + 1)
//   MaxPool2d<K, Stride = K, Pad = 0, Round = floor>       (c, h, w) -> (c, oh, ow)
//     Rounding::ceil keeps a last partial window (as Caffe and GoogLeNet do), provided it starts
//     inside the input; MaxPool2dCeil<K, Stride> spells it.
//   AvgPool2d<K, Stride = K, Pad = 0>                      averages K*K taps, padding counted as zeros
//   GlobalAvgPool                                          (c, h, w) -> (c)

#include <cstddef>
#include <type_traits>

#include "replica/core/config.hpp"
#include "replica/core/window.hpp"
#include "replica/layers/op.hpp"

namespace REPLICA_NAMESPACE::layers {

enum class Rounding { floor, ceil };

namespace detail {
constexpr std::size_t pooled(std::size_t in, std::size_t k, std::size_t s, std::size_t p, Rounding r)
{
    const std::size_t span = in + 2 * p - k;
    std::size_t out = (r == Rounding::ceil ? (span + s - 1) / s : span / s) + 1;
    if (r == Rounding::ceil && (out - 1) * s >= in + p) --out;   // the last window must start inside
    return out;
}

enum class PoolKind { max, average };

// What pooling saves for backward, one per output: max pooling the positions of its maxima, average
// pooling nothing (void).
template <PoolKind Kind, core::Window G>
struct SavedPosition {
    using type = core::pool_position_t<G>;
};
template <core::Window G>
struct SavedPosition<PoolKind::average, G> {
    using type = void;
};

// Floats a sample that hold Outputs values of P (none for void), rounded up.
template <class P, std::size_t Outputs>
constexpr std::size_t saved_floats()
{
    if constexpr (std::is_void_v<P>) return 0;
    else return (Outputs * sizeof(P) + sizeof(float) - 1) / sizeof(float);
}

// Max pooling keeps, per output, the position of its maximum within its window (saved state:
// core::pool_position_t<G>, a byte for windows of up to 255 elements), so backward routes gradients
// without searching again. The n samples' saved floats are one contiguous region (model/parts.hpp),
// read as one array of n * Out::size positions, sample after sample; saved_size rounds a sample's
// positions up to whole floats, so the array fits in the n * saved_size floats.
template <PoolKind Kind, class In, class Out, core::Window G, class T>
struct PoolOp : LeafOp {
    using input_shape = In;
    using output_shape = Out;
    static constexpr std::size_t param_count = 0;
    using position = typename SavedPosition<Kind, G>::type;
    static constexpr std::size_t saved_size = saved_floats<position, Out::size>();
    using LeafOp::LeafOp;
    void init(float*, std::uint64_t) const {}
    template <class Ctx>
    void forward(Ctx& ctx, const Pass&, const ForwardArgs<T>& a) const
    {
        if constexpr (Kind == PoolKind::max)
            max_pool_forward<G>(ctx, a.x, a.y, reinterpret_cast<position*>(a.saved), a.n);
        else avg_pool_forward<G>(ctx, a.x, a.y, a.n);
    }
    template <class Ctx>
    void backward(Ctx& ctx, const Pass&, const BackwardArgs<T>& a) const
    {
        if (!a.dx) return;
        if constexpr (Kind == PoolKind::max)
            max_pool_backward<G>(ctx, reinterpret_cast<const position*>(a.saved), a.dy, a.dx, a.n);
        else avg_pool_backward<G>(ctx, a.dy, a.dx, a.n);
    }
};

template <PoolKind Kind, std::size_t K, std::size_t S, std::size_t P, Rounding R, class In, class T>
struct Pool2d {
    static_assert(In::rank == 3, "2-D pooling needs a (channels, height, width) input");
    static constexpr std::size_t C = In::dims[0], H = In::dims[1], W = In::dims[2];
    static_assert(K <= H + 2 * P && K <= W + 2 * P,
                  "pooling window is larger than its input: use a smaller window or fewer layers before it");
    static_assert(2 * P <= K, "pooling padding must be at most half the window");
    static constexpr std::size_t OH = pooled(H, K, S, P, R), OW = pooled(W, K, S, P, R);
    using type = PoolOp<Kind, In, Shape<C, OH, OW>,
                        core::Window{int(C), int(H), int(W), int(K), int(K), int(S), int(S), int(P), int(P),
                                     int(OH), int(OW)},
                        T>;
};
} // namespace detail

template <std::size_t K, std::size_t Stride = K, std::size_t Pad = 0, Rounding Round = Rounding::floor>
struct MaxPool2d {
    static_assert(K > 0 && Stride > 0, "MaxPool2d needs a window and a stride");
    template <class In, class T = float>
    struct op : detail::Pool2d<detail::PoolKind::max, K, Stride, Pad, Round, In, T>::type {
        using detail::Pool2d<detail::PoolKind::max, K, Stride, Pad, Round, In, T>::type::type;
    };
};

template <std::size_t K, std::size_t Stride = K, std::size_t Pad = 0>
using MaxPool2dCeil = MaxPool2d<K, Stride, Pad, Rounding::ceil>;

template <std::size_t K, std::size_t Stride = K, std::size_t Pad = 0>
struct AvgPool2d {
    static_assert(K > 0 && Stride > 0, "AvgPool2d needs a window and a stride");
    template <class In, class T = float>
    struct op : detail::Pool2d<detail::PoolKind::average, K, Stride, Pad, Rounding::floor, In, T>::type {
        using detail::Pool2d<detail::PoolKind::average, K, Stride, Pad, Rounding::floor, In, T>::type::type;
    };
};

template <std::size_t K, std::size_t Stride = K>
struct MaxPool1d {
    static_assert(K > 0 && Stride > 0, "MaxPool1d needs a window and a stride");
    template <class In, class T = float>
    struct op : detail::PoolOp<detail::PoolKind::max, In,
                               Shape<In::dims[0], (In::dims[In::rank - 1] - K) / Stride + 1>,
                               core::Window{int(In::dims[0]), 1, int(In::dims[In::rank - 1]), 1, int(K), 1,
                                            int(Stride), 0, 0, 1, int((In::dims[In::rank - 1] - K) / Stride + 1)},
                               T> {
        static_assert(In::rank == 2, "MaxPool1d needs a (channels, length) input; use MaxPool2d for images");
        static_assert(K <= In::dims[In::rank - 1],
                      "MaxPool1d window is longer than its input: use a smaller window or fewer layers before it");
        using op::PoolOp::PoolOp;
    };
};

struct GlobalAvgPool {
    template <class In, class T = float>
    struct op : detail::PoolOp<detail::PoolKind::average, In, Shape<In::dims[0]>,
                               core::Window{int(In::dims[0]), int(In::dims[1 % In::rank]), int(In::dims[2 % In::rank]),
                                            int(In::dims[1 % In::rank]), int(In::dims[2 % In::rank]), 1, 1, 0, 0, 1, 1},
                               T> {
        static_assert(In::rank == 3, "GlobalAvgPool needs a (channels, height, width) input");
        using op::PoolOp::PoolOp;
    };
};

} // namespace replica::layers

namespace REPLICA_NAMESPACE {
using layers::AvgPool2d;
using layers::GlobalAvgPool;
using layers::MaxPool1d;
using layers::MaxPool2d;
using layers::MaxPool2dCeil;
using layers::Rounding;
} // namespace replica
