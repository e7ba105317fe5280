#pragma once
// Clipping by the global gradient norm, as torch.nn.utils.clip_grad_norm_ does it: when the L2 norm
// of the whole model's gradient exceeds max_norm, the gradient is scaled by max_norm / (norm + 1e-6)
// before the wrapped optimizer's update.
//   ClipGradNorm opt{SGD{{.lr = 0.1f, .momentum = 0.9f}}, 1.0f};
// The model calls prepare(ctx, gradient, count) with its whole gradient once per update, before the
// update, its frozen parameters' gradients zeros (model/param_rules.hpp: they count as none): under a DataParallel that is each replica's all-reduced gradient, the same on every
// replica, so every replica clips alike. The norm is computed and applied on the model's device
// (no host round trip). A Pipeline, a TensorParallel and a DataParallel of pipelines hold their
// gradient in parts on several devices: update_in_parts adds the parts' sums of squares on the host
// (each parameter once), scales every part by the total, then updates with wrapped() in parts
// (model::update_in_parts); the result is the plain model's up to the sum's order. A model holding a nested DataParallel (whose
// replicas update slice by slice) does not take it: that is a compile error.
//
// State: the wrapped optimizer's. Checkpoints name the wrapped optimizer.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include "replica/core/config.hpp"
#include "replica/core/error.hpp"
#include "replica/core/param_kind.hpp"
#include "replica/model/concepts.hpp"
#include "replica/model/state_planes.hpp"

namespace REPLICA_NAMESPACE::train {

template <class Opt>
class ClipGradNorm {
public:
    static constexpr std::size_t state_per_param = Opt::state_per_param;
    static constexpr auto state_planes = model::state_planes_of<Opt>();

    ClipGradNorm(Opt opt, float max_norm) : opt_(std::move(opt)), max_norm_(max_norm)
    {
        core::require(std::isfinite(max_norm) && max_norm > 0.0f,
                      "ClipGradNorm: max_norm must be > 0, got " + std::to_string(max_norm));
    }

    Opt& wrapped() { return opt_; }
    const Opt& wrapped() const { return opt_; }
    float max_norm() const { return max_norm_; }
    const auto& options() const { return opt_.options(); }
    float lr() const { return opt_.lr(); }
    void set_lr(float lr) { opt_.set_lr(lr); }

    // The wrapped optimizer's checkpoint name and step count, when it has them.
    static constexpr std::uint32_t checkpoint_id = [] {
        if constexpr (requires { Opt::checkpoint_id; }) return Opt::checkpoint_id;
        else return std::uint32_t{0};
    }();
    std::uint64_t step_count() const
        requires requires(const Opt& o) { o.step_count(); }
    {
        return opt_.step_count();
    }
    void set_step_count(std::uint64_t t)
        requires requires(Opt& o) { o.set_step_count(t); }
    {
        opt_.set_step_count(t);
    }
    void begin_update()
        requires requires(Opt& o) { o.begin_update(); }
    {
        opt_.begin_update();
    }

    // The whole gradient, once per update, before apply: scaled in place when its norm is too large.
    template <class Ctx>
    void prepare(Ctx& ctx, float* gradient, std::size_t count) const
    {
        clip_by_norm(ctx, gradient, count, max_norm_);
    }

    // The same over a gradient in parts (model::GradientPartsContract).
    template <class Parts>
        requires model::UpdatesInParts<Opt, typename Parts::context, Parts>
    void update_in_parts(Parts& parts) const
    {
        parts.clip(parts.squares(), max_norm_);
        model::update_in_parts(opt_, parts);
    }

    template <class Ctx>
    void apply(Ctx& ctx, float* w, const float* grad, float* state, std::span<const core::ParamSegment> segments,
               core::GradientAt at = core::GradientAt::params) const
    {
        opt_.apply(ctx, w, grad, state, segments, at);
    }

private:
    Opt opt_;
    float max_norm_;
};

} // namespace replica::train

namespace REPLICA_NAMESPACE {
using train::ClipGradNorm;
} // namespace replica
