#pragma once
// Per-channel rules of batch normalisation's running estimates, shared by the CPU loops
// (backend/cpu/normalization.hpp) and the GPU kernels (backend/cuda/normalization.hpp), so that both
// compute the same doubles.

#include "replica/core/config.hpp"

namespace replica::backend {

// Moves the running estimates `momentum` of the way to mean m and to the unbiased form of var, the
// biased variance over count values.
REPLICA_HOST_DEVICE void move_running(float& running_mean, float& running_var, double m, double var, double count,
                                      float momentum)
{
    const double unbiased = count > 1 ? var * count / (count - 1) : var;
    running_mean = float((1.0 - momentum) * running_mean + momentum * m);
    running_var = float((1.0 - momentum) * running_var + momentum * unbiased);
}

} // namespace replica::backend
