#pragma once
// The layout family: activations into and out of the context's layout, conversions between element
// types, and channel slices (what every family shares: kernels/kernels.hpp).
//
// An activation here is n samples of (c, pixels); "channels first" is that order in memory, the
// context's layout the order its kernels read (channels first on the CPU and for float; a GPU may keep
// 16-bit activations (pixels, c), backend/cuda/layout.hpp). A conversion D <- S is
// from_float<D>(to_float(s)): exact where D holds every S, rounded to nearest even otherwise, a copy
// where S is D. Source and destination never overlap.

#include <concepts>
#include <cstddef>

#include "replica/core/config.hpp"
#include "replica/core/number.hpp"

namespace REPLICA_NAMESPACE::backend::kernels {

// The family for activations of type T. All ops are queued.
template <class C, class T>
concept LayoutKernelsFor = core::Storage<T> &&
    requires(const C& ctx, const float* values, float* floats, const T* x, T* y, std::size_t count, std::size_t n,
             std::size_t c, std::size_t pixels, std::size_t channels, std::size_t offset) {
        // y = values converted, `count` values with no layout (a model's weight copy in T).
        convert(ctx, values, y, count);
        // y (in the context's layout) = the channels-first activation converted: float to T (a model's
        // input), or T to T (Flatten's input gradient).
        to_activation_layout(ctx, values, y, n, c, pixels);
        to_activation_layout(ctx, x, y, n, c, pixels);
        // The inverse, channels first out: T to float (predict's outputs), or T to T (Flatten's forward).
        from_activation_layout(ctx, x, floats, n, c, pixels);
        from_activation_layout(ctx, x, y, n, c, pixels);
        // y (n, channels, pixels)[:, offset, offset + c) = x (n, c, pixels), both in the context's
        // layout, y's other channels left as they are (Concat's forward).
        copy_channels_in(ctx, x, n, c, pixels, y, channels, offset);
        // y (n, c, pixels) = x (n, channels, pixels)[:, offset, offset + c) (Concat's backward).
        copy_channels_out(ctx, x, channels, offset, n, c, pixels, y);
    };

// The family for every element type of activations.
template <class C>
concept LayoutKernels = LayoutKernelsFor<C, float> && LayoutKernelsFor<C, core::bf16> && LayoutKernelsFor<C, core::fp16>;

} // namespace replica::backend::kernels
