#pragma once
// GoogLeNet (Inception v1, Szegedy et al. 2014) for 3x224x224 images, 1000 classes, without the
// auxiliary heads and without local response normalisation. Default batch 32.

#include "replica/core/config.hpp"
#include "replica/layers/activation.hpp"
#include "replica/layers/conv.hpp"
#include "replica/layers/linear.hpp"
#include "replica/layers/pool.hpp"
#include "replica/model/concat.hpp"
#include "replica/model/sequential.hpp"
#include "replica/models/default_batch.hpp"

namespace REPLICA_NAMESPACE::models {

// 1x1 | 1x1 -> 3x3 | 1x1 -> 5x5 | 3x3 max pool -> 1x1, each with ReLU, concatenated on channels.
template <std::size_t C1, std::size_t C3Reduce, std::size_t C3, std::size_t C5Reduce, std::size_t C5, std::size_t PoolProj>
using Inception = Concat<Sequential<Conv2d<C1, 1>, ReLU>,
                         Sequential<Conv2d<C3Reduce, 1>, ReLU, Conv2d<C3, 3, 1, 1>, ReLU>,
                         Sequential<Conv2d<C5Reduce, 1>, ReLU, Conv2d<C5, 5, 1, 2>, ReLU>,
                         Sequential<MaxPool2d<3, 1, 1>, Conv2d<PoolProj, 1>, ReLU>>;

using GoogLeNet = Sequential<Input<3, 224, 224>,
                             Conv2d<64, 7, 2, 3>, ReLU, MaxPool2dCeil<3, 2>,
                             Conv2d<64, 1>, ReLU, Conv2d<192, 3, 1, 1>, ReLU, MaxPool2dCeil<3, 2>,
                             Inception<64, 96, 128, 16, 32, 32>,       // 3a -> 256x28x28
                             Inception<128, 128, 192, 32, 96, 64>,     // 3b -> 480x28x28
                             MaxPool2dCeil<3, 2>,
                             Inception<192, 96, 208, 16, 48, 64>,      // 4a -> 512x14x14
                             Inception<160, 112, 224, 24, 64, 64>,     // 4b
                             Inception<128, 128, 256, 24, 64, 64>,     // 4c
                             Inception<112, 144, 288, 32, 64, 64>,     // 4d -> 528x14x14
                             Inception<256, 160, 320, 32, 128, 128>,   // 4e -> 832x14x14
                             MaxPool2dCeil<3, 2>,
                             Inception<256, 160, 320, 32, 128, 128>,   // 5a -> 832x7x7
                             Inception<384, 192, 384, 48, 128, 128>,   // 5b -> 1024x7x7
                             GlobalAvgPool, Dropout<0.4>, Linear<1000>>;

template <>
inline constexpr std::size_t default_batch_size<GoogLeNet> = 32;

} // namespace replica::models

namespace REPLICA_NAMESPACE {
using models::GoogLeNet;
using models::Inception;
} // namespace replica
