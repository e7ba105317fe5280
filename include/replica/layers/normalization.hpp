#pragma once
// Batch normalisation, PyTorch's semantics.
//   BatchNorm2d   (c, h, w) -> (c, h, w), statistics per channel over (n, h, w)
//   BatchNorm1d   (c) or (c, l) -> same, statistics per feature over (n[, l])
//   BatchNorm<Rank, BatchStats::per_replica>: each replica's own statistics (see below)
//   BatchNorm2dWith<BatchNormOptions{...}>, BatchNorm1dWith<...>, BatchNorm<Rank, Stats, Options>: the
//   options of PyTorch's BatchNorm2d(eps, momentum, affine, track_running_stats), today's values the
//   defaults (BatchNormOptions below).
// y = weight * (x - mean) / sqrt(var + eps) + bias. Parameters (affine): weight (c, initialised to 1),
// then bias (c, 0); without affine none (weight 1, bias 0). Statistics (model state, not trained;
// track_running_stats): running mean (c, 0), then running variance (c, 1), then with cumulative the
// batches tracked (1 float, 0). Training uses the batch's mean and biased variance, and moves the
// running estimates `momentum` of the way (cumulative: 1 / the batches tracked, this one included) to
// the batch's mean and unbiased variance; evaluation and prediction use the running estimates. Without
// track_running_stats there are no running estimates: evaluation uses the batch's statistics too (under
// DataParallel each replica's share: only training steps sum over replicas).
//
// Under DataParallel the batch is the global batch: each replica's per-channel sums are summed over
// the replicas (core/hook.hpp's sync points) in forward, and the two per-channel sums of backward
// likewise, so a model trains the same on any number of replicas (to float tolerance). With
// BatchStats::per_replica each replica normalises with its own share's statistics, as BatchNorm under
// PyTorch's DDP does: no collective in the step, but results then depend on the replica count, and
// the replicas' running estimates drift apart (replica 0's are the model's). One model alone
// normalises with its batch's statistics.
//
// In the reproducible mode each micro-shard normalises with its own samples' statistics (ghost batch
// normalisation: the shards are the same on any replica count). The running estimates then move once
// a step, toward the whole batch's mean and unbiased variance: each shard writes its per-channel sums
// (around the running mean, as averages over a full shard) to ForwardArgs::shard_sums, the model sums
// them exactly with the gradient, and update_statistics applies them.

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <type_traits>

#include "replica/backend/batch_norm_rules.hpp"
#include "replica/core/config.hpp"
#include "replica/core/error.hpp"
#include "replica/core/hook.hpp"
#include "replica/core/tensor.hpp"
#include "replica/layers/op.hpp"

namespace REPLICA_NAMESPACE::layers {

enum class BatchStats { global, per_replica };

namespace detail {
template <class In, std::size_t Rank>
constexpr bool batch_norm_accepts()
{
    if constexpr (Rank == 2) return In::rank == 3;
    else return In::rank == 1 || In::rank == 2;
}
} // namespace detail

// BatchNorm's options, PyTorch's BatchNorm2d(eps, momentum, affine, track_running_stats) arguments
// (momentum=None is cumulative = true). A structural type: a template argument of BatchNorm.
struct BatchNormOptions {
    float eps = 1e-5f;                 // added to the variance
    float momentum = 0.1f;             // how far the running estimates move toward each batch's
    bool cumulative = false;           // instead: their plain average over the batches seen
    bool affine = true;                // a weight and a bias per channel, trained
    bool track_running_stats = true;   // running estimates for evaluation; without: the batch's statistics

    friend constexpr bool operator==(const BatchNormOptions&, const BatchNormOptions&) = default;
};

template <std::size_t Rank, BatchStats Stats = BatchStats::global, BatchNormOptions Options = BatchNormOptions{}>
struct BatchNorm {
    static_assert(Rank == 1 || Rank == 2, "BatchNorm<Rank>: Rank is 1 (BatchNorm1d) or 2 (BatchNorm2d)");
    static_assert(Options.eps > 0.0f, "BatchNormOptions: eps must be > 0 (PyTorch's default is 1e-5)");
    static_assert(Options.momentum >= 0.0f && Options.momentum <= 1.0f,
                  "BatchNormOptions: momentum is the fraction of the way the running estimates move, in [0, 1]; "
                  "for their plain average set .cumulative = true");
    static_assert(!Options.cumulative || Options.track_running_stats,
                  "BatchNormOptions: cumulative averages the running estimates, which track_running_stats = false "
                  "turns off: set one of the two");
    static constexpr BatchNormOptions options = Options;
    static constexpr float eps = Options.eps;
    static constexpr float momentum = Options.momentum;
    static constexpr bool cumulative = Options.cumulative;
    static constexpr bool affine = Options.affine;
    static constexpr bool track_running_stats = Options.track_running_stats;

    template <class In, class T = float>
    struct op : LeafOp, FusesReluWithHook<op<In, T>, T> {
        static_assert(detail::batch_norm_accepts<In, Rank>(),
                      "BatchNorm2d needs a (channels, height, width) input and BatchNorm1d a (features) or "
                      "(channels, length) one: pick the one that matches the layer before it");
        using input_shape = In;
        using output_shape = In;
        static constexpr std::size_t C = In::dims[0], inner = In::size / C;
        static constexpr std::size_t param_count = affine ? 2 * C : 0;   // weight, bias
        static constexpr std::array param_blocks{core::ParamBlock{affine ? C : 0, core::ParamKind::scale},
                                                 core::ParamBlock{affine ? C : 0, core::ParamKind::shift}};
        // running mean, running variance[, batches tracked]
        static constexpr std::size_t statistics_count = track_running_stats ? 2 * C + (cumulative ? 1 : 0) : 0;
        static constexpr std::size_t syncs = Stats == BatchStats::global ? 2 : 0;   // forward's sums, backward's
        // ForwardArgs::addend joins the normalisation's pass; backward reads x, and y only through the
        // ReLU after an addend, whose gradient it then writes (backward_relu).
        static constexpr bool takes_addend = true;
        static constexpr bool writes_relu_gradient = true;
        // Options beyond the layout, for checkpoints' model signature (0: the defaults).
        static constexpr std::uint64_t options_signature =
            Options == BatchNormOptions{}
                ? 0
                : (std::uint64_t(std::bit_cast<std::uint32_t>(Options.eps)) << 32 |
                   std::uint64_t(std::bit_cast<std::uint32_t>(Options.momentum))) ^
                      (std::uint64_t(Options.cumulative) << 1 | std::uint64_t(Options.affine) << 2 |
                       std::uint64_t(Options.track_running_stats) << 3 | 1);

        explicit op(const Build& b) : LeafOp(b), first_sync_(b.first_sync) {}

        void init(float* p, std::uint64_t) const
        {
            if constexpr (affine)
                for (std::size_t c = 0; c < C; ++c) p[c] = 1.0f, p[C + c] = 0.0f;
        }
        template <class Ctx>
        std::size_t scratch_size(const Ctx& ctx, std::size_t) const { return batch_norm_scratch<T>(ctx, C); }
        void init_statistics(float* s) const
        {
            for (std::size_t c = 0; c < C; ++c) s[c] = 0.0f, s[C + c] = 1.0f;
            if constexpr (cumulative) s[2 * C] = 0.0f;
        }
        // The reproducible mode: the whole batch's mean and variance from the shards' exact sums.
        template <class Ctx>
        void update_statistics(Ctx& ctx, float* statistics, const float* sums, std::size_t batch, std::size_t shard)
        {
            batch_norm_step_statistics(ctx, sums, statistics, statistics + C, step_momentum(ctx, statistics),
                                       double(shard) / double(batch), double(batch * inner), C);
        }

        // A replica with no samples (model/chain.hpp): zero sums at both sync points; the running
        // estimates move as every replica's do.
        template <class Ctx, class Hook>
        void idle_forward(Ctx& ctx, float* statistics, Hook&& hook)
        {
            float* w = work(ctx);
            fill(ctx, w, 0.0f, 2 * C + 1);
            core::hook_sync(hook, w, 2 * C + 1, first_sync_);
            float* running = running_of(ctx, statistics);
            batch_norm_statistics(ctx, w, running, running + C, step_momentum(ctx, statistics), eps, w + 2 * C + 1,
                                  w + 3 * C + 1, C);
        }
        template <class Ctx, class Hook>
        void idle_backward(Ctx& ctx, Hook&& hook)
        {
            float* sums = work(ctx) + 4 * C + 1;
            fill(ctx, sums, 0.0f, 2 * C);
            core::hook_sync(hook, sums, 2 * C, first_sync_ + 1);
        }

        // The ReLU's backward inside the kernels (backend::ReluAfter): they read a.dy where the ReLU's
        // output > 0 and zero elsewhere, relu_backward's rule. Without an addend the mask is recomputed
        // from x, so a.y is not read, and dz is left unwritten (nothing reads it: model/chain.hpp).
        // After an addend (a Residual's shortcut) the sums read the mask from a.y and write the masked
        // gradient into dz, which the input gradient and the Residual's shortcut read.
        template <class Ctx, class Hook = core::NoHook>
        void backward_relu(Ctx& ctx, const Pass& pass, const BackwardArgs<T>& a, T* dz, Hook&& hook = {})
        {
            if (!added_) return run_backward(ctx, pass, a, a.dy, hook, {.weight = weight(ctx, a.params), .bias = bias(ctx, a.params)});
            if (dz == nullptr) throw std::logic_error("BatchNorm::backward_relu after an addend needs dz for the ReLU's gradient");
            run_backward(ctx, pass, a, a.dy, hook, {.y = a.y, .dz = dz});
        }

    private:
        friend FusesReluWithHook<op<In, T>, T>;

        // Ones and zeros in the op's memory, where an option leaves no parameter or statistic: the weight
        // and bias without affine, the centre of the sums and a running estimate that is only read
        // without track_running_stats, the increment of the batches tracked with cumulative.
        static constexpr bool has_constants = !affine || !track_running_stats || cumulative;
        // work_: [forward sums (2C + 1: sum of x - shift, of its square, the count) | mean (C) |
        // 1 / sqrt(var + eps) (C) | backward sums (2C) | with has_constants: ones (C) | zeros (C)], on the
        // op's device, made at its first call.
        template <class Ctx>
        float* work(Ctx& ctx)
        {
            if (work_.size() == 0) {
                work_ = ctx.template allocate<float>(6 * C + 1 + (has_constants ? 2 * C : 0));
                if constexpr (has_constants) {
                    fill(ctx, work_.data() + 6 * C + 1, 1.0f, C);
                    fill(ctx, work_.data() + 7 * C + 1, 0.0f, C);
                }
            }
            return work_.data();
        }
        template <class Ctx>
        float* ones(Ctx& ctx) { return work(ctx) + 6 * C + 1; }
        template <class Ctx>
        float* zeros(Ctx& ctx) { return work(ctx) + 7 * C + 1; }
        template <class Ctx>
        const float* weight(Ctx& ctx, const float* params)
        {
            if constexpr (affine) return params;
            else return ones(ctx);
        }
        template <class Ctx>
        const float* bias(Ctx& ctx, const float* params)
        {
            if constexpr (affine) return params + C;
            else return zeros(ctx);
        }
        // The running mean and variance (2C floats), or without track_running_stats zeros that are only
        // read (the statistics then move by nothing: step_momentum).
        template <class Ctx>
        float* running_of(Ctx& ctx, float* statistics)
        {
            if constexpr (track_running_stats) return statistics;
            else return zeros(ctx);
        }
        // The momentum of a step's move of the running estimates; with cumulative, counts the batch.
        template <class Ctx>
        backend::Momentum step_momentum(Ctx& ctx, float* statistics)
        {
            if constexpr (!track_running_stats) return {};
            else if constexpr (cumulative) {
                add(ctx, static_cast<const float*>(ones(ctx)), statistics + 2 * C, 1);
                return {0.0f, statistics + 2 * C};
            } else {
                return momentum;
            }
        }

        template <class Ctx, class Hook>
        void run_forward(Ctx& ctx, const Pass& pass, const ForwardArgs<T>& a, Hook& hook, bool relu)
        {
            float* w = work(ctx);
            float* sums = w;
            float* mean = w + 2 * C + 1;
            float* invstd = mean + C;
            float* running = running_of(ctx, a.statistics);
            if (!pass.training && track_running_stats) {
                batch_norm_running(ctx, running, running + C, eps, mean, invstd, C);
            } else if (!pass.training) {   // the batch's statistics, this replica's share of it
                batch_norm_sums(ctx, a.x, a.n, C, inner, running, sums, a.scratch,
                                {.running_mean = running, .running_var = running + C, .momentum = {}, .eps = eps,
                                 .mean = mean, .invstd = invstd});
            } else {
                // Sums around the running mean (the same on every replica): less cancellation in the
                // variance than raw sums of squares. Where no other replica's sums are added to these,
                // the statistics come with them (the backend's last pass of the sums).
                constexpr bool synced = Stats == BatchStats::global && core::SyncingHook<Hook>;
                const bool shard = pass.micro_shard > 0;
                if (shard || !synced) {   // a micro-shard's running estimates stay as they are until update_statistics
                    batch_norm_sums(ctx, a.x, a.n, C, inner, running, sums, a.scratch,
                                    {.running_mean = running, .running_var = running + C,
                                     .momentum = shard ? backend::Momentum{} : step_momentum(ctx, a.statistics),
                                     .eps = eps, .mean = mean, .invstd = invstd});
                    if (shard && statistics_count > 0) {
                        if (a.shard_sums == nullptr)
                            throw Error("BatchNorm: a micro-shard's forward needs ForwardArgs::shard_sums (statistics_count floats)");
                        batch_norm_shard_sums(ctx, sums, a.shard_sums, 1.0f / float(pass.micro_shard * inner), C);
                        if constexpr (cumulative) fill(ctx, a.shard_sums + 2 * C, 0.0f, 1);   // counted by update_statistics
                    }
                } else {
                    batch_norm_sums(ctx, a.x, a.n, C, inner, running, sums, a.scratch);
                    core::hook_sync(hook, sums, 2 * C + 1, first_sync_);
                    batch_norm_statistics(ctx, sums, running, running + C, step_momentum(ctx, a.statistics), eps, mean,
                                          invstd, C);
                }
            }
            added_ = a.addend != nullptr;
            batch_norm_apply(ctx, a.x, a.y, a.n, C, inner, weight(ctx, a.params), bias(ctx, a.params), mean, invstd, relu,
                             a.addend);
        }

        template <class Ctx, class Hook>
        void run_backward(Ctx& ctx, const Pass&, const BackwardArgs<T>& a, const T* dy, Hook& hook,
                          backend::ReluAfter<T> relu = {})
        {
            float* w = work(ctx);
            const float* count = w + 2 * C;
            const float* mean = w + 2 * C + 1;
            const float* invstd = mean + C;
            float* sums = w + 4 * C + 1;
            // [sum dy * xhat | sum dy] over this replica's samples: with affine the parameter gradients,
            // a.dparams, else in sums (dy through the ReLU's mask when relu; read from y, the masked dy is
            // written to relu.dz, and the input gradient reads that).
            float* local = affine ? a.dparams : sums;
            batch_norm_backward_sums(ctx, a.x, dy, a.n, C, inner, mean, invstd, local, a.scratch, relu);
            if (relu.from_y()) dy = relu.dz, relu = {};
            const float* global = local;
            // Every replica takes part in the sync, whether it needs the input gradient or not.
            if constexpr (Stats == BatchStats::global && core::SyncingHook<std::remove_cvref_t<Hook>>) {
                if constexpr (affine) copy(ctx, static_cast<const float*>(local), sums, 2 * C);
                core::hook_sync(hook, sums, 2 * C, first_sync_ + 1);
                global = sums;
            }
            if (a.dx == nullptr) return;
            batch_norm_backward_input(ctx, a.x, dy, a.dx, a.n, C, inner, weight(ctx, a.params), mean, invstd, global,
                                      count, relu);
        }

        std::size_t first_sync_;
        bool added_ = false;   // the last forward added an addend
        core::Buffer<float> work_;
    };
};

using BatchNorm1d = BatchNorm<1>;
using BatchNorm2d = BatchNorm<2>;
// BatchNorm with options: BatchNorm2dWith<BatchNormOptions{.eps = 1e-3f, .momentum = 0.01f, .affine = false}>.
template <BatchNormOptions Options>
using BatchNorm1dWith = BatchNorm<1, BatchStats::global, Options>;
template <BatchNormOptions Options>
using BatchNorm2dWith = BatchNorm<2, BatchStats::global, Options>;

} // namespace replica::layers

namespace REPLICA_NAMESPACE {
using layers::BatchNorm;
using layers::BatchNorm1d;
using layers::BatchNorm1dWith;
using layers::BatchNorm2d;
using layers::BatchNorm2dWith;
using layers::BatchNormOptions;
using layers::BatchStats;
} // namespace replica
