#pragma once
// LossSlot: where a backend leaves the result of a loss computation, in host memory (page-locked
// under CUDA, written by the loss kernel: read it only after the context has synchronized).

#include <string>

#include "replica/core/config.hpp"
#include "replica/core/error.hpp"

namespace REPLICA_NAMESPACE::core {

// The error for a label outside [0, classes) at `element` (the index of the labelled element).
inline Error bad_label_error(long label, long element, int classes)
{
    return Error("label " + std::to_string(label) + " of element " + std::to_string(element) + " is outside [0, " +
                 std::to_string(classes) + "): the data set does not match the model's number of classes");
}

struct LossSlot {
    double sum = 0.0;            // sum of the per-element losses
    double bad_label = 0.0;      // a label outside [0, classes), when bad_position != 0
    double bad_position = 0.0;   // 1 + its element index; 0: every label was valid

    // The sum, or Error when a label was out of range.
    double value(int classes) const
    {
        if (bad_position != 0.0) throw bad_label_error(long(bad_label), long(bad_position) - 1, classes);
        return sum;
    }
};

} // namespace replica::core
