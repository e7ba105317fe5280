#pragma once
// Trainer: epochs over a data set, validation, checkpoints, progress and history.
//
//   Trainer trainer{model, opt, {.batch_size = 64, .epochs = 10, .scaling = Scaling::strong,
//                                .validate_every = 1, .seed = 1, .checkpoint = "lenet.ckpt"}};
//   History history = trainer.fit(train_set, test_set);
//
// Batch size: with Scaling::strong (default) batch_size is the GLOBAL batch, split over the model's
// replicas; with Scaling::weak it is PER REPLICA (global batch = replicas x batch_size), and
// scale_lr multiplies the learning rate by the replica count. An epoch is one pass over the data set
// in either case: ceil(samples / global batch) steps.
//
// Nothing non-finite passes silently. The data sets are checked for NaN and infinite inputs once, in
// fit(). The loss of every step is checked: a NaN or infinite loss stops training with an Error naming
// the step, the epoch and the likely causes, and the last checkpoint stays as it was; with
// skip_nonfinite such a step is undone instead (parameters and optimizer state as before it) and
// counted in History::skipped_steps. The parameters are checked at the end of every epoch (ReLU can
// hide a NaN from the loss), and save_checkpoint refuses non-finite values.
//
// Loss scaling (train/loss_scale.hpp): TrainOptions::loss_scale wraps the optimizer in a LossScale for
// the run (or pass a LossScale as the optimizer). Its skips are not divergence: each epoch's record
// counts them and holds the scale, the epoch's line shows both, and checkpoints keep its state.

#include <chrono>
#include <string>
#include <vector>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <optional>
#include <utility>

#include "replica/core/checked.hpp"
#include "replica/core/config.hpp"
#include "replica/data/dataset.hpp"
#include "replica/data/loader.hpp"
#include "replica/data/source.hpp"
#include "replica/parallel/communicator.hpp"
#include "replica/parallel/scaling.hpp"
#include "replica/train/checkpoint.hpp"
#include "replica/train/history.hpp"
#include "replica/train/loss_scale.hpp"
#include "replica/train/progress.hpp"
#include "replica/train/schedule.hpp"
#include "replica/train/step.hpp"

namespace REPLICA_NAMESPACE::train {

struct TrainOptions {
    std::size_t batch_size = 64;
    std::size_t epochs = 10;
    parallel::Scaling scaling = parallel::Scaling::strong;
    bool scale_lr = false;                  // weak scaling only: lr x replicas
    std::size_t validate_every = 1;         // epochs; 0: never
    std::uint64_t seed = 1;                 // shuffling and dropout
    std::filesystem::path checkpoint = {};  // empty: no checkpoints
    std::size_t checkpoint_every = 1;       // epochs
    bool resume = false;                    // continue from `checkpoint` when it exists
    Schedule schedule = Schedule::fixed();
    bool reproducible = false;              // bit-identical on any replica count (see StepOptions)
    bool skip_nonfinite = false;            // undo and skip a step whose loss is NaN or infinite, instead of
                                            // stopping; costs a host copy of parameters and optimizer state per step
    std::size_t micro_shard = 0;            // samples per micro-shard in reproducible mode; 0: each batch
                                            // cut into max_replicas shards (default_micro_shard)
    std::size_t max_replicas = 8;           // see StepOptions
    bool progress = true;                   // live line on a terminal
    std::ostream* log = &std::cout;         // one line per epoch; null: silent
    // The History written while training (HistoryWriter: CSV a line per record, JSON after every
    // epoch); empty: not written. history_every N > 0 adds a record every N steps.
    std::filesystem::path history_csv = {};
    std::filesystem::path history_json = {};
    std::size_t history_every = 0;
    // Dynamic loss scaling of the optimizer (train/loss_scale.hpp); empty: none, unless the optimizer
    // is a LossScale itself (then this must stay empty).
    std::optional<LossScaleOptions> loss_scale = {};
};

namespace detail {
template <class Opt>
inline constexpr bool is_loss_scale = false;
template <class Opt>
inline constexpr bool is_loss_scale<LossScale<Opt>> = true;
} // namespace detail

template <class M, class Opt>
class Trainer {
public:
    // With several processes only rank 0 writes checkpoints and logs; every rank reads checkpoints.
    Trainer(M& model, Opt& opt, TrainOptions options) : model_(model), opt_(opt), options_(std::move(options))
    {
        if (model_.process_rank() != 0) {
            options_.log = nullptr;
            options_.progress = false;
        }
        core::require(options_.batch_size > 0, "batch size must be at least 1");
        core::require(options_.epochs > 0, "epochs must be at least 1: a run of 0 epochs trains nothing");
        core::require(options_.checkpoint_every > 0, "checkpoint_every must be at least 1 epoch");
        core::require(!options_.resume || !options_.checkpoint.empty(), "resume needs a checkpoint path");
        if constexpr (requires { model_.gradient_reduction(); })
            if (options_.reproducible) parallel::check_reproducible_reduction(model_.gradient_reduction());
    }

    std::size_t global_batch() const
    {
        return options_.scaling == parallel::Scaling::weak
                   ? core::checked_mul(options_.batch_size, replicas(), "the global batch (batch size x replicas)")
                   : options_.batch_size;
    }

    // `train_set`: a Dataset, or a SampleSource (images decoded and augmented as the loader reads them);
    // for a model of token ids (Input<Tokens<T>>), a TokenDataset or TokenSampleSource, and the
    // validation set a TokenDataset.
    template <class Train, class Validation = data::DatasetOf<typename M::input_element>>
    History fit(const Train& train_set, const Validation& validation_set = {})
    {
        static_assert(model::check_input_element<typename M::input_element, typename Train::element>());
        static_assert(model::check_input_element<typename M::input_element, typename Validation::element>());
        return fit_source(data::SampleSourceOf<typename M::input_element>(train_set), validation_set);
    }

private:
    using Source = data::SampleSourceOf<typename M::input_element>;
    using ValidationSet = data::DatasetOf<typename M::input_element>;

    StepOptions step_options() const
    {
        return {.reproducible = options_.reproducible, .micro_shard = options_.micro_shard, .max_replicas = options_.max_replicas};
    }

    History fit_source(const Source& train_set, const ValidationSet& validation_set)
    {
        if constexpr (detail::is_loss_scale<Opt>) {
            core::require(!options_.loss_scale, "TrainOptions::loss_scale is set, but the optimizer is a LossScale "
                                                "already: set the options in one place");
        } else if (options_.loss_scale) {
            LossScale<Opt&> scaled(opt_, *options_.loss_scale);
            return fit_with(scaled, train_set, validation_set);
        }
        return fit_with(opt_, train_set, validation_set);
    }

    template <class O>
    History fit_with(O& opt, const Source& train_set, const ValidationSet& validation_set)
    {
        check_fits(train_set, "training");
        if (validation_set.count) check_fits(validation_set, "validation");
        core::require(train_set.count > 0, "the training set is empty");
        const std::size_t batch = global_batch();
        core::require(batch <= train_set.count,
                      "the global batch of " + std::to_string(batch) + " samples is larger than the training set's " +
                          std::to_string(train_set.count) + ": use a batch size of at most " +
                          std::to_string(options_.scaling == parallel::Scaling::weak ? train_set.count / replicas()
                                                                                     : train_set.count) +
                          (options_.scaling == parallel::Scaling::weak ? " per replica" : ""));
        if (validation_set.count) validation_set.check_finite("the validation set");
        data::LoaderOf<typename M::input_element> loader(train_set, batch, options_.seed, /*shuffle=*/true);   // checks the training set
        if constexpr (requires { model_.process_share(batch, std::size_t{0}); })   // several processes: read our part
            loader.only([this](std::size_t n) {
                return model_.process_share(n, options_.reproducible ? micro_shard_of(step_options(), n) : 0);
            });

        CheckpointState state{.epoch = 0, .step = 0, .seed = options_.seed, .history = {}};
        if (options_.resume) {
            if (std::filesystem::exists(options_.checkpoint)) {
                CheckpointExpectations expect{.max_epoch = options_.epochs,
                                              .steps_per_epoch = loader.batches_per_epoch()};
                if constexpr (NamedOptimizer<O>) {   // refuses another optimizer's state; takes Adam's step count
                    state = load_checkpoint(options_.checkpoint, model_, opt, expect);
                } else {
                    if constexpr (requires { O::state_per_param; }) expect.state_per_param = O::state_per_param;
                    state = load_checkpoint(options_.checkpoint, model_, expect);
                }
                core::require(state.seed == options_.seed,
                              "checkpoint " + options_.checkpoint.string() + " was made with seed " +
                                  std::to_string(state.seed) + ", not " + std::to_string(options_.seed) +
                                  ": pass the same seed to resume the same run");
                say("resumed from " + options_.checkpoint.string() + " after epoch " + std::to_string(state.epoch));
            } else {
                say("no checkpoint at " + options_.checkpoint.string() + " yet: starting from scratch");
            }
        }

        const float base_lr = opt.options().lr *
                              (options_.scaling == parallel::Scaling::weak && options_.scale_lr ? float(replicas()) : 1.0f);
        const std::size_t steps = loader.batches_per_epoch();
        std::size_t skipped = 0, scale_skipped_total = 0;
        Progress progress(options_.progress);
        if (state.epoch == 0 && state.history.empty()) header();
        const bool first = model_.process_rank() == 0;
        HistoryWriter history(first ? options_.history_csv : "", first ? options_.history_json : "");
        for (const EpochRecord& r : state.history) history.epoch(r, r.epoch * steps);   // resumed: the epochs so far
        double recent_loss = 0.0;       // summed over the samples since the last step record
        std::size_t recent_samples = 0;

        for (std::size_t epoch = state.epoch; epoch < options_.epochs; ++epoch) {
            const auto t0 = std::chrono::steady_clock::now();
            loader.start_epoch(epoch);
            progress.start_epoch(epoch, options_.epochs, steps);
            double loss_sum = 0.0;
            std::size_t samples = 0, step = 0;
            double seen_loss = 0.0;          // loss_sum and samples at the last step record
            std::size_t seen_samples = 0;
            std::uint64_t scale_skipped = 0;   // updates loss scaling skipped in this epoch
            // Two batches at hand: this step's, and the next one, which GPU replicas copy meanwhile.
            for (auto b = loader.next(), next = loader.next(); b; b = next, next = loader.next()) {
                opt.set_lr(options_.schedule.lr(base_lr, double(epoch) + double(step) / double(steps)));
                if (options_.skip_nonfinite) {
                    saved_parameters_ = model_.parameters();
                    saved_state_ = model_.optimizer_state();
                }
                const float loss = train_step(model_, opt, *b, step_options(),
                                              next ? &*next : nullptr);
                ++step;
                ++state.step;
                bool scale_skip = false;
                if constexpr (scales_loss<O>) scale_skip = opt.skipped_last();
                if (scale_skip) {   // the scaler's business, not divergence; a loss it could not read is left out
                    ++scale_skipped;
                    ++scale_skipped_total;
                    if (!std::isfinite(loss)) continue;
                } else if (!std::isfinite(loss)) {
                    if (!options_.skip_nonfinite) diverged(loss, state.step, epoch, step, steps);
                    model_.set_parameters(saved_parameters_);   // the update is undone
                    model_.set_optimizer_state(saved_state_);
                    if constexpr (requires { opt.set_step_count(opt.step_count()); })
                        opt.set_step_count(opt.step_count() - 1);   // the undone update is not counted
                    ++skipped;
                    say("step " + std::to_string(state.step) + " (epoch " + std::to_string(epoch + 1) + ", batch " +
                        std::to_string(step) + "): loss " + std::to_string(loss) + ", batch skipped");
                    continue;
                }
                loss_sum += double(loss) * double(b->size);
                samples += b->size;
                progress.update(step, samples, loss_sum / double(samples), scale_text(opt, scale_skipped));
                recent_loss += loss_sum - std::exchange(seen_loss, loss_sum);
                recent_samples += samples - std::exchange(seen_samples, samples);
                if (options_.history_every && state.step % options_.history_every == 0) {
                    history.step({.step = state.step, .epoch = double(epoch) + double(step) / double(steps),
                                  .train_loss = recent_loss / double(recent_samples)});
                    recent_loss = 0.0;
                    recent_samples = 0;
                }
            }
            progress.finish_epoch();
            core::require(samples > 0, "epoch " + std::to_string(epoch + 1) + ": every step had a NaN or infinite loss "
                                       "and was skipped, so nothing was learned: lower the learning rate and check "
                                       "the inputs");
            check_parameters(epoch);

            EpochRecord record{.epoch = epoch + 1, .train_loss = loss_sum / double(samples),
                               .validation_loss = std::nan(""), .validation_accuracy = std::nan(""), .seconds = 0.0};
            if constexpr (scales_loss<O>) {
                record.scale_skipped_steps = scale_skipped;
                record.loss_scale = opt.enabled() ? double(opt.scale()) : 0.0;
            }
            record.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            const bool last = epoch + 1 == options_.epochs;
            if (validation_set.count && options_.validate_every && ((epoch + 1) % options_.validate_every == 0 || last)) {
                // In batches of the global batch: no more activation memory than training holds.
                const Metrics m = evaluate(model_, validation_set, global_batch());
                record.validation_loss = m.loss;
                record.validation_accuracy = m.accuracy;
            }
            state.history.push_back(record);
            history.epoch(record, state.step);
            state.epoch = epoch + 1;
            row(record, double(samples) / record.seconds);
            if (!options_.checkpoint.empty() && (state.epoch % options_.checkpoint_every == 0 || last) &&
                model_.process_rank() == 0) {
                if constexpr (NamedOptimizer<O>) save_checkpoint(options_.checkpoint, model_, state, opt);
                else save_checkpoint(options_.checkpoint, model_, state);
            }
        }
        return History{.epochs = state.history, .steps = history.history().steps, .skipped_steps = skipped,
                       .scale_skipped_steps = scale_skipped_total};
    }

    template <class O>
    static constexpr bool scales_loss = requires(const O& o) {
        o.skipped_last();
        o.scale();
        o.enabled();
    };

    // The progress line's part for loss scaling, when on.
    template <class O>
    static std::string scale_text(const O& opt, std::uint64_t skipped)
    {
        if constexpr (scales_loss<O>) {
            if (!opt.enabled()) return {};
            char buf[64];
            std::snprintf(buf, sizeof buf, "  scale %g  skipped %llu", double(opt.scale()), (unsigned long long)skipped);
            return buf;
        } else {
            return {};
        }
    }

    // Replicas of every process: weak scaling's global batch (and scaled lr) grow with them.
    std::size_t replicas() const { return model_.global_replica_count(); }

    template <class Set>
    void check_fits(const Set& set, const char* which) const
    {
        core::require(set.input_size == M::input_shape::size,
                      std::string("the ") + which + " set's samples have " + std::to_string(set.input_size) +
                          " values, but the model's Input needs " + std::to_string(M::input_shape::size));
        core::require(set.label_size == M::label_size,
                      std::string("the ") + which + " set has " + std::to_string(set.label_size) +
                          " labels per sample, but the model's output needs " + std::to_string(M::label_size));
    }

    std::string last_checkpoint() const
    {
        if (options_.checkpoint.empty()) return "No checkpoint is written in this run (no checkpoint path)";
        return "The last checkpoint, " + options_.checkpoint.string() + ", is unchanged: resume from it";
    }

    [[noreturn]] void diverged(float loss, std::uint64_t global_step, std::size_t epoch, std::size_t step,
                               std::size_t steps) const
    {
        throw Error("training diverged: the loss of step " + std::to_string(global_step) + " (epoch " +
                    std::to_string(epoch + 1) + ", batch " + std::to_string(step) + " of " + std::to_string(steps) +
                    ") is " + std::to_string(loss) + ". Likely causes: a learning rate too high for this model "
                    "(lower it), or NaN or infinite values produced from the inputs (check the data). " +
                    last_checkpoint() + (options_.checkpoint.empty() ? "" : " with a smaller learning rate") +
                    "; or set skip_nonfinite (--skip-nonfinite) to skip such batches");
    }

    // ReLU can hide a NaN from the loss while the parameters already hold it.
    void check_parameters(std::size_t epoch) const
    {
        const std::vector<float> w = model_.parameters();
        for (std::size_t i = 0; i < w.size(); ++i)
            if (!std::isfinite(w[i]))
                throw Error("training diverged: after epoch " + std::to_string(epoch + 1) + " parameter " +
                            std::to_string(i) + " is " + std::to_string(w[i]) +
                            " although every loss was finite. Likely causes: a learning rate too high for this "
                            "model (lower it), or NaN or infinite values produced from the inputs. " +
                            last_checkpoint());
    }

    void say(const std::string& s) const
    {
        if (options_.log) *options_.log << s << '\n';
    }
    void header() const
    {
        if (!options_.log) return;
        char buf[160];
        std::snprintf(buf, sizeof buf, "%6s  %10s  %10s  %9s  %8s  %10s", "epoch", "train loss", "val loss",
                      "val acc", "time", "samples/s");
        *options_.log << buf << '\n';
    }
    void row(const EpochRecord& r, double rate) const
    {
        if (!options_.log) return;
        char buf[224];
        const int n = std::snprintf(buf, sizeof buf, "%6llu  %10.4f  %10.4f  %9.4f  %7.1fs  %10.0f",
                                    (unsigned long long)r.epoch, r.train_loss, r.validation_loss,
                                    r.validation_accuracy, r.seconds, rate);
        if (r.loss_scale > 0.0 && n > 0 && std::size_t(n) < sizeof buf)
            std::snprintf(buf + n, sizeof buf - std::size_t(n), "  scale %g, %llu skipped", r.loss_scale,
                          (unsigned long long)r.scale_skipped_steps);
        *options_.log << buf << std::endl;
    }

    M& model_;
    Opt& opt_;
    TrainOptions options_;
    std::vector<float> saved_parameters_, saved_state_;   // skip_nonfinite: the model before this step
};

} // namespace replica::train

namespace REPLICA_NAMESPACE {
using train::TrainOptions;
using train::Trainer;
} // namespace replica
