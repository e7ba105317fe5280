#pragma once
// LeNet for 1x28x28 images, 10 classes (431,080 parameters). Default batch 64.

#include "replica/core/config.hpp"
#include "replica/layers/activation.hpp"
#include "replica/layers/conv.hpp"
#include "replica/layers/linear.hpp"
#include "replica/layers/pool.hpp"
#include "replica/model/sequential.hpp"
#include "replica/models/default_batch.hpp"

namespace REPLICA_NAMESPACE::models {

using LeNet = Sequential<Input<1, 28, 28>,
                         Conv2d<20, 5>, MaxPool2d<2>, Conv2d<50, 5>, MaxPool2d<2>,
                         Flatten, Linear<500>, ReLU, Linear<10>>;

template <>
inline constexpr std::size_t default_batch_size<LeNet> = 64;

} // namespace replica::models

namespace REPLICA_NAMESPACE {
using models::LeNet;
} // namespace replica
