#pragma once
// Softmax cross-entropy on the CPU, over logits (n, classes, pixels) and labels (n, pixels).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "replica/backend/cpu/context.hpp"
#include "replica/core/loss_slot.hpp"

namespace replica::backend::cpu {

// Leaves the sum of the per-pixel losses in *slot (or the first bad label); writes
// dlogits = (softmax - onehot) * scale when dlogits is not null. Computed in double per pixel.
inline void softmax_cross_entropy(const Context&, int classes, int pixels, const float* logits,
                                  const std::int32_t* labels, std::size_t n, float scale, float* dlogits,
                                  core::LossSlot* slot)
{
    *slot = {};
    double total = 0.0;
    for (std::size_t s = 0; s < n; ++s)
        for (int p = 0; p < pixels; ++p) {
            const float* z = logits + s * std::size_t(classes) * pixels + p;
            const std::int32_t label = labels[s * pixels + p];
            if (label < 0 || label >= classes) {
                slot->bad_label = label;
                slot->bad_position = double(s * pixels + p + 1);
                return;
            }
            float zmax = z[0];
            for (int c = 1; c < classes; ++c) zmax = std::max(zmax, z[std::size_t(c) * pixels]);
            double sum = 0.0;
            for (int c = 0; c < classes; ++c) sum += std::exp(double(z[std::size_t(c) * pixels] - zmax));
            const double log_sum = std::log(sum);
            total += log_sum - double(z[std::size_t(label) * pixels] - zmax);
            if (dlogits) {
                float* d = dlogits + s * std::size_t(classes) * pixels + p;
                for (int c = 0; c < classes; ++c) {
                    const double prob = std::exp(double(z[std::size_t(c) * pixels] - zmax) - log_sum);
                    d[std::size_t(c) * pixels] = float((prob - (c == label ? 1.0 : 0.0)) * scale);
                }
            }
        }
    slot->sum = total;
}

// Number of pixels whose arg-max class equals the label.
inline std::size_t count_correct(const Context&, int classes, int pixels, const float* logits,
                                 const std::int32_t* labels, std::size_t n)
{
    std::size_t correct = 0;
    for (std::size_t s = 0; s < n; ++s)
        for (int p = 0; p < pixels; ++p) {
            const float* z = logits + s * std::size_t(classes) * pixels + p;
            int best = 0;
            for (int c = 1; c < classes; ++c)
                if (z[std::size_t(c) * pixels] > z[std::size_t(best) * pixels]) best = c;
            correct += best == labels[s * pixels + p];
        }
    return correct;
}

} // namespace replica::backend::cpu
