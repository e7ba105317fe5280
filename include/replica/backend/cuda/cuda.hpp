#pragma once
// The CUDA backend: a Context and the kernels that overload on it. Compiled only under nvcc.

#if !defined(__CUDACC__)
#error "replica's CUDA backend compiles only under nvcc: build this translation unit as CUDA (.cu)"
#endif

#include "replica/backend/cuda/activation.hpp"
#include "replica/backend/cuda/attention.hpp"
#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/conv.hpp"
#include "replica/backend/cuda/elementwise.hpp"
#include "replica/backend/cuda/embedding.hpp"
#include "replica/backend/cuda/layer_norm.hpp"
#include "replica/backend/cuda/linear.hpp"
#include "replica/backend/cuda/loss.hpp"
#include "replica/backend/cuda/normalization.hpp"
#include "replica/backend/cuda/optim.hpp"
#include "replica/backend/cuda/pool.hpp"
#include "replica/backend/cuda/timing.hpp"
#include "replica/backend/kernels/kernels.hpp"
#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::backend::cuda {

// Every op of the kernel API (backend/kernels/), checked once all of them are declared. (Here
// `kernels` alone names this backend's own namespace of __global__ functions.)
static_assert(backend::kernels::implements_kernels<Context>());

} // namespace replica::backend::cuda
