#pragma once
// History: what a training run measured, one record per epoch (and, when asked, one every N steps).
// The Trainer returns it; checkpoints keep the epoch records, so that a resumed run reports the whole
// run. HistoryWriter writes it as CSV and JSON while the run goes on (scripts/plot-history draws them).

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "replica/core/config.hpp"
#include "replica/core/error.hpp"

namespace REPLICA_NAMESPACE::train {

struct EpochRecord {
    std::uint64_t epoch = 0;
    double train_loss = 0.0;            // mean over the epoch's labelled elements
    double validation_loss = 0.0;       // mean over the validation set's labelled elements
    double validation_accuracy = 0.0;   // fraction of them predicted right
    double seconds = 0.0;               // wall time of the epoch
    // Loss scaling (train/loss_scale.hpp), when on: the updates it skipped in the epoch, and the scale
    // at the epoch's end (0: no loss scaling). Not kept in checkpoints (a resumed epoch's are 0).
    std::uint64_t scale_skipped_steps = 0;
    double loss_scale = 0.0;
};

struct StepRecord {
    std::uint64_t step = 0;             // steps done since the run began
    double epoch = 0.0;                 // in epochs: 1.5 = half-way through the second
    double train_loss = 0.0;            // mean over the samples of the steps since the previous record
};

struct History {
    std::vector<EpochRecord> epochs;
    std::vector<StepRecord> steps;      // only with TrainOptions::history_every; not kept in checkpoints
    std::size_t skipped_steps = 0;   // steps undone for a NaN or infinite loss (TrainOptions::skip_nonfinite),
                                     // in this call of fit(); checkpoints do not keep it
    std::size_t scale_skipped_steps = 0;   // updates loss scaling skipped (a NaN or infinite gradient), in this
                                           // call of fit(); each epoch's are in its record
};

// Writes a History as it grows: `csv` gets one line per record, flushed at once (a plot can follow a
// run); `json` is rewritten whole (to a temporary file, then renamed) after every epoch, so it is
// always complete. Either path may be empty (not written).
//
// CSV columns: kind,epoch,step,train_loss,validation_loss,validation_accuracy,seconds; kind is "step"
// (validation_* and seconds empty) or "epoch" (step = steps done at its end). Missing values (no
// validation that epoch) are empty. JSON: {"epochs": [{"epoch", "step", "train_loss",
// "validation_loss", "validation_accuracy", "seconds"}...], "steps": [{"step", "epoch", "train_loss"}...]},
// missing values null.
class HistoryWriter {
public:
    HistoryWriter(std::filesystem::path csv, std::filesystem::path json) : csv_path_(std::move(csv)), json_path_(std::move(json))
    {
        if (!csv_path_.empty()) {
            csv_.open(csv_path_, std::ios::trunc);
            core::require(bool(csv_), "cannot create the history file " + csv_path_.string() + ": " + std::strerror(errno));
            csv_ << "kind,epoch,step,train_loss,validation_loss,validation_accuracy,seconds\n" << std::flush;
        }
    }

    void step(const StepRecord& r)
    {
        history_.steps.push_back(r);
        if (csv_.is_open()) csv_ << "step," << number(r.epoch) << ',' << r.step << ',' << number(r.train_loss) << ",,,\n" << std::flush;
    }

    // `step` is the number of steps done when the epoch ended.
    void epoch(const EpochRecord& r, std::uint64_t step)
    {
        history_.epochs.push_back(r);
        epoch_steps_.push_back(step);
        if (csv_.is_open())
            csv_ << "epoch," << r.epoch << ',' << step << ',' << number(r.train_loss) << ',' << number(r.validation_loss)
                 << ',' << number(r.validation_accuracy) << ',' << number(r.seconds) << '\n'
                 << std::flush;
        if (csv_.is_open()) core::require(bool(csv_), "cannot write the history file " + csv_path_.string());
        if (!json_path_.empty()) write_json();
    }

    const History& history() const { return history_; }

private:
    // Shortest text that reads back to the same double; empty for NaN or infinity.
    static std::string number(double v)
    {
        if (!std::isfinite(v)) return "";
        char buf[32];
        const auto end = std::to_chars(buf, buf + sizeof buf, v).ptr;
        return std::string(buf, end);
    }
    static std::string json_number(double v)
    {
        const std::string s = number(v);
        return s.empty() ? "null" : s;
    }

    void write_json() const
    {
        std::filesystem::path tmp = json_path_;
        tmp += ".tmp";
        {
            std::ofstream out(tmp, std::ios::trunc);
            core::require(bool(out), "cannot create the history file " + tmp.string() + ": " + std::strerror(errno));
            out << "{\"epochs\": [";
            for (std::size_t i = 0; i < history_.epochs.size(); ++i) {
                const EpochRecord& r = history_.epochs[i];
                out << (i ? ",\n  " : "\n  ") << "{\"epoch\": " << r.epoch << ", \"step\": " << epoch_steps_[i]
                    << ", \"train_loss\": " << json_number(r.train_loss)
                    << ", \"validation_loss\": " << json_number(r.validation_loss)
                    << ", \"validation_accuracy\": " << json_number(r.validation_accuracy)
                    << ", \"seconds\": " << json_number(r.seconds) << "}";
            }
            out << "],\n \"steps\": [";
            for (std::size_t i = 0; i < history_.steps.size(); ++i) {
                const StepRecord& r = history_.steps[i];
                out << (i ? ",\n  " : "\n  ") << "{\"step\": " << r.step << ", \"epoch\": " << json_number(r.epoch)
                    << ", \"train_loss\": " << json_number(r.train_loss) << "}";
            }
            out << "]}\n";
            out.close();
            core::require(!out.fail(), "cannot write the history file " + tmp.string());
        }
        std::error_code ec;
        std::filesystem::rename(tmp, json_path_, ec);
        core::require(!ec, "cannot rename " + tmp.string() + " to " + json_path_.string() + ": " + ec.message());
    }

    std::filesystem::path csv_path_, json_path_;
    std::ofstream csv_;
    History history_;
    std::vector<std::uint64_t> epoch_steps_;
};

} // namespace replica::train

namespace REPLICA_NAMESPACE {
using train::EpochRecord;
using train::History;
using train::HistoryWriter;
using train::StepRecord;
} // namespace replica
