#pragma once
// Adam and AdamW, as PyTorch's torch.optim defines them (amsgrad off, maximize off):
//   Adam opt{{.lr = 1e-3f, .weight_decay = 1e-4f}};     weight decay added to the gradient
//   AdamW opt{{.lr = 1e-3f, .weight_decay = 1e-2f}};    decoupled: w -= lr * wd * w before the Adam step
// Per parameter, with t the number of updates so far (this one included):
//   m = beta1 * m + (1 - beta1) * g;   v = beta2 * v + (1 - beta2) * g^2
//   w -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)     (eps after the square root)
//
// State: two floats a parameter (m and v, interleaved) beside each replica's parameters, and the
// step count t here, in the optimizer object (checkpoints save it: step_count(), set_step_count()).
//
// The step count contract (what a caller of the model's update must do): call begin_update() once
// before each update of the model; then the model calls apply() once per parameter slice (a model
// with a nested DataParallel applies it slice by slice, on several replicas, possibly from several
// threads at once), and every slice of that update sees the same t. apply() only reads the
// optimizer. train_step and Trainer call begin_update() for you.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "replica/core/config.hpp"
#include "replica/core/error.hpp"
#include "replica/core/param_kind.hpp"

namespace REPLICA_NAMESPACE::train {

struct AdamOptions {
    float lr = 1e-3f;
    float beta1 = 0.9f;
    float beta2 = 0.999f;
    float eps = 1e-8f;
    float weight_decay = 0.0f;
};

// AdamW's options: PyTorch's defaults, weight decay 1e-2.
struct AdamWOptions {
    float lr = 1e-3f;
    float beta1 = 0.9f;
    float beta2 = 0.999f;
    float eps = 1e-8f;
    float weight_decay = 1e-2f;
};

namespace detail {

template <class Options, bool Decoupled>
class AdamRule {
public:
    static constexpr std::size_t state_per_param = 2;   // m, v
    static constexpr const char* name = Decoupled ? "AdamW" : "Adam";
    static constexpr std::uint32_t checkpoint_id = Decoupled ? 3 : 2;   // how checkpoints name it

    explicit AdamRule(Options o = {}) : options_(o), lr_(o.lr)
    {
        const std::string n = name;
        core::require(std::isfinite(o.lr) && o.lr > 0.0f, n + " learning rate must be > 0, got " + std::to_string(o.lr));
        core::require(o.beta1 >= 0.0f && o.beta1 < 1.0f, n + " beta1 must be in [0, 1), got " + std::to_string(o.beta1));
        core::require(o.beta2 >= 0.0f && o.beta2 < 1.0f, n + " beta2 must be in [0, 1), got " + std::to_string(o.beta2));
        core::require(std::isfinite(o.eps) && o.eps > 0.0f,
                      n + " eps must be > 0 (it keeps the step finite where v is 0), got " + std::to_string(o.eps));
        core::require(std::isfinite(o.weight_decay) && o.weight_decay >= 0.0f,
                      n + " weight decay must be >= 0, got " + std::to_string(o.weight_decay));
    }

    const Options& options() const { return options_; }
    float lr() const { return lr_; }
    // The learning rate of the next updates (schedules set it; the base rate stays in options()).
    void set_lr(float lr) { lr_ = lr; }

    // Updates so far. A resumed run sets it from its checkpoint before training on.
    std::uint64_t step_count() const { return step_; }
    void set_step_count(std::uint64_t t) { step_ = t; }

    // Before each update of the model: the update about to be made is number step_count().
    void begin_update() { ++step_; }

    // The parameters the segments name (model/param_layout.hpp), each segment's weight decay and rate
    // scaled as the model's ParamRule says.
    template <class Ctx>
    void apply(Ctx& ctx, float* w, const float* grad, float* state, std::span<const core::ParamSegment> segments,
               core::GradientAt at = core::GradientAt::params) const
    {
        core::require(step_ > 0, std::string(name) + ": apply() before begin_update(): call opt.begin_update() once "
                                                      "before each update of the model (train_step does)");
        const double t = double(step_);
        const float step_size = float(double(lr_) / (1.0 - std::pow(double(options_.beta1), t)));
        const float bias2_sqrt = float(std::sqrt(1.0 - std::pow(double(options_.beta2), t)));
        adam_update(ctx, w, grad, state, segments, at, lr_, options_.beta1, options_.beta2, options_.eps,
                    options_.weight_decay, Decoupled, step_size, bias2_sqrt);
    }

private:
    Options options_;
    float lr_;
    std::uint64_t step_ = 0;
};

} // namespace detail

using Adam = detail::AdamRule<AdamOptions, false>;
using AdamW = detail::AdamRule<AdamWOptions, true>;

} // namespace replica::train

namespace REPLICA_NAMESPACE {
using train::Adam;
using train::AdamOptions;
using train::AdamW;
using train::AdamWOptions;
} // namespace replica
