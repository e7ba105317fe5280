#pragma once
// AlexNet for 3x224x224 images, 1000 classes (61,100,840 parameters). Default batch 128.
//
//   AlexNetFeatures     the convolutions: 3x224x224 -> 256x6x6
//   AlexNetClassifier   dropout and the fully connected layers: 256x6x6 -> 1000
//   AlexNet             features replicated on every device, classifier on the first, as DIGITS'
//                       standard AlexNet did it (auto_parallel leaves it as it is)
//   AlexNetPlain        the same network without the nested DataParallel (auto_parallel wraps it whole)

#include "replica/core/config.hpp"
#include "replica/layers/activation.hpp"
#include "replica/layers/conv.hpp"
#include "replica/layers/linear.hpp"
#include "replica/layers/pool.hpp"
#include "replica/model/sequential.hpp"
#include "replica/models/default_batch.hpp"
#include "replica/parallel/data_parallel.hpp"

namespace REPLICA_NAMESPACE::models {

using AlexNetFeatures = Sequential<Input<3, 224, 224>,
                                   Conv2d<64, 11, 4, 2>, ReLU, MaxPool2d<3, 2>,
                                   Conv2d<192, 5, 1, 2>, ReLU, MaxPool2d<3, 2>,
                                   Conv2d<384, 3, 1, 1>, ReLU,
                                   Conv2d<256, 3, 1, 1>, ReLU,
                                   Conv2d<256, 3, 1, 1>, ReLU, MaxPool2d<3, 2>>;

using AlexNetClassifier = Sequential<Input<256, 6, 6>,
                                     Flatten, Dropout<0.5>, Linear<4096>, ReLU,
                                     Dropout<0.5>, Linear<4096>, ReLU, Linear<1000>>;

using AlexNet = Sequential<Input<3, 224, 224>, DataParallel<AlexNetFeatures, Threaded>, AlexNetClassifier>;
using AlexNetPlain = Sequential<Input<3, 224, 224>, AlexNetFeatures, AlexNetClassifier>;

template <>
inline constexpr std::size_t default_batch_size<AlexNet> = 128;
template <>
inline constexpr std::size_t default_batch_size<AlexNetPlain> = 128;

} // namespace replica::models

namespace REPLICA_NAMESPACE {
using models::AlexNet;
using models::AlexNetClassifier;
using models::AlexNetFeatures;
using models::AlexNetPlain;
} // namespace replica
