#pragma once
// Token and position embeddings on the CPU (layers/embedding.hpp). Activations (y, x, dy, dx) are T
// (core::Storage), loaded as float; tables and their gradients are float. Gradients are sums in
// float in a fixed order (samples, then positions), so they do not depend on the thread count.

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "replica/backend/cpu/context.hpp"
#include "replica/core/config.hpp"
#include "replica/core/number.hpp"

namespace REPLICA_NAMESPACE::backend::cpu {

// y[i] = table[ids[i]] for `count` ids, rows of `dim`; ids in [0, vocabulary) (checked by the model).
template <core::Storage T>
void embedding_forward(const Context&, const std::int32_t* ids, const float* table, T* y, std::size_t count, std::size_t dim)
{
    for (std::size_t i = 0; i < count; ++i) {
        const float* row = table + std::size_t(ids[i]) * dim;
        for (std::size_t d = 0; d < dim; ++d) y[i * dim + d] = core::from_float<T>(row[d]);
    }
}

// dtable (vocabulary rows of dim) ASSIGNED: zero, then dy[i] added to row ids[i], i = 0, 1, ...
template <core::Storage T>
void embedding_backward(const Context&, const std::int32_t* ids, const T* dy, float* dtable, std::size_t count,
                        std::size_t vocabulary, std::size_t dim, bool accumulate = false)
{
    if (!accumulate) std::fill(dtable, dtable + vocabulary * dim, 0.0f);
    for (std::size_t i = 0; i < count; ++i) {
        float* row = dtable + std::size_t(ids[i]) * dim;
        for (std::size_t d = 0; d < dim; ++d) row[d] += core::to_float(dy[i * dim + d]);
    }
}

// y = x + table's first `positions` rows, for each of n samples of (positions, dim).
template <core::Storage T>
void position_embedding_forward(const Context&, const T* x, const float* table, T* y, std::size_t n,
                                std::size_t positions, std::size_t dim)
{
    const std::size_t per = positions * dim;
    for (std::size_t s = 0; s < n; ++s)
        for (std::size_t k = 0; k < per; ++k) y[s * per + k] = core::from_float<T>(core::to_float(x[s * per + k]) + table[k]);
}

// dx = dy (unless null); dtable (context rows of dim) ASSIGNED: row t the sum of dy's position t over
// the samples in order, rows from `positions` on zero.
template <core::Storage T>
void position_embedding_backward(const Context&, const T* dy, T* dx, float* dtable, std::size_t n, std::size_t positions,
                                 std::size_t context, std::size_t dim)
{
    const std::size_t per = positions * dim;
    std::fill(dtable, dtable + context * dim, 0.0f);
    for (std::size_t s = 0; s < n; ++s)
        for (std::size_t k = 0; k < per; ++k) dtable[k] += core::to_float(dy[s * per + k]);
    if (dx) std::copy(dy, dy + n * per, dx);
}

} // namespace replica::backend::cpu
