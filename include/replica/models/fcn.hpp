#pragma once
// A very simple fully convolutional segmentation network: two convolutions and a deconvolution,
// 3x256x256 images, 21 classes per pixel (PASCAL VOC), per-pixel softmax cross-entropy. Default batch 16.

#include "replica/core/config.hpp"
#include "replica/layers/activation.hpp"
#include "replica/layers/conv.hpp"
#include "replica/model/sequential.hpp"
#include "replica/models/default_batch.hpp"

namespace REPLICA_NAMESPACE::models {

using FCN = Sequential<Input<3, 256, 256>,
                       Conv2d<32, 3, 1, 1>, ReLU,
                       Conv2d<64, 3, 2, 1>, ReLU,              // -> 64x128x128
                       ConvTranspose2d<21, 4, 2, 1>>;         // -> 21x256x256

template <>
inline constexpr std::size_t default_batch_size<FCN> = 16;

} // namespace replica::models

namespace REPLICA_NAMESPACE {
using models::FCN;
} // namespace replica
