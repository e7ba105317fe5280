#pragma once
// History: what a training run measured, one record per epoch. The Trainer returns it; checkpoints
// keep it, so that a resumed run reports the whole run.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace replica::train {

struct EpochRecord {
    std::uint64_t epoch = 0;
    double train_loss = 0.0;            // mean over the epoch's labelled elements
    double validation_loss = 0.0;       // mean over the validation set's labelled elements
    double validation_accuracy = 0.0;   // fraction of them predicted right
    double seconds = 0.0;               // wall time of the epoch
};

struct History {
    std::vector<EpochRecord> epochs;
    std::size_t skipped_steps = 0;   // steps undone for a NaN or infinite loss (TrainOptions::skip_nonfinite),
                                     // in this call of fit(); checkpoints do not keep it
};

} // namespace replica::train

namespace replica {
using train::EpochRecord;
using train::History;
} // namespace replica
