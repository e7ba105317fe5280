#pragma once
// The reproducible mode's gradient, a strategy a model holds beside its storage.
//
// Samples [0, n) are cut into micro-shards of `shard` samples, numbered from first_shard; each shard's
// gradient is computed on its own and added, in fixed point (core/fixed_point.hpp), to an exact
// accumulator that starts from zero. So the sum depends on the shard size, never on how many replicas
// share the shards or in which order their accumulators are summed (integers: exactly). Shard
// gradients go to rows of a stash (up to kStashRows, within kStashBytes) and a full stash, or the
// last shard, is added in one pass (add_fixed_rows: the integers of one add_fixed a shard, with the
// accumulator read once a stash rather than once a shard). Every kernel
// is deterministic from the first call on (on a GPU: the libraries' deterministic choices, kept
// afterwards). The shards run as one step does (backend/step_run.hpp): on a GPU replayed from a CUDA
// graph, keyed by batch and shard size.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "replica/backend/backend.hpp"
#include "replica/core/config.hpp"
#include "replica/core/hook.hpp"
#include "replica/core/loss_slot.hpp"
#include "replica/core/tensor.hpp"
#include "replica/model/concepts.hpp"

namespace REPLICA_NAMESPACE::model {

template <class E, std::size_t InputSize, std::size_t LabelSize>
class ExactGradient {
public:
    // Shard gradients a stash holds at most, and its size at most: a larger model adds each shard's
    // gradient on its own (one row).
    static constexpr std::size_t kStashRows = 8, kStashBytes = std::size_t{64} << 20;
    // A stash row's floats are a multiple of this (256 bytes): every row starts as aligned as
    // `gradient`, so that a shard's kernels (the libraries' choices, which look at alignment) and so its
    // bits do not depend on which row it lands in, which depends on how many shards a replica runs.
    static constexpr std::size_t kRowAlign = 64;

    // Queues the shards of n samples (host memory) on ctx and returns the accumulator (ctx's memory,
    // `count` integers: the gradient and whatever else the shards sum) for the replicas' exact
    // all-reduce. reserve(m) makes room for the activations of m samples; queue_shard(pass, x, labels,
    // m, loss_slot, into) queues forward, loss and backward of m samples already in ctx's memory,
    // ASSIGNING `into` (count floats of ctx's memory: `gradient` or a row of the stash).
    template <class Ctx, class Reserve, class QueueShard>
    std::int64_t* queue(Ctx& ctx, const Pass& pass, const E* x, const std::int32_t* labels, std::size_t n,
                        std::size_t shard, std::size_t first_shard, float* gradient, std::size_t count,
                        bool capturable, Reserve&& reserve, QueueShard&& queue_shard)
    {
        const std::size_t shards = (n + shard - 1) / shard;
        first_shard_ = first_shard;
        shard_count_ = shards;
        make_deterministic(ctx);
        if (exact_.size() != count) exact_ = ctx.template allocate<std::int64_t>(count);
        if (slots_.size() < shards) {
            ctx.synchronize();
            if constexpr (!Ctx::host_visible) ctx.drop_graphs();   // they write the slots
            slots_ = backend::host_buffer<core::LossSlot>(shards);
        }
        const std::size_t stride = (count + kRowAlign - 1) / kRowAlign * kRowAlign;
        const std::size_t rows = std::min(shards, stash_rows(stride));
        if (rows > 1 && stash_.size() < rows * stride) {
            ctx.synchronize();
            if constexpr (!Ctx::host_visible) ctx.drop_graphs();   // they write the stash
            stash_ = ctx.template allocate<float>(rows * stride);
            fill(ctx, stash_.data(), 0.0f, rows * stride);
        }
        for (std::size_t k = 0; k < shards; ++k) slots_[k] = {};
        reserve(std::min(shard, n));   // activations for one shard
        const auto [xd, ld] = stage(ctx, x, labels, n);
        auto work = [&](bool captured, auto&&) {
            zero_fixed(ctx, exact_.data(), count);
            for (std::size_t k = 0; k < shards; ++k) {
                const std::size_t begin = k * shard, m = std::min(shard, n - begin);
                Pass mine = captured ? Pass{.seed = pass.seed, .first_sample = 0, .training = pass.training} : pass;
                mine.first_sample += begin;
                mine.micro_shard = shard;
                if (rows <= 1) {
                    queue_shard(mine, xd + begin * InputSize, ld + begin * LabelSize, m, &slots_[k], gradient);
                    add_fixed(ctx, static_cast<const float*>(gradient), exact_.data(), count);
                    continue;
                }
                const std::size_t row = k % rows;
                queue_shard(mine, xd + begin * InputSize, ld + begin * LabelSize, m, &slots_[k], stash_.data() + row * stride);
                if (row + 1 == rows || k + 1 == shards)
                    add_fixed_rows(ctx, static_cast<const float*>(stash_.data()), row + 1, stride, exact_.data(), count);
            }
        };
        core::NoHook none;
        // Negative keys are the shards' (0 and 1 are the steps'); step parameters in slot 0.
        execute_step(ctx,
                     backend::StepRun{.seed = pass.seed, .first_sample = pass.first_sample, .n = n,
                                      .key = -1 - int(std::min<std::size_t>(shard, 1 << 30)), .params_slot = 0,
                                      .capturable = capturable},
                     work, none);
        return exact_.data();
    }

    // Waits for the shards and writes each one's loss, loss_of(slot), to losses[shard number].
    template <class Ctx, class LossOf>
    void finish(Ctx& ctx, double* losses, LossOf&& loss_of)
    {
        ctx.synchronize();
        check_fixed(ctx);
        for (std::size_t k = 0; k < shard_count_; ++k) losses[first_shard_ + k] = loss_of(slots_[k]);
    }

    // The gradient (count floats) from the accumulator, once the replicas' accumulators are summed.
    template <class Ctx>
    void write_gradient(Ctx& ctx, float* gradient, std::size_t count)
    {
        fixed_to_float(ctx, exact_.data(), gradient, count);
    }

private:
    static constexpr std::size_t stash_rows(std::size_t stride)
    {
        return std::clamp<std::size_t>(kStashBytes / (sizeof(float) * std::max<std::size_t>(stride, 1)), 1, kStashRows);
    }

    // The n samples in the context's memory, all at once (the shards then read them where they are:
    // a graph of the shards holds no copy from host memory).
    template <class Ctx>
    std::pair<const E*, const std::int32_t*> stage(Ctx& ctx, const E* x, const std::int32_t* labels, std::size_t n)
    {
        if constexpr (Ctx::host_visible) {
            return {x, labels};
        } else {
            if (inputs_.size() < n * InputSize) {
                ctx.synchronize();
                ctx.drop_graphs();   // they read the old buffers
                inputs_ = ctx.template allocate<E>(n * InputSize);
                labels_ = ctx.template allocate<std::int32_t>(n * LabelSize);
            }
            ctx.stage(x, inputs_.data(), n * InputSize);
            ctx.stage(labels, labels_.data(), n * LabelSize);
            return {inputs_.data(), labels_.data()};
        }
    }

    core::Buffer<std::int64_t> exact_;
    core::Buffer<float> stash_;   // rows of `stride` floats (count, then padding): shard gradients not yet added
    core::Buffer<core::LossSlot> slots_;   // page-locked, one loss slot per shard
    core::Buffer<E> inputs_;
    core::Buffer<std::int32_t> labels_;
    std::size_t first_shard_ = 0, shard_count_ = 0;
};

} // namespace replica::model
