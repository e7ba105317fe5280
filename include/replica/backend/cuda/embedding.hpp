#pragma once
// Token and position embeddings on the GPU, the CPU backend's contract (backend/cpu/embedding.hpp):
// activations T computed in float, tables and their gradients float. The tables' gradients are sums
// in the CPU's order (samples, then positions), one thread an element of the table scanning the batch,
// with no atomics: the same bits as the CPU's every run.

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/launch.hpp"
#include "replica/core/config.hpp"
#include "replica/core/number.hpp"

namespace REPLICA_NAMESPACE::backend::cuda {

namespace kernels {
template <class T>
__global__ void embedding_forward(const std::int32_t* ids, const float* table, T* y, std::size_t count, std::size_t dim)
{
    REPLICA_GRID_LOOP(k, count * dim)
    {
        const std::size_t i = k / dim, d = k % dim;
        y[k] = core::from_float<T>(table[std::size_t(ids[i]) * dim + d]);
    }
}

// Block r: row r of the table, its threads over the row's dim values, each scanning the ids in order.
template <class T>
__global__ void embedding_backward(const std::int32_t* ids, const T* dy, float* dtable, std::size_t count, std::size_t dim,
                                   bool accumulate)
{
    const std::int32_t row = std::int32_t(blockIdx.x);
    for (std::size_t d = threadIdx.x; d < dim; d += blockDim.x) {
        float sum = accumulate ? dtable[std::size_t(row) * dim + d] : 0.0f;
        for (std::size_t i = 0; i < count; ++i)
            if (ids[i] == row) sum += core::to_float(dy[i * dim + d]);
        dtable[std::size_t(row) * dim + d] = sum;
    }
}

template <class T>
__global__ void position_embedding_forward(const T* x, const float* table, T* y, std::size_t n, std::size_t per)
{
    REPLICA_GRID_LOOP(k, n * per) y[k] = core::from_float<T>(core::to_float(x[k]) + table[k % per]);
}

// Element k of the (context, dim) table: the sum over samples of dy's element k (k < per), else 0.
template <class T>
__global__ void position_embedding_backward(const T* dy, float* dtable, std::size_t n, std::size_t per, std::size_t size)
{
    REPLICA_GRID_LOOP(k, size)
    {
        float sum = 0.0f;
        if (k < per)
            for (std::size_t s = 0; s < n; ++s) sum += core::to_float(dy[s * per + k]);
        dtable[k] = sum;
    }
}
} // namespace kernels

// y[i] = table[ids[i]] for `count` ids, rows of `dim`; ids in [0, vocabulary) (checked by the model).
template <core::Storage T>
void embedding_forward(const Context& ctx, const std::int32_t* ids, const float* table, T* y, std::size_t count,
                       std::size_t dim)
{
    if (count == 0) return;
    kernels::embedding_forward<<<detail::blocks_for(count * dim), detail::kThreads, 0, ctx.stream()>>>(ids, table, y,
                                                                                                     count, dim);
    detail::check_launch("embedding_forward");
}

// dtable (vocabulary rows of dim) ASSIGNED: row r the sum of dy[i] over the i with ids[i] == r, in order,
// starting from the row as it was with accumulate.
template <core::Storage T>
void embedding_backward(const Context& ctx, const std::int32_t* ids, const T* dy, float* dtable, std::size_t count,
                        std::size_t vocabulary, std::size_t dim, bool accumulate = false)
{
    const unsigned threads = unsigned(std::min<std::size_t>(std::size_t(detail::kThreads), (dim + 31) / 32 * 32));
    kernels::embedding_backward<<<unsigned(vocabulary), threads, 0, ctx.stream()>>>(ids, dy, dtable, count, dim,
                                                                                     accumulate);
    detail::check_launch("embedding_backward");
}

// y = x + the table's first `positions` rows, for each of n samples of (positions, dim).
template <core::Storage T>
void position_embedding_forward(const Context& ctx, const T* x, const float* table, T* y, std::size_t n,
                                std::size_t positions, std::size_t dim)
{
    if (n == 0) return;
    const std::size_t per = positions * dim;
    kernels::position_embedding_forward<<<detail::blocks_for(n * per), detail::kThreads, 0, ctx.stream()>>>(x, table, y,
                                                                                                           n, per);
    detail::check_launch("position_embedding_forward");
}

// dx = dy (unless null); dtable (context rows of dim) ASSIGNED: row t the sum of dy's position t over the
// samples in order, rows from `positions` on zero.
template <core::Storage T>
void position_embedding_backward(const Context& ctx, const T* dy, T* dx, float* dtable, std::size_t n,
                                 std::size_t positions, std::size_t context, std::size_t dim)
{
    const std::size_t per = positions * dim, size = context * dim;
    kernels::position_embedding_backward<<<detail::blocks_for(size), detail::kThreads, 0, ctx.stream()>>>(dy, dtable, n,
                                                                                                         per, size);
    detail::check_launch("position_embedding_backward");
    if (dx && n > 0)
        REPLICA_CHECK(cudaMemcpyAsync(dx, dy, n * per * sizeof(T), cudaMemcpyDeviceToDevice, ctx.stream()));
}

} // namespace replica::backend::cuda
