#pragma once
// Losses. A model ends with one (Sequential<Input<...>, ..., Linear<10>, SoftmaxCrossEntropy>; without
// one, SoftmaxCrossEntropy).
//
// SoftmaxCrossEntropy: the loss train_step minimises by default.
//   output (classes)        labels: one class per sample            (classification)
//   output (classes, h, w)  labels: one class per pixel, (h, w)     (segmentation)
// The loss is the mean over every labelled element of the global batch; each replica computes its
// share with `scale` = 1 / (elements in the global batch), so replica gradients sum to the exact
// gradient of the global mean.
//
// SequenceCrossEntropy: a language model's loss, classes on the last axis.
//   output (positions, classes)  labels: one class per position, (positions)   (next-token prediction)
// The mean over every position of every sample of the global batch, as above; equal to PyTorch's
// F.cross_entropy(logits.view(N * positions, classes), labels.view(N * positions)).

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "replica/core/config.hpp"
#include "replica/core/error.hpp"
#include "replica/core/loss_slot.hpp"
#include "replica/core/shape.hpp"

namespace REPLICA_NAMESPACE::layers {

// What a model asks of its loss: label_size<Out> labels per sample for outputs of shape Out;
// forward_backward (queues the loss sum of n samples into a LossSlot and writes the logits' gradient),
// check_labels and first_bad_label (host memory, before a step is queued), finish (the sum from its
// slot), correct (predictions that match their labels). `is_loss` marks the type as one.
template <class L>
concept Loss = L::is_loss;

struct SoftmaxCrossEntropy {
    static constexpr bool is_loss = true;
    template <ShapeType Out>
    static constexpr std::size_t classes = Out::dims[0];
    // Labels per sample.
    template <ShapeType Out>
    static constexpr std::size_t label_size = Out::size / Out::dims[0];

    // Queues the sum of the losses of n samples into *slot (read it with finish() once the context has
    // synchronized); dlogits (may be null) = d(scale * sum) / dlogits. Logits and their gradient are the
// model's activations (float, bf16 or fp16); the sums are float.
    template <ShapeType Out, class Ctx, class T>
    static void forward_backward(Ctx& ctx, const T* logits, const std::int32_t* labels, std::size_t n,
                                 float scale, std::type_identity_t<T>* dlogits, core::LossSlot* slot)
    {
        static_assert(Out::rank == 1 || Out::rank == 3,
                      "SoftmaxCrossEntropy needs (classes) or (classes, height, width) outputs");
        softmax_cross_entropy(ctx, int(classes<Out>), int(label_size<Out>), logits, labels, n, scale, dlogits, slot);
    }
    // Error naming the first of the n samples' labels (host memory) outside the model's classes. A
    // training step checks its batch before it queues anything, so that no update ever uses the
    // gradient of a bad label (with the update queued before the host reads the loss, the loss slot's
    // check would come too late); the slot still checks what reaches the loss otherwise.
    template <ShapeType Out>
    static void check_labels(const std::int32_t* labels, std::size_t n)
    {
        if (const std::size_t i = first_bad_label<Out>(labels, n); i < n * label_size<Out>)
            throw core::bad_label_error(long(labels[i]), long(i), int(classes<Out>));
    }
    // The index of the first label outside the classes, or n * label_size when there is none.
    template <ShapeType Out>
    static std::size_t first_bad_label(const std::int32_t* labels, std::size_t n)
    {
        const std::size_t count = n * label_size<Out>;
        std::size_t i = 0;
        while (i < count && labels[i] >= 0 && std::size_t(labels[i]) < classes<Out>) ++i;
        return i;
    }
    // The sum, or Error naming a label outside the model's classes.
    template <ShapeType Out>
    static double finish(const core::LossSlot& slot) { return slot.value(int(classes<Out>)); }

    template <ShapeType Out, class Ctx, class T>
    static std::size_t correct(Ctx& ctx, const T* logits, const std::int32_t* labels, std::size_t n)
    {
        return count_correct(ctx, int(classes<Out>), int(label_size<Out>), logits, labels, n);
    }
};

// Classes on the last axis: (positions, classes) is, for the backends, n * positions rows of one
// classifier each (softmax_cross_entropy and count_correct with one pixel), so it runs their row
// kernels (on a GPU a block a row, which suits a vocabulary of tens of thousands) and no other code.
struct SequenceCrossEntropy {
    static constexpr bool is_loss = true;
    template <ShapeType Out>
    static constexpr std::size_t classes = Out::dims[Out::rank - 1];
    template <ShapeType Out>
    static constexpr std::size_t label_size = Out::size / classes<Out>;

    template <ShapeType Out, class Ctx, class T>
    static void forward_backward(Ctx& ctx, const T* logits, const std::int32_t* labels, std::size_t n,
                                 float scale, std::type_identity_t<T>* dlogits, core::LossSlot* slot)
    {
        static_assert(Out::rank == 2,
                      "SequenceCrossEntropy needs (positions, classes) outputs, a class per position: end the model "
                      "in a Linear<classes> over the sequence, or use SoftmaxCrossEntropy for (classes) outputs");
        softmax_cross_entropy(ctx, int(classes<Out>), 1, logits, labels, n * label_size<Out>, scale, dlogits, slot);
    }
    // Error naming the sample and position of the first of the n samples' labels (host memory) outside
    // the classes; see SoftmaxCrossEntropy::check_labels.
    template <ShapeType Out>
    static void check_labels(const std::int32_t* labels, std::size_t n)
    {
        if (const std::size_t i = first_bad_label<Out>(labels, n); i < n * label_size<Out>)
            throw error<Out>(long(labels[i]), i);
    }
    template <ShapeType Out>
    static std::size_t first_bad_label(const std::int32_t* labels, std::size_t n)
    {
        return SoftmaxCrossEntropy::first_bad_label<Shape<classes<Out>, label_size<Out>>>(labels, n);
    }
    template <ShapeType Out>
    static double finish(const core::LossSlot& slot)
    {
        if (slot.bad_position != 0.0) throw error<Out>(long(slot.bad_label), std::size_t(slot.bad_position) - 1);
        return slot.sum;
    }
    // Positions whose arg-max class equals the label.
    template <ShapeType Out, class Ctx, class T>
    static std::size_t correct(Ctx& ctx, const T* logits, const std::int32_t* labels, std::size_t n)
    {
        return count_correct(ctx, int(classes<Out>), 1, logits, labels, n * label_size<Out>);
    }

private:
    template <ShapeType Out>
    static Error error(long label, std::size_t element)
    {
        return Error("label " + std::to_string(label) + " of sample " + std::to_string(element / label_size<Out>) +
                     ", position " + std::to_string(element % label_size<Out>) + " is outside [0, " +
                     std::to_string(classes<Out>) + "): the data set does not match the model's number of classes");
    }
};

} // namespace replica::layers

namespace REPLICA_NAMESPACE {
using layers::Loss;
using layers::SequenceCrossEntropy;
using layers::SoftmaxCrossEntropy;
} // namespace replica
