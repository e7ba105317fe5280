#pragma once
// The kernel API: the ops that layers and models call on a backend, declared once, one header a family
// (dlib's tt::, Thrust's systems). A caller names an op unqualified with the context first
// (relu_forward(ctx, x, y, n)), so argument-dependent lookup finds the context's backend
// (backend::cpu, backend::cuda). Each family is a concept over the context type that states its ops,
// each one's contract beside it, and the element types it must take; each backend proves where it is
// defined that its context implements every family (backend/cpu/cpu.hpp, backend/cuda/cuda.hpp).
//
// What every family shares:
// - The context is taken by const reference (a handle: backend/contract.hpp). Arrays are context
//   memory (C::allocate) unless an op says otherwise.
// - "Queued": ordered after the work queued before on the context's queue, possibly not finished when
//   the call returns (finished on the CPU: backend/contract.hpp). An op that returns what the host
//   needs says whether it waits.
// - Element types (core/number.hpp): activations, their gradients and the weights that products read
//   are of the model's element type T, float, core::bf16 or core::fp16, and every family is checked
//   for all three; parameters, their gradients, statistics, sums and scratch are float. Ops compute in
//   float and round each stored T value once.
// - Layout: an activation of n samples of (channels, pixels) is kept in the context's layout, channels
//   first on the CPU and for float, (pixels, channels) for 16-bit activations on a GPU that keeps them
//   channels last (backend/cuda/layout.hpp). Shapes below are written channels first whatever the layout.
// - Gradients: backward ops ASSIGN what they write (parameter and input gradients), except where an op
//   says it accumulates (layers/op.hpp).
//
// To add an op: state it and its contract in its family's concept, then define it in each backend
// (backend/cpu/, backend/cuda/); a backend that lacks it fails implements_kernels there.

#include <concepts>

#include "replica/backend/kernels/attention.hpp"
#include "replica/backend/kernels/conv.hpp"
#include "replica/backend/kernels/elementwise.hpp"
#include "replica/backend/kernels/embedding.hpp"
#include "replica/backend/kernels/layer_norm.hpp"
#include "replica/backend/kernels/layout.hpp"
#include "replica/backend/kernels/linear.hpp"
#include "replica/backend/kernels/loss.hpp"
#include "replica/backend/kernels/normalization.hpp"
#include "replica/backend/kernels/optim.hpp"
#include "replica/backend/kernels/pool.hpp"
#include "replica/backend/kernels/reproducible.hpp"
#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::backend::kernels {

// Every family, for every element type.
template <class C>
concept Kernels = ElementwiseKernels<C> && LayoutKernels<C> && LinearKernels<C> && ConvKernels<C> && PoolKernels<C> &&
                  NormalizationKernels<C> && LayerNormKernels<C> && AttentionKernels<C> && EmbeddingKernels<C> &&
                  LossKernels<C> && OptimizerKernels<C> && ReproducibleKernels<C>;

// True where context C implements every family; otherwise it fails to compile with one message a
// family that C lacks an op of (the compiler's notes name the op). A backend states, after its ops:
//   static_assert(backend::kernels::implements_kernels<Context>());
template <class C>
constexpr bool implements_kernels()
{
    static_assert(ElementwiseKernels<C>, "this context lacks an op of the elementwise family, or declares one "
                                         "otherwise than backend/kernels/elementwise.hpp states");
    static_assert(LayoutKernels<C>, "this context lacks an op of the layout family, or declares one otherwise "
                                    "than backend/kernels/layout.hpp states");
    static_assert(LinearKernels<C>, "this context lacks an op of the fully connected family, or declares one "
                                    "otherwise than backend/kernels/linear.hpp states");
    static_assert(ConvKernels<C>, "this context lacks an op of the convolution family, or declares one otherwise "
                                  "than backend/kernels/conv.hpp states");
    static_assert(PoolKernels<C>, "this context lacks an op of the pooling family, or declares one otherwise "
                                  "than backend/kernels/pool.hpp states");
    static_assert(NormalizationKernels<C>, "this context lacks an op of the batch normalisation family, or "
                                           "declares one otherwise than backend/kernels/normalization.hpp states");
    static_assert(LayerNormKernels<C>, "this context lacks an op of the layer normalisation family, or declares "
                                       "one otherwise than backend/kernels/layer_norm.hpp states");
    static_assert(AttentionKernels<C>, "this context lacks an op of the attention family, or declares one "
                                       "otherwise than backend/kernels/attention.hpp states");
    static_assert(EmbeddingKernels<C>, "this context lacks an op of the embedding family, or declares one "
                                       "otherwise than backend/kernels/embedding.hpp states");
    static_assert(OptimizerKernels<C>, "this context lacks an op of the optimizer family, or declares one "
                                       "otherwise than backend/kernels/optim.hpp states");
    static_assert(LossKernels<C>, "this context lacks an op of the loss family, or declares one otherwise than "
                                  "backend/kernels/loss.hpp states");
    static_assert(ReproducibleKernels<C>, "this context lacks an op of the reproducible mode's family, or declares "
                                          "one otherwise than backend/kernels/reproducible.hpp states");
    return Kernels<C>;
}

} // namespace replica::backend::kernels
