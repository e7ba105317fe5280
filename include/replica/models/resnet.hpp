#pragma once
// Residual networks (He et al., 2015), with BatchNorm after every convolution and convolutions
// without bias, as torchvision defines them.
//
//   ResNet18   3x224x224, 1000 classes, basic blocks [2, 2, 2, 2]   (11,689,512 parameters)
//   ResNet50   3x224x224, 1000 classes, bottlenecks [3, 4, 6, 3]    (25,557,032 parameters), v1.5:
//              the stride of a downsampling bottleneck is on its 3x3 convolution
//   ResNet20   1x28x28 (Fashion-MNIST), 10 classes: the CIFAR layout of the paper, 3 stages of 3 basic
//              blocks with 16, 32 and 64 channels; a stage that halves the size and widens the
//              channels takes a projection shortcut (1x1 convolution and BatchNorm)
// The building blocks are public: BasicBlock<C, Stride>, Bottleneck<Width, Stride> (4 * Width out).

#include <cstddef>

#include "replica/core/config.hpp"
#include "replica/layers/activation.hpp"
#include "replica/layers/conv.hpp"
#include "replica/layers/linear.hpp"
#include "replica/layers/normalization.hpp"
#include "replica/layers/pool.hpp"
#include "replica/model/residual.hpp"
#include "replica/model/sequential.hpp"
#include "replica/models/default_batch.hpp"

namespace REPLICA_NAMESPACE::models {

// A KxK convolution without bias ("same" padding) and the BatchNorm after it.
template <std::size_t C, std::size_t K, std::size_t Stride = 1>
using ConvBN = Sequential<Conv2d<C, K, Stride, K / 2, Bias::none>, BatchNorm2d>;

// The projection shortcut: a 1x1 convolution with the block's stride, and BatchNorm.
template <std::size_t C, std::size_t Stride>
using Projection = ConvBN<C, 1, Stride>;

// Two 3x3 convolutions; C channels out. Projected: the block changes the size or the channels.
template <std::size_t C, std::size_t Stride = 1, bool Projected = (Stride != 1)>
struct BasicBlockOf {
    using body = Sequential<ConvBN<C, 3, Stride>, ReLU, ConvBN<C, 3>>;
    using type = Sequential<Residual<body, Projection<C, Stride>>, ReLU>;
};
template <std::size_t C, std::size_t Stride>
struct BasicBlockOf<C, Stride, false> {
    using type = Sequential<Residual<Sequential<ConvBN<C, 3, Stride>, ReLU, ConvBN<C, 3>>>, ReLU>;
};
template <std::size_t C, std::size_t Stride = 1, bool Projected = (Stride != 1)>
using BasicBlock = typename BasicBlockOf<C, Stride, Projected>::type;

// 1x1 down to Width, 3x3 (with the stride), 1x1 up to 4 * Width.
template <std::size_t Width, std::size_t Stride = 1, bool Projected = true>
struct BottleneckOf {
    using body = Sequential<ConvBN<Width, 1>, ReLU, ConvBN<Width, 3, Stride>, ReLU, ConvBN<4 * Width, 1>>;
    using type = Sequential<Residual<body, Projection<4 * Width, Stride>>, ReLU>;
};
template <std::size_t Width, std::size_t Stride>
struct BottleneckOf<Width, Stride, false> {
    using type = Sequential<
        Residual<Sequential<ConvBN<Width, 1>, ReLU, ConvBN<Width, 3, Stride>, ReLU, ConvBN<4 * Width, 1>>>, ReLU>;
};
template <std::size_t Width, std::size_t Stride = 1, bool Projected = true>
using Bottleneck = typename BottleneckOf<Width, Stride, Projected>::type;

// The ImageNet stem: 7x7/2 convolution, BatchNorm, ReLU, 3x3/2 max pool: 3x224x224 -> 64x56x56.
using ImageNetStem = Sequential<ConvBN<64, 7, 2>, ReLU, MaxPool2d<3, 2, 1>>;

using ResNet18 = Sequential<Input<3, 224, 224>, ImageNetStem,
                            BasicBlock<64>, BasicBlock<64>,
                            BasicBlock<128, 2>, BasicBlock<128>,
                            BasicBlock<256, 2>, BasicBlock<256>,
                            BasicBlock<512, 2>, BasicBlock<512>,
                            GlobalAvgPool, Linear<1000>>;

using ResNet50 = Sequential<Input<3, 224, 224>, ImageNetStem,
                            Bottleneck<64>, Bottleneck<64, 1, false>, Bottleneck<64, 1, false>,
                            Bottleneck<128, 2>, Bottleneck<128, 1, false>, Bottleneck<128, 1, false>,
                            Bottleneck<128, 1, false>,
                            Bottleneck<256, 2>, Bottleneck<256, 1, false>, Bottleneck<256, 1, false>,
                            Bottleneck<256, 1, false>, Bottleneck<256, 1, false>, Bottleneck<256, 1, false>,
                            Bottleneck<512, 2>, Bottleneck<512, 1, false>, Bottleneck<512, 1, false>,
                            GlobalAvgPool, Linear<1000>>;

using ResNet20 = Sequential<Input<1, 28, 28>, ConvBN<16, 3>, ReLU,
                            BasicBlock<16>, BasicBlock<16>, BasicBlock<16>,
                            BasicBlock<32, 2>, BasicBlock<32>, BasicBlock<32>,
                            BasicBlock<64, 2>, BasicBlock<64>, BasicBlock<64>,
                            GlobalAvgPool, Linear<10>>;

static_assert(ResNet18::param_count == 11'689'512, "ResNet18 must have torchvision's 11,689,512 parameters");
static_assert(ResNet50::param_count == 25'557'032, "ResNet50 must have torchvision's 25,557,032 parameters");

template <>
inline constexpr std::size_t default_batch_size<ResNet18> = 256;
template <>
inline constexpr std::size_t default_batch_size<ResNet50> = 128;
template <>
inline constexpr std::size_t default_batch_size<ResNet20> = 128;

} // namespace replica::models

namespace REPLICA_NAMESPACE {
using models::BasicBlock;
using models::Bottleneck;
using models::ResNet18;
using models::ResNet20;
using models::ResNet50;
} // namespace replica
