#pragma once
// replica: compile-time neural networks, trained data-parallel on one or many devices.
// The umbrella header; each folder below is one layer of the library (docs/design.md).

#include "replica/version.hpp"

#include "replica/core/device.hpp"
#include "replica/core/error.hpp"
#include "replica/core/rng.hpp"
#include "replica/core/shape.hpp"
#include "replica/core/tensor.hpp"

#include "replica/backend/backend.hpp"

#include "replica/layers/activation.hpp"
#include "replica/layers/attention.hpp"
#include "replica/layers/conv.hpp"
#include "replica/layers/embedding.hpp"
#include "replica/layers/layer_norm.hpp"
#include "replica/layers/linear.hpp"
#include "replica/layers/loss.hpp"
#include "replica/layers/normalization.hpp"
#include "replica/layers/op.hpp"
#include "replica/layers/pool.hpp"
#include "replica/layers/tensor_parallel.hpp"
#include "replica/layers/tied_head.hpp"

#include "replica/model/concat.hpp"
#include "replica/model/concepts.hpp"
#include "replica/model/input.hpp"
#include "replica/model/residual.hpp"
#include "replica/model/sequential.hpp"

#include "replica/train/accumulate.hpp"
#include "replica/train/adam.hpp"
#include "replica/train/checkpoint.hpp"
#include "replica/train/clip.hpp"
#include "replica/train/generate.hpp"
#include "replica/train/history.hpp"
#include "replica/train/loss_scale.hpp"
#include "replica/train/schedule.hpp"
#include "replica/train/sgd.hpp"
#include "replica/train/step.hpp"
#include "replica/train/trainer.hpp"

#include "replica/data/augment.hpp"
#include "replica/data/cifar.hpp"
#include "replica/data/dataset.hpp"
#include "replica/data/fashion_mnist.hpp"
#include "replica/data/idx.hpp"
#include "replica/data/loader.hpp"
#include "replica/data/source.hpp"
#include "replica/data/synthetic.hpp"
#include "replica/data/token_file.hpp"
// data/image.hpp and data/image_folder.hpp need libpng and libjpeg: include them yourself (replica-images).

#include "replica/parallel/auto_parallel.hpp"
#include "replica/parallel/communicator.hpp"
#include "replica/parallel/data_parallel.hpp"
#include "replica/parallel/data_pipeline.hpp"
#include "replica/parallel/dispatch.hpp"
#include "replica/parallel/pipeline.hpp"
#include "replica/parallel/scaling.hpp"
#include "replica/parallel/tensor_parallel.hpp"

#include "replica/models/models.hpp"
