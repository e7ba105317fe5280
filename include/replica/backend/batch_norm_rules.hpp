#pragma once
// Per-channel rules of batch normalisation's running estimates, shared by the CPU loops
// (backend/cpu/normalization.hpp) and the GPU kernels (backend/cuda/normalization.hpp), so that both
// compute the same doubles; and how both backends' backward passes are told of a ReLU after it.

#include <cmath>

#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::backend {

// A ReLU that followed the normalisation in forward (batch_norm_apply's relu), for the backward passes,
// whose dy is then the ReLU's output gradient, read through its mask, one of two ways:
// - without an addend, by the normalisation's weight and bias: the passes recompute the mask from x
//   (the output batch_norm_apply wrote is > 0 exactly there), so they never read that output;
// - after an addend (a Residual's other branch, which the mask also depends on; the backward sums
//   only), by that output y and a buffer dz: the sums read y and write the masked gradient,
//   relu_backward(y, dy)'s bits, to dz as they read dy, for the input gradient and the other branch.
// Empty: no ReLU.
template <class T>
struct ReluAfter {
    const float* weight = nullptr;
    const float* bias = nullptr;
    const T* y = nullptr;
    T* dz = nullptr;
    bool from_x() const { return weight != nullptr; }
    bool from_y() const { return y != nullptr; }
    explicit operator bool() const { return from_x() || from_y(); }
};

// How far the running estimates move toward a batch's: `value` of the way (0: not at all), or, with
// `steps` (context memory: the batches tracked so far, this one included), 1 / *steps of the way, which
// keeps them the plain average over those batches (PyTorch's momentum=None). Read where the estimates
// move, so a step replayed from a CUDA graph reads the count of its own replay.
struct Momentum {
    float value = 0.0f;
    const float* steps = nullptr;
    REPLICA_HOST_DEVICE Momentum(float v = 0.0f, const float* s = nullptr) : value(v), steps(s) {}
    REPLICA_HOST_DEVICE double factor() const { return steps != nullptr ? 1.0 / double(*steps) : double(value); }
    REPLICA_HOST_DEVICE explicit operator bool() const { return steps != nullptr || value != 0.0f; }
};

// Moves the running estimates `momentum` of the way to mean m and to the unbiased form of var, the
// biased variance over count values.
REPLICA_HOST_DEVICE void move_running(float& running_mean, float& running_var, double m, double var, double count,
                                      Momentum momentum)
{
    const double unbiased = count > 1 ? var * count / (count - 1) : var;
    const double f = momentum.factor();
    running_mean = float((1.0 - f) * running_mean + f * m);
    running_var = float((1.0 - f) * running_var + f * unbiased);
}

// One channel's batch statistics from its sums (s1: of x - the running mean, s2: of its square, over
// count values): the batch mean, 1 / sqrt(biased var + eps), and the running estimates moved `momentum`
// of the way to the mean and the unbiased variance (momentum 0: left as they are, only read).
REPLICA_HOST_DEVICE void batch_statistics(float s1, float s2, float count, float& running_mean, float& running_var,
                                          Momentum momentum, float eps, float& mean, float& invstd)
{
    const double n = count;
    const double d = n > 0 ? s1 / n : 0.0;
    const double s = n > 0 ? s2 / n - d * d : 0.0;
    const double var = s > 0.0 ? s : 0.0;   // NaN too
    const double m = double(running_mean) + d;
    mean = float(m);
    invstd = float(1.0 / sqrt(var + double(eps)));
    if (momentum) move_running(running_mean, running_var, m, var, n, momentum);
}

// The statistics batch_norm_sums may derive as soon as its sums are made (batch_norm_statistics' in
// the sums' last pass), where no replica's sums are to be added first. Empty: the sums only.
struct StatisticsUpdate {
    float* running_mean = nullptr;
    float* running_var = nullptr;
    Momentum momentum = {};
    float eps = 0.0f;
    float* mean = nullptr;
    float* invstd = nullptr;
    REPLICA_HOST_DEVICE explicit operator bool() const { return mean != nullptr; }
};

} // namespace replica::backend
