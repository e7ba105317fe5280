#pragma once
// Softmax cross-entropy on the CPU, over logits (n, classes, pixels) and labels (n, pixels).
// logits and dlogits are T (core::Storage): loaded as float, each dlogits element rounded once from
// the value the float path stores; the loss (double) is the float path's on the same logits.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "replica/backend/cpu/context.hpp"
#include "replica/core/config.hpp"
#include "replica/core/loss_slot.hpp"
#include "replica/core/number.hpp"

namespace REPLICA_NAMESPACE::backend::cpu {

// Leaves the sum of the per-pixel losses in *slot (or the first bad label); writes
// dlogits = (softmax - onehot) * scale when dlogits is not null. Computed in double per pixel.
template <core::Storage T>
void softmax_cross_entropy(const Context&, int classes, int pixels, const T* logits, const std::int32_t* labels,
                           std::size_t n, float scale, std::type_identity_t<T>* dlogits, core::LossSlot* slot)
{
    *slot = {};
    double total = 0.0;
    for (std::size_t s = 0; s < n; ++s)
        for (int p = 0; p < pixels; ++p) {
            const T* zs = logits + s * std::size_t(classes) * pixels + p;
            const auto z = [&](int c) { return core::to_float(zs[std::size_t(c) * pixels]); };
            const std::int32_t label = labels[s * pixels + p];
            if (label < 0 || label >= classes) {
                slot->bad_label = label;
                slot->bad_position = double(s * pixels + p + 1);
                return;
            }
            float zmax = z(0);
            for (int c = 1; c < classes; ++c) zmax = std::max(zmax, z(c));
            double sum = 0.0;
            for (int c = 0; c < classes; ++c) sum += std::exp(double(z(c) - zmax));
            const double log_sum = std::log(sum);
            total += log_sum - double(z(label) - zmax);
            if (dlogits) {
                T* d = dlogits + s * std::size_t(classes) * pixels + p;
                for (int c = 0; c < classes; ++c) {
                    const double prob = std::exp(double(z(c) - zmax) - log_sum);
                    d[std::size_t(c) * pixels] = core::from_float<T>(float((prob - (c == label ? 1.0 : 0.0)) * scale));
                }
            }
        }
    slot->sum = total;
}

// Number of pixels whose arg-max class equals the label.
template <core::Storage T>
std::size_t count_correct(const Context&, int classes, int pixels, const T* logits, const std::int32_t* labels,
                          std::size_t n)
{
    std::size_t correct = 0;
    for (std::size_t s = 0; s < n; ++s)
        for (int p = 0; p < pixels; ++p) {
            const T* z = logits + s * std::size_t(classes) * pixels + p;
            int best = 0;
            for (int c = 1; c < classes; ++c)
                if (core::to_float(z[std::size_t(c) * pixels]) > core::to_float(z[std::size_t(best) * pixels])) best = c;
            correct += best == labels[s * pixels + p];
        }
    return correct;
}

} // namespace replica::backend::cpu
