#pragma once
// SoftmaxCrossEntropy: the loss train_step minimises.
//   output (classes)        labels: one class per sample            (classification)
//   output (classes, h, w)  labels: one class per pixel, (h, w)     (segmentation)
// The loss is the mean over every labelled element of the global batch; each replica computes its
// share with `scale` = 1 / (elements in the global batch), so replica gradients sum to the exact
// gradient of the global mean.

#include <cstddef>
#include <cstdint>

#include "replica/core/loss_slot.hpp"
#include "replica/core/shape.hpp"

namespace replica::layers {

struct SoftmaxCrossEntropy {
    template <ShapeType Out>
    static constexpr std::size_t classes = Out::dims[0];
    // Labels per sample.
    template <ShapeType Out>
    static constexpr std::size_t label_size = Out::size / Out::dims[0];

    // Queues the sum of the losses of n samples into *slot (read it with finish() once the context has
    // synchronized); dlogits (may be null) = d(scale * sum) / dlogits.
    template <ShapeType Out, class Ctx>
    static void forward_backward(Ctx& ctx, const float* logits, const std::int32_t* labels, std::size_t n,
                                 float scale, float* dlogits, core::LossSlot* slot)
    {
        static_assert(Out::rank == 1 || Out::rank == 3,
                      "SoftmaxCrossEntropy needs (classes) or (classes, height, width) outputs");
        softmax_cross_entropy(ctx, int(classes<Out>), int(label_size<Out>), logits, labels, n, scale, dlogits, slot);
    }
    // The sum, or Error naming a label outside the model's classes.
    template <ShapeType Out>
    static double finish(const core::LossSlot& slot) { return slot.value(int(classes<Out>)); }

    template <ShapeType Out, class Ctx>
    static std::size_t correct(Ctx& ctx, const float* logits, const std::int32_t* labels, std::size_t n)
    {
        return count_correct(ctx, int(classes<Out>), int(label_size<Out>), logits, labels, n);
    }
};

} // namespace replica::layers

namespace replica {
using layers::SoftmaxCrossEntropy;
} // namespace replica
