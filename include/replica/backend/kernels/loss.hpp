#pragma once
// The loss family (layers/loss.hpp; what every family shares: kernels/kernels.hpp): softmax
// cross-entropy over logits (n, classes, pixels), an activation of the model's element type T in the
// context's layout, read as float, and labels (n, pixels), 32-bit class indices in context memory.

#include <concepts>
#include <cstddef>
#include <cstdint>

#include "replica/core/config.hpp"
#include "replica/core/loss_slot.hpp"
#include "replica/core/number.hpp"

namespace REPLICA_NAMESPACE::backend::kernels {

// The family for activations of type T.
template <class C, class T>
concept LossKernelsFor = core::Storage<T> &&
    requires(const C& ctx, int classes, int pixels, const T* logits, const std::int32_t* labels, std::size_t n,
             float scale, T* dlogits, core::LossSlot* slot) {
        // Queued: *slot (host memory, page-locked under CUDA where it can be: backend::host_buffer) = the sum of
        // the per-pixel losses, in double in an order that depends on the shape only, or a label
        // outside [0, classes) and its position; read it after synchronize(). dlogits (null: none) =
        // (softmax(logits) - onehot(label)) * scale, assigned, each value rounded once.
        softmax_cross_entropy(ctx, classes, pixels, logits, labels, n, scale, dlogits, slot);
        // The number of pixels whose arg-max class is their label. Waits for the work queued so far.
        { count_correct(ctx, classes, pixels, logits, labels, n) } -> std::same_as<std::size_t>;
    };

// The family for every element type of activations.
template <class C>
concept LossKernels = LossKernelsFor<C, float> && LossKernelsFor<C, core::bf16> && LossKernelsFor<C, core::fp16>;

} // namespace replica::backend::kernels
