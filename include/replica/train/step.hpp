#pragma once
// One training step and the small verbs around it. They work on any model: a Sequential, a
// DataParallel, or whatever auto_parallel returned.
//
//   float loss = train_step(model, opt, batch);   // forward, loss, backward, all-reduce, update
//   std::vector<float> w = parameters(model);     // host copy of the flat parameter vector

#include <algorithm>
#include <cstddef>
#include <limits>
#include <type_traits>
#include <vector>

#include "replica/core/config.hpp"
#include "replica/core/fixed_point.hpp"
#include "replica/data/dataset.hpp"
#include "replica/model/concepts.hpp"
#include "replica/model/input.hpp"

namespace REPLICA_NAMESPACE::train {

struct StepOptions {
    // Bit-identical results on any number of replicas and across runs: the batch is cut into
    // micro-shards of `micro_shard` samples whatever the device count, each shard's gradient is
    // computed on its own, and shard gradients are summed exactly (64-bit fixed point), so neither
    // the replica count nor the reduction order changes a bit. Costs speed (small GEMMs per shard).
    // CPU and GPU replicas (on a GPU: deterministic cuDNN algorithms from then on); a nested
    // DataParallel runs each shard on its first device.
    bool reproducible = false;
    // Samples per micro-shard; 0: default_micro_shard(the batch's size, max_replicas).
    std::size_t micro_shard = 0;
    // The most replicas the default micro-shard keeps busy: it cuts the batch into this many shards.
    // A property of the run, not of the model it runs on (the replica count must not change a bit), so
    // more replicas than this leave some without a shard: set it to the largest device count the run
    // is meant to be reproduced on.
    std::size_t max_replicas = 8;
};

// The reproducible mode's micro-shard when none is given: a batch of n samples cut into max_replicas
// shards, ceil(n / max_replicas) samples each (the last smaller; fewer shards when they do not divide
// n). A function of n and max_replicas alone, so every device count runs the same shards. As few and as
// large as max_replicas devices allow, because each shard costs a pass over the gradient (its fixed-point
// conversion) and runs its layers on a smaller batch; max_replicas of them keep that many devices
// busy, and the counts that divide it (1, 2, 4 of 8) evenly when it divides n.
inline std::size_t default_micro_shard(std::size_t n, std::size_t max_replicas)
{
    core::require(max_replicas > 0, "StepOptions::max_replicas must be at least 1: the default micro-shard cuts the "
                                    "batch into that many shards");
    return std::max<std::size_t>(1, (n + max_replicas - 1) / max_replicas);
}

// The micro-shard a reproducible step of n samples runs with under `options`.
inline std::size_t micro_shard_of(const StepOptions& options, std::size_t n)
{
    return options.micro_shard > 0 ? options.micro_shard : default_micro_shard(n, options.max_replicas);
}

// Mean loss over the batch (every labelled element of it), computed before the update. `next`, the
// batch the following call will train on (its memory unchanged until that call returns), lets the
// model queue that step's forward and backward (and its input's copy to each GPU) behind this
// step's update, before it waits for this step's loss (the fast mode): the GPUs then go from one step
// to the next without waiting for the host. If the following call trains on other data, or the
// parameters are set in between, that work is dropped and the step is computed again.
//
// An optimizer that counts its updates (Adam, AdamW: a begin_update() member) is told of this one
// once the batch has passed its checks, before the model applies it (train/adam.hpp); such an
// optimizer must be passed non-const.
//
// A LossScale (train/loss_scale.hpp) multiplies the loss by its scale and is told, after the model's
// update, to count a skip and move the scale (end_update()). In the reproducible mode a scaled
// gradient term outside the exact sum's range (core/fixed_point.hpp) counts as an overflow: the
// update is skipped, and since the shards' losses were not read, the step's loss is NaN.
//
// The batch holds what the model reads (M::input_element): floats, or token ids in a TokenBatch;
// ids are checked against the model's vocabulary, as labels against its classes, before anything is
// queued.
template <class M, class Opt, class E>
float train_step(M& model, Opt&& opt, const data::BatchOf<E>& batch, const StepOptions& options = {},
                 const std::type_identity_t<data::BatchOf<E>>* next = nullptr)
{
    static_assert(model::check_input_element<typename M::input_element, E>());
    using R = typename model::replica_of<M>::type;
    core::require(batch.size > 0, "train_step: the batch is empty");
    const std::size_t shard = options.reproducible ? micro_shard_of(options, batch.size) : 0;
    using loss = typename M::loss;
    R::check_inputs(batch.inputs, batch.size);   // before anything is queued
    loss::template check_labels<typename M::output_shape>(batch.labels, batch.size);
    using O = std::remove_cvref_t<Opt>;
    if constexpr (requires(O& o) { o.begin_update(); }) {
        static_assert(!std::is_const_v<std::remove_reference_t<Opt>>,
                      "this optimizer counts its updates (Adam, AdamW): pass it to train_step as a non-const object");
        opt.begin_update();
    }
    constexpr bool scales_loss = requires(const O& o) { o.loss_scale(); };
    double scale = 1.0;   // a power of two times 1 / elements is exact: the unscaled gradient is not changed
    if constexpr (scales_loss) scale = double(opt.loss_scale());
    const double elements = double(batch.size) * double(M::label_size);
    const model::Pass pass{.seed = batch.seed, .first_sample = batch.first_sample, .training = true};
    double loss_sum = 0.0;
    if (options.reproducible) {
        if constexpr (scales_loss) {
            try {
                loss_sum = model.reproducible_forward_backward(pass, batch.inputs, batch.labels, batch.size,
                                                               float(scale / elements), shard);
            } catch (const core::FixedRangeError&) {
                if (!opt.enabled()) throw;
                opt.note_non_finite();
                loss_sum = std::numeric_limits<double>::quiet_NaN();
            }
        } else {
            loss_sum = model.reproducible_forward_backward(pass, batch.inputs, batch.labels, batch.size,
                                                           float(1.0 / elements), shard);
        }
        model.update(opt);
    } else {
        auto input = [scale](const data::BatchOf<E>& b) {
            return model::StepInput<E>{model::Pass{.seed = b.seed, .first_sample = b.first_sample, .training = true},
                                    b.inputs, b.labels, b.size, float(scale / (double(b.size) * double(M::label_size)))};
        };
        // A next batch with a bad label or id is not queued ahead: the call that trains on it throws.
        const bool queue_next = next != nullptr && next->size > 0 &&
                                loss::template first_bad_label<typename M::output_shape>(next->labels, next->size) ==
                                    next->size * M::label_size &&
                                R::inputs_valid(next->inputs, next->size);
        const model::StepInput<E> ahead = queue_next ? input(*next) : model::StepInput<E>{};
        loss_sum = model.step(input(batch), opt, queue_next ? &ahead : nullptr);
    }
    if constexpr (scales_loss) opt.end_update();
    return float(loss_sum / elements);
}

template <class M>
std::vector<float> parameters(const M& model) { return model.parameters(); }

// Outputs (logits) for n samples: n * M::output_shape::size floats.
template <class M, class E>
std::vector<float> predict(M& model, const E* inputs, std::size_t n)
{
    static_assert(model::check_input_element<typename M::input_element, E>());
    std::vector<float> out(n * M::output_shape::size);
    model.predict(inputs, n, out.data());
    return out;
}

struct Metrics {
    double loss = 0.0;       // mean over labelled elements
    double accuracy = 0.0;   // fraction of labelled elements predicted right
};

// Loss and accuracy over a whole data set, in chunks of batch_size, dropout off.
template <class M, class E>
Metrics evaluate(M& model, const data::DatasetOf<E>& set, std::size_t batch_size = 1000)
{
    static_assert(model::check_input_element<typename M::input_element, E>());
    core::require(set.count > 0, "evaluate: the data set is empty");
    double loss = 0.0;
    std::size_t correct = 0;
    for (std::size_t begin = 0; begin < set.count; begin += batch_size) {
        const std::size_t n = std::min(batch_size, set.count - begin);
        auto e = model.evaluate(set.inputs.data() + begin * set.input_size, set.labels.data() + begin * set.label_size, n);
        loss += e.loss_sum;
        correct += e.correct;
    }
    const double elements = double(set.count) * double(set.label_size);
    return {loss / elements, double(correct) / elements};
}

} // namespace replica::train

namespace REPLICA_NAMESPACE {
using train::default_micro_shard;
using train::evaluate;
using train::Metrics;
using train::parameters;
using train::predict;
using train::StepOptions;
using train::train_step;
} // namespace replica
