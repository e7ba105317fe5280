#pragma once
// Character-level text CNN (Zhang, Zhao and LeCun 2015, the small model): 69 one-hot characters x
// 1014 positions, 14 classes (DBpedia). 1-D convolutions, then fully connected layers. Default batch 128.

#include "replica/core/config.hpp"
#include "replica/layers/activation.hpp"
#include "replica/layers/conv.hpp"
#include "replica/layers/linear.hpp"
#include "replica/layers/pool.hpp"
#include "replica/model/sequential.hpp"
#include "replica/models/default_batch.hpp"

namespace REPLICA_NAMESPACE::models {

using TextCNN = Sequential<Input<69, 1014>,
                           Conv1d<256, 7>, ReLU, MaxPool1d<3>,
                           Conv1d<256, 7>, ReLU, MaxPool1d<3>,
                           Conv1d<256, 3>, ReLU, Conv1d<256, 3>, ReLU,
                           Conv1d<256, 3>, ReLU, Conv1d<256, 3>, ReLU, MaxPool1d<3>,   // -> 256x34
                           Flatten, Linear<1024>, ReLU, Dropout<0.5>,
                           Linear<1024>, ReLU, Dropout<0.5>, Linear<14>>;

template <>
inline constexpr std::size_t default_batch_size<TextCNN> = 128;

} // namespace replica::models

namespace REPLICA_NAMESPACE {
using models::TextCNN;
} // namespace replica
