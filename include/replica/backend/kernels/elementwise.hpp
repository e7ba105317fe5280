#pragma once
// The elementwise family: activations and their gradients, dropout, copies, sums and fills, value by
// value (what every family shares: kernels/kernels.hpp).
//
// Arrays of `count` values in context memory. An output value depends on the input values at its
// own index only, so an output array may be one of the input arrays (arrays never overlap
// otherwise). Activations are of the model's element type T, each value computed in float from its
// inputs' to_float and rounded once to T; the rule is the same in every layout, so only dropout asks
// which layout the context keeps.

#include <concepts>
#include <cstddef>
#include <cstdint>

#include "replica/core/config.hpp"
#include "replica/core/number.hpp"

namespace REPLICA_NAMESPACE::backend::kernels {

// The family for activations of type T. All ops are queued.
template <class C, class T>
concept ElementwiseKernelsFor = core::Storage<T> &&
    requires(const C& ctx, const T* x, T* y, const T* out, const T* dy, T* dx, const float* src, float* dst,
             float value, std::size_t count, float p, std::uint64_t seed, std::uint32_t layer,
             std::uint64_t first_sample, std::size_t n, std::size_t size, std::size_t channels, bool relu) {
        // y = max(x, 0); dx = dy where out > 0, else 0 (out: the forward's output).
        relu_forward(ctx, x, y, count);
        relu_backward(ctx, out, dy, dx, count);
        // y = 1 / (1 + exp(-x)); dx = dy * out * (1 - out).
        sigmoid_forward(ctx, x, y, count);
        sigmoid_backward(ctx, out, dy, dx, count);
        // y = tanh(x); dx = dy * (1 - out^2).
        tanh_forward(ctx, x, y, count);
        tanh_backward(ctx, out, dy, dx, count);
        // GELU, the exact form: y = x * Phi(x); dx = dy * (Phi(x) + x * phi(x)), from the forward's INPUT x.
        gelu_forward(ctx, x, y, count);
        gelu_backward(ctx, x, dy, dx, count);
        // GELU, the tanh form: y = 0.5 x (1 + tanh(u)), u = sqrt(2 / pi) (x + 0.044715 x^3); dx = dy * its
        // derivative, from the forward's INPUT x.
        gelu_tanh_forward(ctx, x, y, count);
        gelu_tanh_backward(ctx, x, dy, dx, count);
        // Inverted dropout, p in [0, 1), over n samples of `size` values (`channels` of them a pixel):
        // value e of sample s is x * 1 / (1 - p) where core::random_uniform(seed, Stream::dropout, layer,
        // first_sample + s, e) >= p, else 0, e numbering the sample's values channels first whatever
        // the layout. Backward is the same call on (dy, dx): nothing is kept between the two. A context
        // replaying a captured step takes its seed and first sample from the step (backend/step_run.hpp).
        dropout_apply(ctx, p, seed, layer, first_sample, x, y, n, size, channels);
        // y = x (the same array: nothing), for activations and float arrays (statistics) alike.
        copy(ctx, x, y, count);
        copy(ctx, src, dst, count);
        // y += x, for activations (each sum rounded once) and float arrays alike.
        add(ctx, x, y, count);
        add(ctx, src, dst, count);
        // y = x + out, then max(y, 0) when relu: a residual block's merge.
        add_into(ctx, x, out, y, count, relu);
        // dst = value, for float arrays (gradients, statistics, sums).
        fill(ctx, dst, value, count);
    };

// The family for every element type of activations.
template <class C>
concept ElementwiseKernels =
    ElementwiseKernelsFor<C, float> && ElementwiseKernelsFor<C, core::bf16> && ElementwiseKernelsFor<C, core::fp16>;

} // namespace replica::backend::kernels
