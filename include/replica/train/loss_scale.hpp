#pragma once
// Dynamic loss scaling, as torch.amp.GradScaler does it: for training whose activations are stored in
// fp16, where small gradients would round to zero. It wraps an optimizer:
//   LossScale opt{AdamW{{.lr = 1e-3f}}};                              scale 2^16, x2 every 2000 clean steps
//   LossScale opt{ClipGradNorm{SGD{{.lr = 0.1f}}, 1.0f}, {.growth_interval = 500}};
// train_step multiplies the loss by loss_scale() (so every gradient comes out multiplied by it). Before the
// update the whole gradient is checked: when a value is NaN or infinite the update is SKIPPED
// (parameters, optimizer state and the wrapped optimizer's update count as before it), the scale is
// multiplied by backoff_factor and the skip is counted; otherwise the gradient is divided by the scale
// and the wrapped optimizer applies it, and after growth_interval such updates in a row the scale is
// multiplied by growth_factor. Any model takes it (fp32 ones too); enabled = false makes it the
// wrapped optimizer alone.
//
// What it wraps: a ClipGradNorm clips the unscaled gradient (after the division, as PyTorch's docs
// require). An Accumulate (LossScale{Accumulate{AdamW{...}, 4}}) keeps one scale through each window
// of k batches; a non-finite gradient in any of them skips the window's update (its sum is dropped)
// and the scale changes only at the window's end.
//
// The call contract (train_step keeps it): begin_update() before each update of the model, the
// model's update (prepare(ctx, g, count) on the whole gradient, then apply() slice by slice), then
// end_update() on the host, once, after the model's update has been issued. Under a DataParallel
// every replica runs prepare() and apply() on its own all-reduced gradient, possibly from several
// threads at once; those gradients are the same bit for bit, so every replica finds the same answer
// and the replicas take the same decision (the flag they share is only ever set to one value per
// update). A Pipeline, a TensorParallel and a DataParallel of pipelines hold their gradient in parts
// on several devices: update_in_parts unscales every part and combines their answers, so that one
// non-finite part skips every part's update (model::update_in_parts). A model holding a nested
// DataParallel (updated slice by slice) does not take it: a compile error, as for ClipGradNorm.
//
// The check needs its answer on the host before the update is issued: on a GPU the host waits for
// the step's gradient there, so the fast mode (train_step's `next`) still queues the next step before
// waiting for this step's loss, but the GPU idles while the host issues the update and the next step.
// A change of scale makes the step queued ahead (computed at the old scale) be computed again.
//
// State: the wrapped optimizer's, and (scale, clean steps, skipped steps), which checkpoints keep.

#include <atomic>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

#include "replica/core/config.hpp"
#include "replica/core/error.hpp"
#include "replica/core/param_kind.hpp"
#include "replica/model/concepts.hpp"
#include "replica/model/state_planes.hpp"

namespace REPLICA_NAMESPACE::train {

struct LossScaleOptions {
    float init_scale = 65536.0f;            // the first scale, 2^16
    float growth_factor = 2.0f;             // > 1
    float backoff_factor = 0.5f;            // in (0, 1)
    std::uint64_t growth_interval = 2000;   // clean updates in a row before the scale grows; >= 1
    bool enabled = true;                    // false: no scaling, no check
};

// What a checkpoint keeps of a LossScale.
struct LossScaleState {
    float scale = 65536.0f;
    std::uint64_t clean_steps = 0;     // updates without NaN or infinity since the scale last changed
    std::uint64_t skipped_steps = 0;   // updates skipped so far in the run
    bool operator==(const LossScaleState&) const = default;
};

namespace detail {
// An Accumulate: updates_now() tells whether the current batch ends a window; discard() drops a
// slice's sum.
template <class Opt, class Ctx>
concept AccumulatesWindows = requires(const Opt& o, Ctx& ctx, float* state, std::span<const core::ParamSegment> s) {
    { o.updates_now() } -> std::convertible_to<bool>;
    o.discard(ctx, state, s);
};
} // namespace detail

// Opt may be a reference (LossScale<AdamW&>: the Trainer's loss_scale option wraps the caller's
// optimizer so).
template <class Opt>
class LossScale {
    using Wrapped = std::remove_cvref_t<Opt>;

public:
    static constexpr std::size_t state_per_param = Wrapped::state_per_param;
    static constexpr auto state_planes = model::state_planes_of<Wrapped>();
    // Checkpoints name the wrapped optimizer (none for an Accumulate).
    static constexpr std::uint32_t checkpoint_id = [] {
        if constexpr (requires { Wrapped::checkpoint_id; }) return Wrapped::checkpoint_id;
        else return std::uint32_t{0};
    }();

    explicit LossScale(Opt opt, LossScaleOptions o = {}) : opt_(std::forward<Opt>(opt)), scaling_(o)
    {
        core::require(std::isfinite(o.init_scale) && o.init_scale > 0.0f,
                      "LossScale: init_scale must be a finite number > 0, got " + std::to_string(o.init_scale));
        core::require(std::isfinite(o.growth_factor) && o.growth_factor > 1.0f,
                      "LossScale: growth_factor must be > 1 (the scale grows after growth_interval clean steps), got " +
                          std::to_string(o.growth_factor));
        core::require(o.backoff_factor > 0.0f && o.backoff_factor < 1.0f,
                      "LossScale: backoff_factor must be in (0, 1) (the scale shrinks after an overflow), got " +
                          std::to_string(o.backoff_factor));
        core::require(o.growth_interval >= 1, "LossScale: growth_interval must be at least 1 step, got 0");
        state_.scale = o.init_scale;
    }
    LossScale(const LossScale& o) : opt_(o.opt_), scaling_(o.scaling_), state_(o.state_), skipped_last_(o.skipped_last_)
    {
        found_non_finite_.store(o.found_non_finite_.load());
    }
    LossScale& operator=(const LossScale& o)
        requires(!std::is_reference_v<Opt>)
    {
        opt_ = o.opt_;
        scaling_ = o.scaling_;
        state_ = o.state_;
        skipped_last_ = o.skipped_last_;
        found_non_finite_.store(o.found_non_finite_.load());
        return *this;
    }

    Wrapped& wrapped() { return opt_; }
    const Wrapped& wrapped() const { return opt_; }
    // The wrapped optimizer's options (Trainer reads the base learning rate there); this one's are
    // scaling_options().
    const auto& options() const { return opt_.options(); }
    const LossScaleOptions& scaling_options() const { return scaling_; }
    float lr() const { return opt_.lr(); }
    void set_lr(float lr) { opt_.set_lr(lr); }
    bool enabled() const { return scaling_.enabled; }

    // The factor train_step multiplies the loss by: the scale, 1 when disabled.
    float loss_scale() const { return scaling_.enabled ? state_.scale : 1.0f; }
    float scale() const { return state_.scale; }
    std::uint64_t skipped_steps() const { return state_.skipped_steps; }
    // Whether the last update (end_update()) was skipped.
    bool skipped_last() const { return skipped_last_; }

    const LossScaleState& scale_state() const { return state_; }
    // A resumed run's state (from its checkpoint). Throws Error for a scale that is not finite and > 0.
    void set_scale_state(const LossScaleState& s)
    {
        core::require(std::isfinite(s.scale) && s.scale > 0.0f,
                      "LossScale: the scale must be a finite number > 0, got " + std::to_string(s.scale));
        state_ = s;
        found_non_finite_.store(false);
        skipped_last_ = false;
    }
    // The state a run starts with: init_scale, nothing counted (a checkpoint without loss scaling's).
    LossScaleState initial_state() const { return {.scale = scaling_.init_scale}; }

    std::uint64_t step_count() const
        requires requires(const Wrapped& o) { o.step_count(); }
    {
        return opt_.step_count();
    }
    void set_step_count(std::uint64_t t)
        requires requires(Wrapped& o) { o.set_step_count(t); }
    {
        opt_.set_step_count(t);
    }
    // Before each update of the model. The wrapped optimizer counts it now; end_update() takes a
    // skipped update back off its count. A new window (every update, without an Accumulate) starts
    // with no overflow found, even when the previous step threw before its end_update().
    void begin_update()
    {
        if constexpr (requires { opt_.begin_update(); }) opt_.begin_update();
        if (starts_window()) found_non_finite_.store(false);
    }

    // The whole gradient, once per update, before apply: checked for NaN and infinity and divided by
    // the scale; then the wrapped optimizer's prepare (ClipGradNorm clips it), when it is finite.
    template <class Ctx>
    void prepare(Ctx& ctx, float* gradient, std::size_t count) const
    {
        if (scaling_.enabled) {
            if (found_non_finite_.load(std::memory_order_relaxed)) return;   // an earlier batch of the window
            if (!unscale_gradient(ctx, gradient, count, 1.0f / state_.scale)) {
                found_non_finite_.store(true, std::memory_order_relaxed);
                return;
            }
        }
        if constexpr (requires { opt_.prepare(ctx, gradient, count); }) opt_.prepare(ctx, gradient, count);
    }

    // The same over a gradient in parts (model::GradientPartsContract): every part checked and
    // unscaled, and when any was not finite, every part skips as apply() does.
    template <class Parts>
        requires model::UpdatesInParts<Wrapped, typename Parts::context, Parts> &&
                 requires(Parts& p) { { p.unscale(1.0f) } -> std::same_as<bool>; }
    void update_in_parts(Parts& parts) const
    {
        if (scaling_.enabled && !found_non_finite_.load(std::memory_order_relaxed))
            if (!parts.unscale(1.0f / state_.scale)) found_non_finite_.store(true, std::memory_order_relaxed);
        if (found_non_finite_.load(std::memory_order_relaxed)) parts.apply(*this);   // nothing, or the window's sum dropped
        else model::update_in_parts(opt_, parts);
    }

    template <class Ctx>
    void apply(Ctx& ctx, float* w, const float* grad, float* state, std::span<const core::ParamSegment> segments,
               core::GradientAt at = core::GradientAt::params) const
    {
        if (!found_non_finite_.load(std::memory_order_relaxed)) {
            opt_.apply(ctx, w, grad, state, segments, at);
            return;
        }
        if constexpr (detail::AccumulatesWindows<Wrapped, Ctx>)
            if (opt_.updates_now()) opt_.discard(ctx, state, segments);   // the window's sum, dropped
    }

    // This update's gradient could not be formed (the reproducible mode's exact sum overflowed):
    // skipped as a non-finite one. Before the model's update.
    void note_non_finite() { found_non_finite_.store(true); }

    // After the model's update of each batch, on the host: the skip is counted and the scale moves
    // (at the end of an accumulation window only). Throws Error when the scale underflows, which
    // means the gradient is NaN or infinite at any scale.
    void end_update()
    {
        skipped_last_ = false;
        if (!scaling_.enabled) return;
        if constexpr (requires { opt_.updates_now(); })
            if (!opt_.updates_now()) return;
        if (!found_non_finite_.exchange(false)) {
            if (++state_.clean_steps >= scaling_.growth_interval) {
                const float grown = state_.scale * scaling_.growth_factor;
                if (std::isfinite(grown)) state_.scale = grown;
                state_.clean_steps = 0;
            }
            return;
        }
        skipped_last_ = true;
        ++state_.skipped_steps;
        state_.clean_steps = 0;
        uncount_update();
        state_.scale *= scaling_.backoff_factor;
        if (!std::isnormal(state_.scale))
            throw Error("LossScale: the loss scale fell to " + std::to_string(state_.scale) + " after " +
                        std::to_string(state_.skipped_steps) + " skipped steps: the gradient is NaN or infinite "
                        "whatever the scale. Likely causes: NaN or infinite inputs, or a model that diverged "
                        "(lower the learning rate)");
    }

private:
    // Whether the current batch is the first of an accumulation window (after begin_update()).
    bool starts_window() const
    {
        if constexpr (requires { opt_.k(); opt_.step_count(); }) return (opt_.step_count() - 1) % opt_.k() == 0;
        else return true;
    }

    // The skipped update is not counted by the optimizer that counts updates (Adam's t): the wrapped
    // one, or the one an Accumulate wraps.
    void uncount_update()
    {
        if constexpr (requires { opt_.updates_now(); opt_.wrapped(); }) {
            auto& inner = opt_.wrapped();
            if constexpr (requires { inner.set_step_count(inner.step_count()); })
                inner.set_step_count(inner.step_count() - 1);
        } else if constexpr (requires { opt_.set_step_count(opt_.step_count()); }) {
            opt_.set_step_count(opt_.step_count() - 1);
        }
    }

    Opt opt_;
    LossScaleOptions scaling_;
    LossScaleState state_;
    bool skipped_last_ = false;
    // This update's (or accumulation window's) gradient held NaN or infinity; set by prepare() on
    // any replica's thread, read by apply(), cleared by end_update().
    mutable std::atomic<bool> found_non_finite_{false};
};

} // namespace replica::train

namespace REPLICA_NAMESPACE {
using train::LossScale;
using train::LossScaleOptions;
using train::LossScaleState;
} // namespace replica
