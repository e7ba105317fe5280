#pragma once
// Mapping<L>: how layer L is written as ONNX operators, one specialisation per layer.
//
// A mapping offers
//   template <class In>
//   static std::string emit(Graph& g, const std::string& x, const Slice& s);
// which adds to g the nodes computing L's output in inference form (Dropout off, BatchNorm on its
// running estimates) from tensor x, of shape (N, In dims...) (int32 token ids for the first layer of a
// token model), and returns the name of the output, (N, output_shape dims...). s holds the layer's
// parameters (param_count floats, laid out as the op lays them out) and its statistics
// (statistics_count floats), host memory, and the whole model's parameters (s.model_params), for a
// layer that reads another's. A layer with no mapping stops the compilation at Mapping<ThatLayer>;
// specialise Mapping for it (in namespace replica::onnx) to export it. Composites (Sequential, Concat,
// Residual, a nested DataParallel) are in onnx/export.hpp.
//
// What maps to what (opset 17):
//   Conv1d, Conv2d            Conv (weights (Out, C, K[, K]); bias when Bias::yes)
//   ConvTranspose2d           ConvTranspose (weights (C, Out, K, K))
//   Linear                    Gemm (transB = 1); over a sequence (positions, features) MatMul with
//                             the weight transposed, then Add of the bias
//   Embedding<V, D>           Gather (axis 0) of the int32 ids (N, T) in the (V, D) table
//   PositionEmbedding<C>      Add of the table's first T rows, (T, D), broadcast over N
//   TiedHead<E>               MatMul with Transpose of E's table: the Gather's initializer, one copy
//   LayerNorm<Options>        LayerNormalization (axis -1, the layer's epsilon; without affine, scale
//                             ones and bias zeros)
//   CausalSelfAttention<H>    MatMul (Wqkv transposed), Add, Split in q, k, v; Reshape (N, T, H, D / H)
//                             and Transpose to (N, H, T, D / H); MatMul q k^T, Mul by 1 / sqrt(D / H),
//                             Add of a (T, T) causal mask (-inf above the diagonal), Softmax (axis -1),
//                             MatMul with v; Transpose, Reshape (N, T, D); MatMul (Wo transposed), Add
//   BatchNorm1d, BatchNorm2d  BatchNormalization (running mean and variance, the layer's epsilon; without
//                             affine, scale ones and B zeros); without track_running_stats the batch's
//                             statistics: ReduceMean, Sub, Mul, Add, Sqrt, Div
//   MaxPool1d, MaxPool2d      MaxPool; Rounding::ceil as explicit end padding (no ceil_mode)
//   AvgPool2d                 AveragePool (count_include_pad = 1)
//   GlobalAvgPool             GlobalAveragePool, Flatten
//   ReLU, Sigmoid, Tanh       Relu, Sigmoid, Tanh
//   GELU                      x * 0.5 * (1 + Erf(x / sqrt 2)) (opset 17 has no Gelu)
//   GELUWith<GeluApprox::tanh>  x * 0.5 * (1 + Tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))
//   Flatten                   Flatten (axis 1)
//   Dropout, Identity         nothing: the output is the input
// A model's loss (SoftmaxCrossEntropy, SequenceCrossEntropy) is not a layer: the graph's output is the
// logits.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "replica/core/config.hpp"
#include "replica/layers/activation.hpp"
#include "replica/layers/attention.hpp"
#include "replica/layers/conv.hpp"
#include "replica/layers/embedding.hpp"
#include "replica/layers/layer_norm.hpp"
#include "replica/layers/linear.hpp"
#include "replica/layers/normalization.hpp"
#include "replica/layers/op.hpp"
#include "replica/layers/pool.hpp"
#include "replica/layers/tied_head.hpp"
#include "replica/onnx/graph.hpp"

namespace REPLICA_NAMESPACE::onnx {

// A layer's parameters and statistics in the model's flat host copies, and the whole model's
// parameters (the outermost Sequential's, in its layout), for a mapping that reads another layer's: a
// head tied to the Embedding's table finds it at the start, Embedding being the first layer.
struct Slice {
    const float* params;
    const float* statistics;
    std::span<const float> model_params;

    // The slice of what follows `param_count` parameters and `statistics_count` statistics of this one.
    Slice after(std::size_t param_count, std::size_t statistics_count) const
    {
        return {params + param_count, statistics + statistics_count, model_params};
    }
};

namespace detail {
template <class L>
inline constexpr bool unmapped = false;   // false, but only once L is known
} // namespace detail

template <class L>
struct Mapping {
    static_assert(detail::unmapped<L>,
                  "this layer has no ONNX mapping (the type is the L of Mapping<L> above): specialise "
                  "replica::onnx::Mapping<L> with a static emit<In>(Graph&, x, Slice) that writes its "
                  "operators (onnx/layers.hpp shows how), or export a model without it");
};

// Layer L on input shape In: the nodes of its mapping.
template <class L, class In>
std::string emit(Graph& g, const std::string& x, const Slice& s)
{
    return Mapping<L>::template emit<In>(g, x, s);
}

namespace detail {
inline std::int64_t i64(std::size_t v) { return std::int64_t(v); }

// kernel_shape, strides and pads (both ends) of a square window over `rank` spatial dimensions.
inline std::vector<Attribute> window(std::size_t rank, std::size_t k, std::size_t stride, std::size_t pad)
{
    return {ints("kernel_shape", std::vector<std::int64_t>(rank, i64(k))),
            ints("strides", std::vector<std::int64_t>(rank, i64(stride))),
            ints("pads", std::vector<std::int64_t>(2 * rank, i64(pad)))};
}

// A convolution node `op` (Conv, ConvTranspose) on x: the weights (weight_dims, first in params),
// then with Bias::yes the bias (`out` floats after the weights).
template <layers::Bias B>
std::string convolution(Graph& g, const std::string& op, const std::string& x, const std::vector<std::int64_t>& weight_dims,
                        std::size_t out, const float* params, const std::vector<Attribute>& attributes)
{
    std::size_t weights = 1;
    for (std::int64_t d : weight_dims) weights *= std::size_t(d);
    const std::string w = g.initializer(op + "_weight", weight_dims, params);
    if constexpr (B == layers::Bias::yes)
        return g.node(op, {x, w, g.initializer(op + "_bias", {i64(out)}, params + weights)}, attributes);
    else return g.node(op, {x, w}, attributes);
}

// x (N, ..., in) @ W^T + b, W (out, in) at weight, b (out) at bias: MatMul with W transposed (an
// initializer (in, out)), broadcast over the leading axes, then Add.
inline std::string matmul_add(Graph& g, const std::string& x, const float* weight, const float* bias, std::size_t in,
                              std::size_t out)
{
    std::vector<float> wt(in * out);
    for (std::size_t o = 0; o < out; ++o)
        for (std::size_t i = 0; i < in; ++i) wt[i * out + o] = weight[o * in + i];
    const std::string w = g.initializer("linear_weight", {i64(in), i64(out)}, wt.data());
    return g.node("Add", {g.node("MatMul", {x, w}), g.initializer("linear_bias", {i64(out)}, bias)});
}
} // namespace detail

namespace detail {
// Conv1d (Rank 1) and Conv2d (Rank 2): weights (Out, C, K[, K]).
template <std::size_t Rank, std::size_t Out, std::size_t K, std::size_t Stride, std::size_t Pad, layers::Bias B>
struct ConvMapping {
    template <class In>
    static std::string emit(Graph& g, const std::string& x, const Slice& s)
    {
        std::vector<std::int64_t> dims{i64(Out), i64(In::dims[0])};
        dims.resize(2 + Rank, i64(K));
        return convolution<B>(g, "Conv", x, dims, Out, s.params, window(Rank, K, Stride, Pad));
    }
};
} // namespace detail

template <std::size_t Out, std::size_t K, std::size_t Stride, std::size_t Pad, layers::Bias B>
struct Mapping<layers::Conv2d<Out, K, Stride, Pad, B>> : detail::ConvMapping<2, Out, K, Stride, Pad, B> {};
template <std::size_t Out, std::size_t K, std::size_t Stride, std::size_t Pad, layers::Bias B>
struct Mapping<layers::Conv1d<Out, K, Stride, Pad, B>> : detail::ConvMapping<1, Out, K, Stride, Pad, B> {};

template <std::size_t Out, std::size_t K, std::size_t Stride, std::size_t Pad, layers::Bias B>
struct Mapping<layers::ConvTranspose2d<Out, K, Stride, Pad, B>> {
    template <class In>
    static std::string emit(Graph& g, const std::string& x, const Slice& s)
    {
        using detail::i64;
        return detail::convolution<B>(g, "ConvTranspose", x, {i64(In::dims[0]), i64(Out), i64(K), i64(K)}, Out,
                                      s.params, detail::window(2, K, Stride, Pad));
    }
};

template <std::size_t Out>
struct Mapping<layers::Linear<Out>> {
    template <class In>
    static std::string emit(Graph& g, const std::string& x, const Slice& s)
    {
        using O = typename layers::Linear<Out>::template op<In>;
        using detail::i64;
        constexpr std::size_t F = O::N;
        if constexpr (In::rank == 1) {
            const std::string w = g.initializer("linear_weight", {i64(Out), i64(F)}, s.params);   // (Out, in)
            const std::string b = g.initializer("linear_bias", {i64(Out)}, s.params + O::weight_count);
            return g.node("Gemm", {x, w, b}, {integer("transB", 1)});
        } else {   // (N, positions, in) @ (in, Out): MatMul broadcasts over the positions, Gemm does not
            return detail::matmul_add(g, x, s.params, s.params + O::weight_count, F, Out);
        }
    }
};

// (N, T) ids -> (N, T, Dim): Gather on the table's rows.
template <std::size_t Vocab, std::size_t Dim, class Tag>
struct Mapping<layers::Embedding<Vocab, Dim, Tag>> {
    template <class In>
    static std::string emit(Graph& g, const std::string& ids, const Slice& s)
    {
        using detail::i64;
        const std::string table = g.shared_initializer("embedding_table", {i64(Vocab), i64(Dim)}, s.params);
        return g.node("Gather", {table, ids}, {integer("axis", 0)});
    }
};

// (N, T, Dim) -> (N, T, Vocab): MatMul with the embedding's own table initializer, transposed (one
// copy of the table in the file, as in the model). The Embedding is the outermost model's first layer,
// so its table is the first Vocab * Dim of the model's parameters.
template <class E>
struct Mapping<layers::TiedHead<E>> {
    template <class In>
    static std::string emit(Graph& g, const std::string& x, const Slice& s)
    {
        using detail::i64;
        const std::string table =
            g.shared_initializer("embedding_table", {i64(E::vocabulary), i64(E::dim)}, s.model_params.data());
        return g.node("MatMul", {x, g.node("Transpose", {table}, {ints("perm", {1, 0})})});
    }
};

// (N, T, D) + the table's first T rows, (T, D), broadcast over N.
template <std::size_t Context>
struct Mapping<layers::PositionEmbedding<Context>> {
    template <class In>
    static std::string emit(Graph& g, const std::string& x, const Slice& s)
    {
        using detail::i64;
        const std::string rows = g.initializer("position_embedding", {i64(In::dims[0]), i64(In::dims[1])}, s.params);
        return g.node("Add", {x, rows});
    }
};

template <layers::LayerNormOptions Options>
struct Mapping<layers::LayerNorm<Options>> {
    template <class In>
    static std::string emit(Graph& g, const std::string& x, const Slice& s)
    {
        constexpr std::size_t F = layers::LayerNorm<Options>::template op<In>::F;
        const std::vector<float> ones(F, 1.0f), zeros(F, 0.0f);   // without affine
        const std::int64_t f = detail::i64(F);
        const std::string scale = g.initializer("layer_norm_weight", {f}, Options.affine ? s.params : ones.data());
        const std::string bias = g.initializer("layer_norm_bias", {f}, Options.affine ? s.params + F : zeros.data());
        return g.node("LayerNormalization", {x, scale, bias}, {integer("axis", -1), real("epsilon", Options.eps)});
    }
};

// (N, T, D): qkv = x Wqkv^T + bqkv split in three; each of q, k, v (N, T, Heads, hd) with the heads
// brought forward, (N, Heads, T, hd) (k transposed: (N, Heads, hd, T)); Softmax(q k^T * 1/sqrt(hd) +
// mask) v, the mask (T, T) 0 where j <= i, -inf above the diagonal; the heads back side by side (N,
// T, D), then o Wo^T + bo.
template <std::size_t Heads>
struct Mapping<layers::CausalSelfAttention<Heads>> {
    template <class In>
    static std::string emit(Graph& g, const std::string& x, const Slice& s)
    {
        using O = typename layers::CausalSelfAttention<Heads>::template op<In>;
        using detail::i64;
        constexpr std::size_t T = O::L, D = O::D, hd = D / Heads;
        const std::string qkv = detail::matmul_add(g, x, s.params, s.params + O::qkv_weights, D, 3 * D);   // (N, T, 3D)
        const std::vector<std::string> parts = g.nodes("Split", {qkv}, {integer("axis", -1)}, 3);
        const std::string heads_shape = g.int64s("attention_heads_shape", {0, i64(T), i64(Heads), i64(hd)});
        const auto split_heads = [&](const std::string& t, std::vector<std::int64_t> perm) {
            return g.node("Transpose", {g.node("Reshape", {t, heads_shape})}, {ints("perm", std::move(perm))});
        };
        const std::string q = split_heads(parts[0], {0, 2, 1, 3});   // (N, Heads, T, hd)
        const std::string kt = split_heads(parts[1], {0, 2, 3, 1});  // (N, Heads, hd, T)
        const std::string v = split_heads(parts[2], {0, 2, 1, 3});   // (N, Heads, T, hd)
        std::vector<float> mask(T * T, 0.0f);
        for (std::size_t i = 0; i < T; ++i)
            for (std::size_t j = i + 1; j < T; ++j) mask[i * T + j] = -INFINITY;
        const std::string scores =
            g.node("Add", {g.node("Mul", {g.node("MatMul", {q, kt}), g.scalar("attention_scale", 1.0f / std::sqrt(float(hd)))}),
                           g.initializer("causal_mask", {i64(T), i64(T)}, mask.data())});   // (N, Heads, T, T)
        const std::string heads = g.node("MatMul", {g.node("Softmax", {scores}, {integer("axis", -1)}), v});
        const std::string o = g.node("Reshape", {g.node("Transpose", {heads}, {ints("perm", {0, 2, 1, 3})}),
                                                 g.int64s("attention_output_shape", {0, i64(T), i64(D)})});   // (N, T, D)
        return detail::matmul_add(g, o, s.params + O::qkv_count, s.params + O::qkv_count + O::out_weights, D, D);
    }
};

template <std::size_t Rank, layers::BatchStats Stats, layers::BatchNormOptions Options>
struct Mapping<layers::BatchNorm<Rank, Stats, Options>> {
    template <class In>
    static std::string emit(Graph& g, const std::string& x, const Slice& s)
    {
        constexpr std::size_t C = In::dims[0];
        const std::int64_t c = detail::i64(C);
        // Parameters: weight, bias (without affine: ones and zeros); statistics: running mean, running
        // variance.
        const std::vector<float> ones(C, 1.0f), zeros(C, 0.0f);
        const float* weight = Options.affine ? s.params : ones.data();
        const float* shift = Options.affine ? s.params + C : zeros.data();
        if constexpr (Options.track_running_stats) {
            const std::string scale = g.initializer("batch_norm_weight", {c}, weight);
            const std::string bias = g.initializer("batch_norm_bias", {c}, shift);
            const std::string mean = g.initializer("batch_norm_running_mean", {c}, s.statistics);
            const std::string var = g.initializer("batch_norm_running_var", {c}, s.statistics + C);
            return g.node("BatchNormalization", {x, scale, bias, mean, var}, {real("epsilon", Options.eps)});
        } else {
            // The batch's statistics in inference too: (x - mean) / sqrt(biased var + eps) * weight + bias,
            // over every axis but the channels', with weight and bias shaped (C, 1[, 1]) to broadcast.
            std::vector<std::int64_t> axes{0}, per_channel{c};
            for (std::size_t d = 1; d < In::rank; ++d) axes.push_back(std::int64_t(d + 1)), per_channel.push_back(1);
            const std::string scale = g.initializer("batch_norm_weight", per_channel, weight);
            const std::string bias = g.initializer("batch_norm_bias", per_channel, shift);
            const std::string mean = g.node("ReduceMean", {x}, {ints("axes", axes), integer("keepdims", 1)});
            const std::string centred = g.node("Sub", {x, mean});
            const std::string var =
                g.node("ReduceMean", {g.node("Mul", {centred, centred})}, {ints("axes", axes), integer("keepdims", 1)});
            const std::string std_dev = g.node("Sqrt", {g.node("Add", {var, g.scalar("batch_norm_eps", Options.eps)})});
            return g.node("Add", {g.node("Mul", {g.node("Div", {centred, std_dev}), scale}), bias});
        }
    }
};

namespace detail {
// The end padding that makes floor rounding give `out` windows: replica's Rounding::ceil keeps a
// last partial window that starts inside the input (PyTorch's rule); ONNX Runtimes have differed in
// how ceil_mode treats that window, explicit padding does not. Max pooling ignores padded taps.
constexpr std::size_t end_pad(std::size_t in, std::size_t k, std::size_t s, std::size_t p, std::size_t out)
{
    const std::size_t covered = (out - 1) * s + k;   // where the last window ends, padding at the start included
    return covered > in + 2 * p ? covered - in - p : p;
}
} // namespace detail

template <std::size_t K, std::size_t Stride, std::size_t Pad, layers::Rounding Round>
struct Mapping<layers::MaxPool2d<K, Stride, Pad, Round>> {
    template <class In>
    static std::string emit(Graph& g, const std::string& x, const Slice&)
    {
        using Out = typename layers::MaxPool2d<K, Stride, Pad, Round>::template op<In>::output_shape;
        using detail::i64;
        const std::size_t eh = detail::end_pad(In::dims[1], K, Stride, Pad, Out::dims[1]);
        const std::size_t ew = detail::end_pad(In::dims[2], K, Stride, Pad, Out::dims[2]);
        return g.node("MaxPool", {x},
                      {ints("kernel_shape", {i64(K), i64(K)}), ints("strides", {i64(Stride), i64(Stride)}),
                       ints("pads", {i64(Pad), i64(Pad), i64(eh), i64(ew)})});
    }
};

template <std::size_t K, std::size_t Stride>
struct Mapping<layers::MaxPool1d<K, Stride>> {
    template <class In>
    static std::string emit(Graph& g, const std::string& x, const Slice&)
    {
        return g.node("MaxPool", {x}, detail::window(1, K, Stride, 0));
    }
};

template <std::size_t K, std::size_t Stride, std::size_t Pad>
struct Mapping<layers::AvgPool2d<K, Stride, Pad>> {
    template <class In>
    static std::string emit(Graph& g, const std::string& x, const Slice&)
    {
        std::vector<Attribute> attributes = detail::window(2, K, Stride, Pad);
        attributes.push_back(integer("count_include_pad", 1));
        return g.node("AveragePool", {x}, attributes);
    }
};

template <>
struct Mapping<layers::GlobalAvgPool> {
    template <class In>
    static std::string emit(Graph& g, const std::string& x, const Slice&)
    {
        return g.node("Flatten", {g.node("GlobalAveragePool", {x})}, {integer("axis", 1)});   // (N, C, 1, 1) -> (N, C)
    }
};

template <>
struct Mapping<layers::ReLU> {
    template <class In>
    static std::string emit(Graph& g, const std::string& x, const Slice&) { return g.node("Relu", {x}); }
};
template <>
struct Mapping<layers::Sigmoid> {
    template <class In>
    static std::string emit(Graph& g, const std::string& x, const Slice&) { return g.node("Sigmoid", {x}); }
};
template <>
struct Mapping<layers::Tanh> {
    template <class In>
    static std::string emit(Graph& g, const std::string& x, const Slice&) { return g.node("Tanh", {x}); }
};
template <>
struct Mapping<layers::GELU> {
    template <class In>
    static std::string emit(Graph& g, const std::string& x, const Slice&)
    {
        const std::string phi = g.node("Add", {g.node("Erf", {g.node("Div", {x, g.scalar("sqrt2", std::sqrt(2.0f))})}),
                                               g.scalar("one", 1.0f)});
        return g.node("Mul", {g.node("Mul", {x, phi}), g.scalar("half", 0.5f)});
    }
};

template <>
struct Mapping<layers::GELUWith<layers::GeluApprox::tanh>> {
    template <class In>
    static std::string emit(Graph& g, const std::string& x, const Slice&)
    {
        const std::string cube = g.node("Mul", {g.node("Mul", {x, x}), x});
        const std::string inner = g.node("Add", {x, g.node("Mul", {cube, g.scalar("gelu_cubic", 0.044715f)})});
        const std::string t = g.node("Tanh", {g.node("Mul", {inner, g.scalar("sqrt_2_over_pi", 0.79788456080286536f)})});
        const std::string phi = g.node("Add", {t, g.scalar("one", 1.0f)});
        return g.node("Mul", {g.node("Mul", {x, phi}), g.scalar("half", 0.5f)});
    }
};

template <>
struct Mapping<layers::Flatten> {
    template <class In>
    static std::string emit(Graph& g, const std::string& x, const Slice&)
    {
        return g.node("Flatten", {x}, {integer("axis", 1)});
    }
};
template <>
struct Mapping<layers::Identity> {
    template <class In>
    static std::string emit(Graph&, const std::string& x, const Slice&) { return x; }
};
template <double P>
struct Mapping<layers::Dropout<P>> {
    template <class In>
    static std::string emit(Graph&, const std::string& x, const Slice&) { return x; }
};

} // namespace replica::onnx
