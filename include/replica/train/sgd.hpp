#pragma once
// SGD with momentum, weight decay and Nesterov momentum, as PyTorch defines it.
//   SGD opt{{.lr = 0.01f, .momentum = 0.9f, .weight_decay = 5e-4f}};
// The optimizer holds hyper-parameters and the current learning rate; its state (the velocity, one
// float per parameter) lives beside each replica's parameters, on the replica's device.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "replica/core/config.hpp"
#include "replica/core/error.hpp"
#include "replica/core/param_kind.hpp"

namespace REPLICA_NAMESPACE::train {

struct SGDOptions {
    float lr = 0.01f;
    float momentum = 0.0f;
    float weight_decay = 0.0f;
    bool nesterov = false;
};

class SGD {
public:
    static constexpr std::size_t state_per_param = 1;   // velocity
    static constexpr std::uint32_t checkpoint_id = 1;    // how checkpoints name it (train/checkpoint.hpp)

    explicit SGD(SGDOptions o = {}) : options_(o), lr_(o.lr)
    {
        core::require(std::isfinite(o.lr) && o.lr > 0.0f, "SGD learning rate must be > 0, got " + std::to_string(o.lr));
        core::require(o.momentum >= 0.0f && o.momentum < 1.0f,
                      "SGD momentum must be in [0, 1), got " + std::to_string(o.momentum));
        core::require(o.weight_decay >= 0.0f, "SGD weight decay must be >= 0, got " + std::to_string(o.weight_decay));
        core::require(!o.nesterov || o.momentum > 0.0f, "Nesterov momentum needs momentum > 0");
    }

    const SGDOptions& options() const { return options_; }
    float lr() const { return lr_; }
    // The learning rate of the next updates (schedules set it; the base rate stays in options()).
    void set_lr(float lr) { lr_ = lr; }

    // The parameters the segments name (model/param_layout.hpp), each segment's weight decay and rate
    // scaled as the model's ParamRule says.
    template <class Ctx>
    void apply(Ctx& ctx, float* w, const float* grad, float* velocity, std::span<const core::ParamSegment> segments,
               core::GradientAt at = core::GradientAt::params) const
    {
        sgd_update(ctx, w, grad, velocity, segments, at, lr_, options_.momentum, options_.weight_decay,
                   options_.nesterov);
    }

private:
    SGDOptions options_;
    float lr_;
};

} // namespace replica::train

namespace REPLICA_NAMESPACE {
using train::SGD;
using train::SGDOptions;
} // namespace replica
