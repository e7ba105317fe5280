#pragma once
// Where channels-last activations pay (the CUDA backend keeps 16-bit activations (pixels, channels):
// backend/cuda/layout.hpp). The rule is a property of a convolution's window alone, so that layers
// and models can ask it at compile time; both backends compile it, the CPU never acts on it.

#include <cstddef>

#include "replica/core/config.hpp"
#include "replica/core/window.hpp"

namespace REPLICA_NAMESPACE::backend {

// Whether a convolution runs channels-first, between transposes, although its neighbours are
// channels-last: its input channels are not a multiple of 8, where cuDNN's channels-last kernels are
// slow, and its input is small (at most 32 Ki values a sample: LeNet's layers, a first layer over
// small images), so the transposes around it cost little and the direct kernels and the products,
// which read (channels, pixels), serve it. A model all of whose convolutions detour keeps its
// activations channels-first (model/sequential.hpp).
constexpr bool detours_channels_last(const core::Window& g)
{
    return g.c % 8 != 0 && std::size_t(g.c) * std::size_t(g.h) * std::size_t(g.w) <= 32768;
}

} // namespace replica::backend
