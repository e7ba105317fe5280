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

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <utility>

#include "replica/data/dataset.hpp"
#include "replica/data/loader.hpp"
#include "replica/data/source.hpp"
#include "replica/parallel/scaling.hpp"
#include "replica/train/checkpoint.hpp"
#include "replica/train/history.hpp"
#include "replica/train/progress.hpp"
#include "replica/train/schedule.hpp"
#include "replica/train/step.hpp"

namespace replica::train {

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
    std::size_t micro_shard = 8;            // samples per micro-shard in reproducible mode
    bool progress = true;                   // live line on a terminal
    std::ostream* log = &std::cout;         // one line per epoch; null: silent
    // The History written while training (HistoryWriter: CSV a line per record, JSON after every
    // epoch); empty: not written. history_every N > 0 adds a record every N steps.
    std::filesystem::path history_csv = {};
    std::filesystem::path history_json = {};
    std::size_t history_every = 0;
};

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
        core::require(options_.checkpoint_every > 0, "checkpoint_every must be at least 1 epoch");
        core::require(!options_.resume || !options_.checkpoint.empty(), "resume needs a checkpoint path");
    }

    std::size_t global_batch() const
    {
        return parallel::global_batch(options_.batch_size, replicas(), options_.scaling);
    }

    // `train_set`: a Dataset, or a SampleSource (images decoded and augmented as the loader reads them).
    History fit(const data::SampleSource& train_set, const data::Dataset& validation_set = {})
    {
        check_fits(train_set, "training");
        if (validation_set.count) check_fits(validation_set, "validation");
        core::require(train_set.count > 0, "the training set is empty");

        CheckpointState state{.epoch = 0, .step = 0, .seed = options_.seed, .history = {}};
        if (options_.resume) {
            if (std::filesystem::exists(options_.checkpoint)) {
                state = load_checkpoint(options_.checkpoint, model_);
                core::require(state.seed == options_.seed,
                              "checkpoint " + options_.checkpoint.string() + " was made with seed " +
                                  std::to_string(state.seed) + ", not " + std::to_string(options_.seed) +
                                  ": pass the same seed to resume the same run");
                say("resumed from " + options_.checkpoint.string() + " after epoch " + std::to_string(state.epoch));
            } else {
                say("no checkpoint at " + options_.checkpoint.string() + " yet: starting from scratch");
            }
        }

        const std::size_t batch = global_batch();
        const float base_lr = opt_.options().lr *
                              (options_.scaling == parallel::Scaling::weak && options_.scale_lr ? float(replicas()) : 1.0f);
        data::Loader loader(train_set, batch, options_.seed, /*shuffle=*/true);
        if constexpr (requires { model_.process_share(batch, std::size_t{0}); })   // several processes: read our part
            loader.only([this](std::size_t n) {
                return model_.process_share(n, options_.reproducible ? options_.micro_shard : 0);
            });
        const std::size_t steps = loader.batches_per_epoch();
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
            // Two batches at hand: this step's, and the next one, which GPU replicas copy meanwhile.
            for (auto b = loader.next(), next = loader.next(); b; b = next, next = loader.next()) {
                opt_.set_lr(options_.schedule.lr(base_lr, double(epoch) + double(step) / double(steps)));
                loss_sum += double(train_step(model_, opt_, *b, {options_.reproducible, options_.micro_shard},
                                              next ? &*next : nullptr)) *
                            double(b->size);
                samples += b->size;
                ++step;
                ++state.step;
                progress.update(step, samples, loss_sum / double(samples));
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

            EpochRecord record{.epoch = epoch + 1, .train_loss = loss_sum / double(samples),
                               .validation_loss = std::nan(""), .validation_accuracy = std::nan(""), .seconds = 0.0};
            record.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            const bool last = epoch + 1 == options_.epochs;
            if (validation_set.count && options_.validate_every && ((epoch + 1) % options_.validate_every == 0 || last)) {
                const Metrics m = evaluate(model_, validation_set);
                record.validation_loss = m.loss;
                record.validation_accuracy = m.accuracy;
            }
            state.history.push_back(record);
            history.epoch(record, state.step);
            state.epoch = epoch + 1;
            row(record, double(samples) / record.seconds);
            if (!options_.checkpoint.empty() && (state.epoch % options_.checkpoint_every == 0 || last) &&
                model_.process_rank() == 0)
                save_checkpoint(options_.checkpoint, model_, state);
        }
        return History{.epochs = state.history, .steps = history.history().steps};
    }

private:
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
        char buf[160];
        std::snprintf(buf, sizeof buf, "%6llu  %10.4f  %10.4f  %9.4f  %7.1fs  %10.0f", (unsigned long long)r.epoch,
                      r.train_loss, r.validation_loss, r.validation_accuracy, r.seconds, rate);
        *options_.log << buf << std::endl;
    }

    M& model_;
    Opt& opt_;
    TrainOptions options_;
};

} // namespace replica::train

namespace replica {
using train::TrainOptions;
using train::Trainer;
} // namespace replica
