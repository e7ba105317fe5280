#pragma once
// The pooling family (layers/pool.hpp; what every family shares: kernels/kernels.hpp), templates on
// the window g (core::Window), called as max_pool_forward<g>(ctx, ...).
//
// x (n, g.c, g.h, g.w) to y (n, g.c, g.oh, g.ow), each of the g.c channels pooled on its own; x, y
// and their gradients are of the model's element type T, activations in the context's layout, read
// as float, summed in float, each output rounded once. Windows may reach past the input (ceil mode):
// max pooling ignores the padding and what lies past the input, average pooling counts them as zeros
// (divides by g.kh * g.kw: PyTorch's count_include_pad). Input gradients are sums over the windows
// in an order that depends on the shape only.

#include <concepts>
#include <cstddef>

#include "replica/core/config.hpp"
#include "replica/core/number.hpp"
#include "replica/core/window.hpp"

namespace REPLICA_NAMESPACE::backend::kernels {

// The family for activations of type T and the window g. All ops are queued.
template <class C, class T, core::Window g>
concept PoolKernelsFor = core::Storage<T> &&
    requires(const C& ctx, const T* x, T* y, const T* dy, T* dx, core::pool_position_t<g>* arg,
             const core::pool_position_t<g>* positions, std::size_t n) {
        // y = each window's maximum; arg (one a y value) = its position within the window
        // (core::pool_position_t<g>: the first maximum in scan order). Where no value exceeds -inf,
        // the CPU writes the window's first position inside the input, a GPU core::pool_no_position<g>.
        max_pool_forward<g>(ctx, x, y, arg, n);
        // dx assigned: each y value's gradient added at its maximum's position (the forward's arg;
        // core::pool_no_position<g>: nowhere).
        max_pool_backward<g>(ctx, positions, dy, dx, n);
        // y = each window's sum / (g.kh * g.kw).
        avg_pool_forward<g>(ctx, x, y, n);
        // dx assigned: each y value's gradient / (g.kh * g.kw) added at every position of its window.
        avg_pool_backward<g>(ctx, dy, dx, n);
    };

// The family for every element type of activations, checked with two windows (the contract holds
// for every window a layer builds): 2x2 windows of stride 2, whose positions are bytes, and one
// 17x17 window (289 positions: two bytes each).
template <class C>
concept PoolKernels = PoolKernelsFor<C, float, core::Window{16, 24, 24, 2, 2, 2, 2, 0, 0, 12, 12}> &&
                      PoolKernelsFor<C, core::bf16, core::Window{16, 24, 24, 2, 2, 2, 2, 0, 0, 12, 12}> &&
                      PoolKernelsFor<C, core::fp16, core::Window{16, 24, 24, 2, 2, 2, 2, 0, 0, 12, 12}> &&
                      PoolKernelsFor<C, float, core::Window{8, 17, 17, 17, 17, 1, 1, 0, 0, 1, 1}> &&
                      PoolKernelsFor<C, core::bf16, core::Window{8, 17, 17, 17, 17, 1, 1, 0, 0, 1, 1}> &&
                      PoolKernelsFor<C, core::fp16, core::Window{8, 17, 17, 17, 17, 1, 1, 0, 0, 1, 1}>;

} // namespace replica::backend::kernels
