#pragma once
// The embedding family (layers/embedding.hpp; what every family shares: kernels/kernels.hpp): a token
// table looked up by id, and a position table added to a sequence. Activations are of the model's
// element type T, computed in float and rounded once; the tables and their gradients are float. The
// tables' gradients are sums in an order fixed by the batch (samples, then positions), never by threads
// or atomics: the same bits on every run, backend and device count.

#include <concepts>
#include <cstddef>
#include <cstdint>

#include "replica/core/config.hpp"
#include "replica/core/number.hpp"

namespace REPLICA_NAMESPACE::backend::kernels {

// The family for activations of type T. All ops are queued.
template <class C, class T>
concept EmbeddingKernelsFor = core::Storage<T> &&
    requires(const C& ctx, const std::int32_t* ids, const float* table, const T* x, T* y, const T* dy, T* dx,
             float* dtable, std::size_t count, std::size_t vocabulary, std::size_t dim, std::size_t n,
             std::size_t positions, std::size_t context, bool accumulate) {
        // y (count, dim) = row ids[i] of table (vocabulary, dim) for each of the count ids, which the
        // model has checked to be in [0, vocabulary).
        embedding_forward(ctx, ids, table, y, count, dim);
        // dtable (vocabulary, dim) ASSIGNED: row r the sum of dy's row i over the i with ids[i] == r, in
        // increasing i (zero for a row no id names); with accumulate, that sum starts from dtable's row
        // as it was instead of zero (a tied table: the head's gradient, then these).
        embedding_backward(ctx, ids, dy, dtable, count, vocabulary, dim, accumulate);
        // y = x + the table's first `positions` rows, for each of n samples of (positions, dim).
        position_embedding_forward(ctx, x, table, y, n, positions, dim);
        // dx = dy (nothing where dx is null); dtable (context, dim) ASSIGNED: row t the sum over the
        // samples, in order, of dy's position t; rows from `positions` on zero.
        position_embedding_backward(ctx, dy, dx, dtable, n, positions, context, dim);
    };

// The family for every element type of activations.
template <class C>
concept EmbeddingKernels =
    EmbeddingKernelsFor<C, float> && EmbeddingKernelsFor<C, core::bf16> && EmbeddingKernelsFor<C, core::fp16>;

} // namespace replica::backend::kernels
