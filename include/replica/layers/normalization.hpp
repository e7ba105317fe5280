#pragma once
// Batch normalisation, PyTorch's semantics.
//   BatchNorm2d   (c, h, w) -> (c, h, w), statistics per channel over (n, h, w)
//   BatchNorm1d   (c) or (c, l) -> same, statistics per feature over (n[, l])
//   BatchNorm<Rank, BatchStats::per_replica>: each replica's own statistics (see below)
// y = weight * (x - mean) / sqrt(var + 1e-5) + bias. Parameters: weight (c, initialised to 1), then
// bias (c, 0). Statistics (model state, not trained): running mean (c, 0), then running variance
// (c, 1). Training uses the batch's mean and biased variance, and moves the running estimates
// 0.1 of the way to the batch's mean and unbiased variance; evaluation and prediction use the
// running estimates.
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

template <std::size_t Rank, BatchStats Stats = BatchStats::global>
struct BatchNorm {
    static_assert(Rank == 1 || Rank == 2, "BatchNorm<Rank>: Rank is 1 (BatchNorm1d) or 2 (BatchNorm2d)");
    static constexpr float eps = 1e-5f;
    static constexpr float momentum = 0.1f;

    template <class In, class T = float>
    struct op : LeafOp, FusesReluWithHook<op<In, T>, T> {
        static_assert(detail::batch_norm_accepts<In, Rank>(),
                      "BatchNorm2d needs a (channels, height, width) input and BatchNorm1d a (features) or "
                      "(channels, length) one: pick the one that matches the layer before it");
        using input_shape = In;
        using output_shape = In;
        static constexpr std::size_t C = In::dims[0], inner = In::size / C;
        static constexpr std::size_t param_count = 2 * C;        // weight, bias
        static constexpr std::size_t statistics_count = 2 * C;   // running mean, running variance
        static constexpr std::size_t syncs = Stats == BatchStats::global ? 2 : 0;   // forward's sums, backward's
        // ForwardArgs::addend joins the normalisation's pass; backward reads x, and y only through the
        // ReLU after an addend, whose gradient it then writes (backward_relu).
        static constexpr bool takes_addend = true;
        static constexpr bool writes_relu_gradient = true;

        explicit op(const Build& b) : LeafOp(b), first_sync_(b.first_sync) {}

        void init(float* p, std::uint64_t) const
        {
            for (std::size_t c = 0; c < C; ++c) p[c] = 1.0f, p[C + c] = 0.0f;
        }
        template <class Ctx>
        std::size_t scratch_size(const Ctx& ctx, std::size_t) const { return batch_norm_scratch<T>(ctx, C); }
        void init_statistics(float* s) const
        {
            for (std::size_t c = 0; c < C; ++c) s[c] = 0.0f, s[C + c] = 1.0f;
        }
        // The reproducible mode: the whole batch's mean and variance from the shards' exact sums.
        template <class Ctx>
        void update_statistics(Ctx& ctx, float* statistics, const float* sums, std::size_t batch, std::size_t shard)
        {
            batch_norm_step_statistics(ctx, sums, statistics, statistics + C, momentum, double(shard) / double(batch),
                                       double(batch * inner), C);
        }

        // A replica with no samples (model/chain.hpp): zero sums at both sync points; the running
        // estimates move as every replica's do.
        template <class Ctx, class Hook>
        void idle_forward(Ctx& ctx, float* statistics, Hook&& hook)
        {
            float* w = work(ctx);
            fill(ctx, w, 0.0f, 2 * C + 1);
            core::hook_sync(hook, w, 2 * C + 1, first_sync_);
            batch_norm_statistics(ctx, w, statistics, statistics + C, momentum, eps, w + 2 * C + 1, w + 3 * C + 1, C);
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
            if (!added_) return run_backward(ctx, pass, a, a.dy, hook, {.weight = a.params, .bias = a.params + C});
            if (dz == nullptr) throw std::logic_error("BatchNorm::backward_relu after an addend needs dz for the ReLU's gradient");
            run_backward(ctx, pass, a, a.dy, hook, {.y = a.y, .dz = dz});
        }

    private:
        friend FusesReluWithHook<op<In, T>, T>;

        // work_: [forward sums (2C + 1: sum of x - shift, of its square, the count) | mean (C) |
        // 1 / sqrt(var + eps) (C) | backward sums (2C)], on the op's device, made at its first call.
        template <class Ctx>
        float* work(Ctx& ctx)
        {
            if (work_.size() == 0) work_ = ctx.template allocate<float>(6 * C + 1);
            return work_.data();
        }

        template <class Ctx, class Hook>
        void run_forward(Ctx& ctx, const Pass& pass, const ForwardArgs<T>& a, Hook& hook, bool relu)
        {
            float* w = work(ctx);
            float* sums = w;
            float* mean = w + 2 * C + 1;
            float* invstd = mean + C;
            float* running = a.statistics;
            if (!pass.training) {
                batch_norm_running(ctx, running, running + C, eps, mean, invstd, C);
            } else {
                // Sums around the running mean (the same on every replica): less cancellation in the
                // variance than raw sums of squares. Where no other replica's sums are added to these,
                // the statistics come with them (the backend's last pass of the sums).
                constexpr bool synced = Stats == BatchStats::global && core::SyncingHook<Hook>;
                const bool shard = pass.micro_shard > 0;
                if (shard || !synced) {   // a micro-shard's running estimates stay as they are until update_statistics
                    batch_norm_sums(ctx, a.x, a.n, C, inner, running, sums, a.scratch,
                                    {.running_mean = running, .running_var = running + C, .momentum = shard ? 0.0f : momentum,
                                     .eps = eps, .mean = mean, .invstd = invstd});
                    if (shard) {
                        if (a.shard_sums == nullptr)
                            throw Error("BatchNorm: a micro-shard's forward needs ForwardArgs::shard_sums (statistics_count floats)");
                        batch_norm_shard_sums(ctx, sums, a.shard_sums, 1.0f / float(pass.micro_shard * inner), C);
                    }
                } else {
                    batch_norm_sums(ctx, a.x, a.n, C, inner, running, sums, a.scratch);
                    core::hook_sync(hook, sums, 2 * C + 1, first_sync_);
                    batch_norm_statistics(ctx, sums, running, running + C, momentum, eps, mean, invstd, C);
                }
            }
            added_ = a.addend != nullptr;
            batch_norm_apply(ctx, a.x, a.y, a.n, C, inner, a.params, a.params + C, mean, invstd, relu, a.addend);
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
            // dparams = [sum dy * xhat | sum dy] over this replica's samples: the parameter gradients
            // (dy through the ReLU's mask when relu; read from y, the masked dy is written to relu.dz,
            // and the input gradient reads that).
            batch_norm_backward_sums(ctx, a.x, dy, a.n, C, inner, mean, invstd, a.dparams, a.scratch, relu);
            if (relu.from_y()) dy = relu.dz, relu = {};
            const float* global = a.dparams;
            // Every replica takes part in the sync, whether it needs the input gradient or not.
            if constexpr (Stats == BatchStats::global && core::SyncingHook<std::remove_cvref_t<Hook>>) {
                copy(ctx, a.dparams, sums, 2 * C);
                core::hook_sync(hook, sums, 2 * C, first_sync_ + 1);
                global = sums;
            }
            if (a.dx == nullptr) return;
            batch_norm_backward_input(ctx, a.x, dy, a.dx, a.n, C, inner, a.params, mean, invstd, global, count, relu);
        }

        std::size_t first_sync_;
        bool added_ = false;   // the last forward added an addend
        core::Buffer<float> work_;
    };
};

using BatchNorm1d = BatchNorm<1>;
using BatchNorm2d = BatchNorm<2>;

} // namespace replica::layers

namespace REPLICA_NAMESPACE {
using layers::BatchNorm;
using layers::BatchNorm1d;
using layers::BatchNorm2d;
using layers::BatchStats;
} // namespace replica
