#pragma once
// What the convolutions' and products' kernels (conv/) need of their element type T (float, bf16,
// fp16; core::Storage) beyond packed.hpp's widen and narrow: cuDNN's name for T, and loads and stores
// of four values that give floats and round once. For T = float a load is the plain load and a store
// the plain store. Only under nvcc.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <library_types.h>

#include <concepts>
#include <cstddef>
#include <cstdint>

#include "replica/backend/cuda/check.hpp"
#include "replica/backend/cuda/launch.hpp"
#include "replica/backend/cuda/packed.hpp"
#include "replica/core/config.hpp"
#include "replica/core/number.hpp"

namespace REPLICA_NAMESPACE::backend::cuda::detail {

static_assert(sizeof(core::bf16) == sizeof(__nv_bfloat16) && sizeof(core::fp16) == sizeof(__half));

template <core::Storage T>
inline constexpr cudnnDataType_t cudnn_type = std::same_as<T, float>        ? CUDNN_DATA_FLOAT
                                              : std::same_as<T, core::bf16> ? CUDNN_DATA_BFLOAT16
                                                                            : CUDNN_DATA_HALF;

// Four consecutive values p[0..3] as floats: one 16-byte (float) or 8-byte (16-bit T) load where
// `aligned` says p allows it (vector_aligned), else four loads.
template <core::Storage T>
__device__ inline float4 load4(const T* p, bool aligned)
{
    float v[8];
    if (aligned) kernels::load_v<4>(p, v);
    else
        for (int j = 0; j < 4; ++j) v[j] = kernels::widen(p[j]);
    return make_float4(v[0], v[1], v[2], v[3]);
}

// p[0..3] = v, each rounded to T once; one vector store where `aligned`.
template <core::Storage T>
__device__ inline void store4(T* p, float4 v, bool aligned)
{
    const float w[8] = {v.x, v.y, v.z, v.w};
    if (aligned) kernels::store_v<4>(p, w);
    else
        for (int j = 0; j < 4; ++j) p[j] = kernels::narrow<T>(w[j]);
}

// Whether every pointer allows load4/store4's vector access of four T: 16 bytes for float, 8 for
// 16-bit T.
template <core::Storage T, class... P>
bool vector_aligned(const P*... p)
{
    constexpr std::uintptr_t bytes = 4 * sizeof(T);
    return ((reinterpret_cast<std::uintptr_t>(p) % bytes == 0) && ...);
}

} // namespace replica::backend::cuda::detail
