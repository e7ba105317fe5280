#pragma once
// The CPU backend: a Context and the kernels that overload on it.

#include "replica/backend/cpu/attention.hpp"
#include "replica/backend/cpu/context.hpp"
#include "replica/backend/cpu/conv.hpp"
#include "replica/backend/cpu/elementwise.hpp"
#include "replica/backend/cpu/embedding.hpp"
#include "replica/backend/cpu/layer_norm.hpp"
#include "replica/backend/cpu/linear.hpp"
#include "replica/backend/cpu/loss.hpp"
#include "replica/backend/cpu/normalization.hpp"
#include "replica/backend/cpu/ops.hpp"
#include "replica/backend/cpu/optim.hpp"
#include "replica/backend/cpu/pool.hpp"
#include "replica/backend/kernels/kernels.hpp"
#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::backend::cpu {

// Every op of the kernel API (backend/kernels/), checked once all of them are declared.
static_assert(backend::kernels::implements_kernels<Context>());

} // namespace replica::backend::cpu
