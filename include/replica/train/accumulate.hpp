#pragma once
// Gradient accumulation: one update of an optimizer per k batches, the same update as one batch k
// times as large (the mean of the k batches' gradients; batches of equal size).
//   Accumulate opt{AdamW{{.lr = 1e-3f}}, 4};    train_step 4 times at batch 16 = once at batch 64
// It wraps the optimizer: each update of the model (train_step's) adds the gradient to a sum kept
// beside the parameters; every k-th applies the wrapped optimizer to the mean and clears the sum. The
// parameters change only then. The schedule's rate at that k-th call is the one used.
//
// State: one float a parameter (the sum), then the wrapped optimizer's state. step_count() counts
// the model's updates (batches); the wrapped optimizer counts its own (one per k). A checkpoint of it
// names no optimizer (its state is not one optimizer's) and keeps step_count(); resuming sets both.

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
class Accumulate {
public:
    static constexpr std::size_t state_per_param = 1 + Opt::state_per_param;   // the sum, then Opt's
    static constexpr auto state_planes = model::plane_before<1, Opt>();        // as planes (model/state_planes.hpp)
    static constexpr std::uint32_t checkpoint_id = 0;                          // names none (checkpoint.hpp)

private:
    // A part's update on a window's k-th batch, in two halves around the look at the parts' means;
    // each an optimizer over Accumulate's state.
    struct ToMean {
        static constexpr std::size_t state_per_param = Accumulate::state_per_param;
        const Accumulate* self;
        template <class Ctx>
        void apply(Ctx& ctx, float*, const float* grad, float* state, std::span<const core::ParamSegment> segments,
                   core::GradientAt = core::GradientAt::params) const
        {
            accumulate_gradient(ctx, grad, state, segments, true, 1.0f / float(self->k_));
        }
    };
    template <class O>
    struct FromMean {
        static constexpr std::size_t state_per_param = Accumulate::state_per_param;
        const O* opt;
        template <class Ctx>
        void apply(Ctx& ctx, float* w, const float*, float* state, std::span<const core::ParamSegment> segments,
                   core::GradientAt = core::GradientAt::params) const
        {
            const std::size_t trainable = trainable_of(segments);
            opt->apply(ctx, w, state, state + trainable, segments, core::GradientAt::state);
            fill(ctx, state, 0.0f, trainable);
        }
    };

    // Parts' means as a gradient in parts: the first float of state a trainable parameter
    // (GradientAt::state), which apply(o) hands to o with the state after it, then clears.
    template <class Parts>
    struct Means {
        using context = typename Parts::context;
        Parts& parts;
        double squares(core::GradientAt = core::GradientAt::params) { return parts.squares(core::GradientAt::state); }
        void clip(double squares, float max_norm, core::GradientAt = core::GradientAt::params)
        {
            parts.clip(squares, max_norm, core::GradientAt::state);
        }
        template <class O>
        void apply(const O& o)
        {
            parts.apply(FromMean<O>{&o});
        }
    };

public:
    Accumulate(Opt opt, std::size_t k) : opt_(std::move(opt)), k_(k)
    {
        core::require(k >= 1, "Accumulate: k, the batches per update, must be at least 1, got " + std::to_string(k));
    }

    Opt& wrapped() { return opt_; }
    const Opt& wrapped() const { return opt_; }
    std::size_t k() const { return k_; }
    const auto& options() const { return opt_.options(); }
    float lr() const { return opt_.lr(); }
    void set_lr(float lr) { opt_.set_lr(lr); }

    std::uint64_t step_count() const { return calls_; }
    void set_step_count(std::uint64_t t)
    {
        calls_ = t;
        if constexpr (requires { opt_.set_step_count(t); }) opt_.set_step_count(t / k_);
    }
    // Before each update of the model (train_step calls it); the wrapped optimizer's is called on
    // every k-th.
    void begin_update()
    {
        ++calls_;
        if constexpr (requires { opt_.begin_update(); })
            if (calls_ % k_ == 0) opt_.begin_update();
    }
    // Whether the current update changes the parameters.
    bool updates_now() const { return calls_ % k_ == 0; }

    // A wrapped optimizer that looks at the whole gradient first (ClipGradNorm) looks at the mean of
    // the k batches instead, on every k-th update in apply, as it would at one batch k times as large.
    // This member says so to the model, which calls it with each batch's whole gradient (and refuses a
    // model that updates slice by slice, a nested DataParallel): it leaves that gradient as it is.
    template <class Ctx>
        requires requires(const Opt& o, Ctx& c, float* g, std::size_t n) { o.prepare(c, g, n); }
    void prepare(Ctx&, float*, std::size_t) const
    {
    }

    // The same over a gradient in parts (model::GradientPartsContract), for a wrapped optimizer that
    // looks at the whole gradient: on a window's k-th batch every part makes its sum the mean, the
    // wrapped optimizer looks at the parts' means as its whole gradient (their squares, their clip),
    // and every part applies it to its mean and clears the sum; on the others every part adds.
    template <class Parts>
        requires model::PreparesGradient<Opt, typename Parts::context> &&
                 model::UpdatesInParts<Opt, typename Parts::context, Means<Parts>>
    void update_in_parts(Parts& parts) const
    {
        if (!updates_now()) {
            parts.apply(*this);   // adds the batch's gradient to the sum, nothing else
            return;
        }
        parts.apply(ToMean{this});
        Means<Parts> means{parts};
        model::update_in_parts(opt_, means);
    }

    // The slice's state: the sum (one float a trainable parameter, at its state index), then the
    // wrapped optimizer's, which reads the sum as its gradient (GradientAt::state).
    template <class Ctx>
    void apply(Ctx& ctx, float* w, const float* grad, float* state, std::span<const core::ParamSegment> segments,
               core::GradientAt at = core::GradientAt::params) const
    {
        core::require(calls_ > 0, "Accumulate: apply() before begin_update(): call opt.begin_update() once before "
                                  "each update of the model (train_step does)");
        core::require(at == core::GradientAt::params, "Accumulate cannot wrap another Accumulate: give it k * k' instead");
        float* sum = state;
        const std::size_t trainable = trainable_of(segments);
        const bool last = updates_now();
        accumulate_gradient(ctx, grad, sum, segments, last, 1.0f / float(k_));
        if (!last) return;
        if constexpr (requires { opt_.prepare(ctx, sum, trainable); }) opt_.prepare(ctx, sum, trainable);
        opt_.apply(ctx, w, sum, state + trainable, segments, core::GradientAt::state);
        fill(ctx, sum, 0.0f, trainable);
    }

    // Drops a slice's sum without an update (LossScale skips a window whose gradient overflowed).
    template <class Ctx>
    void discard(Ctx& ctx, float* state, std::span<const core::ParamSegment> segments) const
    {
        fill(ctx, state, 0.0f, trainable_of(segments));
    }

private:
    // Trainable parameters of a slice: its segments' state indices end there.
    static std::size_t trainable_of(std::span<const core::ParamSegment> segments)
    {
        return segments.empty() ? 0 : segments.back().state + segments.back().count;
    }

    Opt opt_;
    std::size_t k_;
    std::uint64_t calls_ = 0;
};

} // namespace replica::train

namespace REPLICA_NAMESPACE {
using train::Accumulate;
} // namespace replica
