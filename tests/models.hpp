#pragma once
// Small models for the tests: the same kinds of network as the standard ones, sized for a CI machine.

#include <algorithm>
#include <cmath>
#include <vector>

#include "replica/replica.hpp"

namespace replica::testing {

// AlexNet-like: convolutional features, then a classifier with dropout.
using SmallFeatures = Sequential<Input<3, 32, 32>, Conv2d<8, 5, 1, 2>, ReLU, MaxPool2d<2>,
                                 Conv2d<16, 3, 1, 1>, ReLU, MaxPool2d<2>>;                 // -> 16x8x8
using SmallClassifier = Sequential<Input<16, 8, 8>, Flatten, Dropout<0.5>, Linear<32>, ReLU, Linear<10>>;
// Only the features replicated, as DIGITS' AlexNet; and the same network without the nesting.
template <class Dispatch>
using SmallAlexNet = Sequential<Input<3, 32, 32>, DataParallel<SmallFeatures, Dispatch>, SmallClassifier>;
using SmallAlexNetPlain = Sequential<Input<3, 32, 32>, SmallFeatures, SmallClassifier>;
// Features whose gradient is two buckets: conv 224 | linear 320400 (the first bucket closes at 256 Ki),
// nested and plain.
using WideFeatures = Sequential<Input<3, 12, 12>, Conv2d<8, 3>, ReLU, Flatten, Linear<400>, ReLU>;
template <class Dispatch>
using WideNested = Sequential<Input<3, 12, 12>, DataParallel<WideFeatures, Dispatch>, Linear<10>>;
using WidePlain = Sequential<Input<3, 12, 12>, WideFeatures, Linear<10>>;

// Inception-like block and dropout.
using ConcatDropoutNet = Sequential<Input<3, 12, 12>, Conv2d<8, 3, 1, 1>, ReLU,
                                    Concat<Sequential<Conv2d<4, 1>, ReLU>,
                                           Sequential<Conv2d<4, 1>, ReLU, Conv2d<6, 3, 1, 1>, ReLU>,
                                           Sequential<MaxPool2d<3, 1, 1>, Conv2d<4, 1>, ReLU>>,
                                    MaxPool2dCeil<3, 2>, Flatten, Dropout<0.3>, Linear<10>>;

// The FCN's layers (two convolutions, a deconvolution, per-pixel loss) on 32x32 images, 5 classes.
using SmallFCN = Sequential<Input<3, 32, 32>, Conv2d<32, 3, 1, 1>, ReLU, Conv2d<64, 3, 2, 1>, ReLU,
                            ConvTranspose2d<5, 4, 2, 1>>;

// BatchNorm and residual blocks: a stem, a block, a downsampling block with a projection shortcut,
// a pooled classifier; and a one-convolution network with each kind of BatchNorm statistics.
using SmallBlock = Residual<Sequential<Conv2d<4, 3, 1, 1>, BatchNorm2d, ReLU, Conv2d<4, 3, 1, 1>, BatchNorm2d>>;
using SmallDown = Residual<Sequential<Conv2d<6, 3, 2, 1>, BatchNorm2d, ReLU, Conv2d<6, 3, 1, 1>, BatchNorm2d>,
                      Sequential<Conv2d<6, 1, 2, 0>, BatchNorm2d>>;
using SmallResNet = Sequential<Input<2, 8, 8>, Conv2d<4, 3, 1, 1>, BatchNorm2d, ReLU, SmallBlock, ReLU, SmallDown, ReLU,
                               GlobalAvgPool, Linear<5>>;
using SmallResNetPerReplica = Sequential<Input<2, 8, 8>, Conv2d<4, 3, 1, 1>, BatchNorm<2, BatchStats::per_replica>, ReLU,
                                         GlobalAvgPool, Linear<5>>;
using SmallResNetGlobal = Sequential<Input<2, 8, 8>, Conv2d<4, 3, 1, 1>, BatchNorm2d, ReLU, GlobalAvgPool, Linear<5>>;
// BatchNorm inside a nested DataParallel: the features (convolutions with BatchNorm over the nested
// batch) replicated, a pooled classifier on the model's device; and the same without the nesting.
using BatchNormFeatures = Sequential<Input<2, 8, 8>, Conv2d<4, 3, 1, 1>, BatchNorm2d, ReLU, Conv2d<6, 3, 2, 1>, BatchNorm2d, ReLU>;
using PooledClassifier = Sequential<Input<6, 4, 4>, GlobalAvgPool, Linear<5>>;
template <class Dispatch>
using BatchNormNested = Sequential<Input<2, 8, 8>, DataParallel<BatchNormFeatures, Dispatch>, PooledClassifier>;
using BatchNormNestedPlain = Sequential<Input<2, 8, 8>, BatchNormFeatures, PooledClassifier>;
// BatchNorm inside Concat branches (Inception with batch normalisation).
using ConcatBatchNormNet =
    Sequential<Input<2, 8, 8>, Conv2d<6, 3, 1, 1>, BatchNorm2d, ReLU,
               Concat<Sequential<Conv2d<4, 1, 1, 0, Bias::none>, BatchNorm2d, ReLU>, Sequential<Conv2d<3, 1>, ReLU>,
                      Sequential<MaxPool2d<3, 1, 1>, Conv2d<2, 1, 1, 0, Bias::none>, BatchNorm2d>>,
               GlobalAvgPool, Linear<5>>;

// BatchNorm with options O everywhere: a stem, a residual block whose body ends in BatchNorm (the
// addend and the ReLU after the sum in BatchNorm's pass), a pooled classifier.
template <BatchNormOptions O>
using BatchNormOptionsNet =
    Sequential<Input<2, 8, 8>, Conv2d<4, 3, 1, 1>, BatchNorm2dWith<O>, ReLU,
               Residual<Sequential<Conv2d<4, 3, 1, 1>, BatchNorm2dWith<O>, ReLU, Conv2d<4, 3, 1, 1>, BatchNorm2dWith<O>>>,
               ReLU, GlobalAvgPool, Linear<5>>;
inline constexpr BatchNormOptions kNonAffine{.eps = 1e-3f, .momentum = 0.01f, .affine = false};
inline constexpr BatchNormOptions kCumulative{.cumulative = true};
inline constexpr BatchNormOptions kUntracked{.track_running_stats = false};

// Issue 43's layers: a (positions, features) input through a projection, LayerNorm, attention, GELU's
// tanh form and a per-position Linear, then a per-position head with a label per position.
using TinyTransformer = Sequential<Input<6, 8>, Linear<8>, LayerNorm<>, CausalSelfAttention<2>, GELUWith<GeluApprox::tanh>,
                                   Linear<4>, LayerNorm<LayerNormOptions{.eps = 1e-3f, .affine = false}>, Linear<3>,
                                   SequenceCrossEntropy>;

// A small GPT: token ids in, embeddings of tokens and positions, a pre-norm attention block and MLP
// block, a final LayerNorm and a per-position head over the vocabulary that shares the token table.
using TinyGpt = models::GPT<1, 4, 32, 16, 64>;   // its head tied to the token embedding

// Models to cut into pipeline stages, six layers each: an MLP with dropout (keyed on the global
// sample: the same on any cut), and an untied GPT of two blocks (token ids in, a label per position).
using PipeMlp = Sequential<Input<12>, Linear<16>, ReLU, Dropout<0.2>, Linear<16>, GELU, Linear<5>>;
using PipeGpt = Sequential<Input<Tokens<8>>, Embedding<32, 16>, PositionEmbedding<8>, TransformerBlock<2, 16>,
                           TransformerBlock<2, 16>, LayerNorm<>, Linear<32>, SequenceCrossEntropy>;

// An MLP whose first two Linears pair around an activation (TensorParallel splits them), then a whole
// GELU and head.
using SplitMlp = Sequential<Input<12>, Linear<16>, ReLU, Linear<16>, GELU, Linear<5>>;

// Deterministic token ids of model M and next-token labels: label t is id t + 1 (the last a fresh draw).
template <class M>
struct TokenBatches {
    std::vector<std::int32_t> inputs, labels;
    std::size_t size;

    TokenBatches(std::size_t n, std::uint64_t seed) : size(n)
    {
        constexpr std::size_t T = M::input_shape::size;
        inputs.resize(n * T);
        labels.resize(n * T);
        for (std::size_t s = 0; s < n; ++s)
            for (std::size_t t = 0; t <= T; ++t) {
                const auto id = std::int32_t(core::random_bits(seed, core::Stream::synthetic, 2, s * (T + 1) + t, 0) % M::vocabulary);
                if (t < T) inputs[s * T + t] = id;
                if (t > 0) labels[s * T + t - 1] = id;
            }
    }
    TokenBatch batch(std::size_t begin, std::size_t n, std::uint64_t first_sample, std::uint64_t seed = 7) const
    {
        constexpr std::size_t T = M::input_shape::size;
        return TokenBatch{inputs.data() + begin * T, labels.data() + begin * T, n, first_sample, seed};
    }
};

// Deterministic random inputs in [-1, 1) and labels for model M.
template <class M>
struct RandomBatches {
    std::vector<float> inputs;
    std::vector<std::int32_t> labels;
    std::size_t size;

    RandomBatches(std::size_t n, std::uint64_t seed) : size(n)
    {
        inputs.resize(n * M::input_shape::size);
        labels.resize(n * M::label_size);
        for (std::size_t i = 0; i < inputs.size(); ++i)
            inputs[i] = 2.0f * core::random_uniform(seed, core::Stream::synthetic, 0, i / 4096, std::uint32_t(i % 4096)) - 1.0f;
        const std::uint32_t classes = std::uint32_t(M::loss::template classes<typename M::output_shape>);
        for (std::size_t i = 0; i < labels.size(); ++i)
            labels[i] = std::int32_t(core::random_bits(seed, core::Stream::synthetic, 1, i, 0) % classes);
    }
    // Samples [begin, begin + n) as a batch whose global indices start at first_sample.
    Batch batch(std::size_t begin, std::size_t n, std::uint64_t first_sample, std::uint64_t seed = 7) const
    {
        return Batch{inputs.data() + begin * M::input_shape::size, labels.data() + begin * M::label_size, n,
                     first_sample, seed};
    }
};

inline std::vector<Device> cpus(std::size_t n)
{
    std::vector<Device> d;
    for (std::size_t i = 0; i < n; ++i) d.push_back(Device::cpu(int(i)));
    return d;
}

// Convolutions followed by ReLUs (a Chain fuses each pair), and the same layers kept apart by an
// identity (a Dropout of 0), for tests that the fusion changes no bit.
using FusedConvNet = Sequential<Input<2, 9, 9>, Conv2d<4, 3, 1, 1>, ReLU, Conv2d<3, 3, 2>, ReLU, Flatten, Linear<5>>;
using UnfusedConvNet =
    Sequential<Input<2, 9, 9>, Conv2d<4, 3, 1, 1>, Dropout<0.0>, ReLU, Conv2d<3, 3, 2>, Dropout<0.0>, ReLU, Flatten, Linear<5>>;
// The same for fully connected layers.
using FusedMlpNet = Sequential<Input<2, 9, 9>, Flatten, Linear<12>, ReLU, Linear<7>, ReLU, Linear<5>>;
using UnfusedMlpNet = Sequential<Input<2, 9, 9>, Flatten, Linear<12>, Dropout<0.0>, ReLU, Linear<7>, Dropout<0.0>, ReLU, Linear<5>>;
// Fully connected layers followed by GELU's tanh form (a Chain applies each GELU in the layer's
// forward pass), and the same kept apart.
using GeluMlpNet = Sequential<Input<2, 9, 9>, Flatten, Linear<16>, GELUWith<GeluApprox::tanh>, Linear<8>,
                              GELUWith<GeluApprox::tanh>, Linear<5>>;
using GeluMlpApart = Sequential<Input<2, 9, 9>, Flatten, Linear<16>, Dropout<0.0>, GELUWith<GeluApprox::tanh>, Linear<8>,
                                Dropout<0.0>, GELUWith<GeluApprox::tanh>, Linear<5>>;
// Residuals whose bodies end in a fully connected layer or attention (each adds the other branch in
// its product; the first Residual's ReLU after it too), and the same with each body's last layer kept
// apart by an identity.
using ResidualMlpNet = Sequential<Input<2, 9, 9>, Flatten, Linear<16>,
                                  Residual<Sequential<LayerNorm<>, Linear<32>, GELUWith<GeluApprox::tanh>, Linear<16>>>, ReLU,
                                  Residual<Sequential<LayerNorm<>, Linear<16>>>, Linear<5>>;
using ResidualMlpApart =
    Sequential<Input<2, 9, 9>, Flatten, Linear<16>,
               Residual<Sequential<LayerNorm<>, Linear<32>, GELUWith<GeluApprox::tanh>, Linear<16>, Dropout<0.0>>>, ReLU,
               Residual<Sequential<LayerNorm<>, Linear<16>, Dropout<0.0>>>, Linear<5>>;
using ResidualAttentionNet = Sequential<Input<Tokens<8>>, Embedding<32, 16>, PositionEmbedding<8>,
                                        Residual<Sequential<LayerNorm<>, CausalSelfAttention<2>>>, LayerNorm<>, Linear<32>,
                                        SequenceCrossEntropy>;
using ResidualAttentionApart = Sequential<Input<Tokens<8>>, Embedding<32, 16>, PositionEmbedding<8>,
                                          Residual<Sequential<LayerNorm<>, CausalSelfAttention<2>, Dropout<0.0>>>, LayerNorm<>,
                                          Linear<32>, SequenceCrossEntropy>;
// The same for nested models (ResNet's Sequential<Conv2d, BatchNorm2d>, then ReLU): a stem, a block
// whose body fuses inside, and a model two levels deep ending in a convolution.
template <std::size_t C, std::size_t Stride = 1>
using NestedConvBN = Sequential<Conv2d<C, 3, Stride, 1, Bias::none>, BatchNorm2d>;
using FusedNestedNet = Sequential<Input<2, 8, 8>, NestedConvBN<4>, ReLU, Residual<Sequential<NestedConvBN<4>, ReLU, NestedConvBN<4>>>,
                                  ReLU, Sequential<Sequential<Conv2d<3, 3, 2, 1>>>, ReLU, GlobalAvgPool, Linear<5>>;
using UnfusedNestedNet =
    Sequential<Input<2, 8, 8>, NestedConvBN<4>, Dropout<0.0>, ReLU,
               Residual<Sequential<NestedConvBN<4>, Dropout<0.0>, ReLU, NestedConvBN<4>>>, ReLU,
               Sequential<Sequential<Conv2d<3, 3, 2, 1>>>, Dropout<0.0>, ReLU, GlobalAvgPool, Linear<5>>;

// The reproducible mode as the tests run it, and its standard run: 5 SGD steps of 20 samples from
// `seed` (micro-shards of 8, 8 and 4: uneven over every replica count); or 5 steps of another
// optimizer, `opt` as it is before the first.
inline constexpr StepOptions kReproducible{.reproducible = true, .micro_shard = 8};
inline SGD five_steps_sgd() { return SGD{{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f}}; }
template <class Model, class Data, class Opt = SGD>
std::vector<float> five_steps(Model& model, const Data& data, std::uint64_t seed, StepOptions options = kReproducible,
                              Opt opt = five_steps_sgd())
{
    for (std::size_t s = 0; s < 5; ++s) train_step(model, opt, data.batch(s * 20, 20, s * 20, seed), options);
    return parameters(model);
}

// The parameters whose gradient is zero in exact arithmetic (attention's key biases: a constant added
// to every key of a query changes no softmax): float noise there, which Adam scales up to steps of
// the learning rate in any summation order. True for those whose gradient on a batch is below 1e-7 of
// the largest.
template <class M, class Data>
std::vector<bool> zero_gradient(const Data& data, Device device = Device::cpu())
{
    M m{device, 5};
    const auto b = data.batch(0, 10, 0);
    m.forward_backward({.seed = b.seed, .first_sample = 0}, b.inputs, b.labels, b.size, 0.1f);
    const std::vector<float> g = m.gradients();
    float largest = 0.0f;
    for (float v : g) largest = std::max(largest, std::abs(v));
    std::vector<bool> zero(g.size());
    for (std::size_t i = 0; i < g.size(); ++i) zero[i] = std::abs(g[i]) < 1e-7f * largest;
    return zero;
}
inline std::vector<float> without(const std::vector<float>& v, const std::vector<bool>& drop)
{
    std::vector<float> kept;
    for (std::size_t i = 0; i < v.size(); ++i)
        if (!drop[i]) kept.push_back(v[i]);
    return kept;
}

// Largest |a - b| / (|a| + |b| + floor) over elements: a relative error that stays meaningful near 0.
inline double max_relative_difference(const std::vector<float>& a, const std::vector<float>& b, double floor = 1e-3)
{
    double worst = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i)
        worst = std::max(worst, std::abs(double(a[i]) - double(b[i])) / (std::abs(double(a[i])) + std::abs(double(b[i])) + floor));
    return worst;
}

} // namespace replica::testing
