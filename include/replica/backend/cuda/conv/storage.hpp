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
#include "replica/core/number.hpp"

namespace replica::backend::cuda::detail {

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
    if constexpr (std::same_as<T, float>) {
        return aligned ? *reinterpret_cast<const float4*>(p) : make_float4(p[0], p[1], p[2], p[3]);
    } else {
        if (aligned) {
            const uint2 u = *reinterpret_cast<const uint2*>(p);
            return make_float4(kernels::widen(T{std::uint16_t(u.x & 0xffffu)}), kernels::widen(T{std::uint16_t(u.x >> 16)}),
                               kernels::widen(T{std::uint16_t(u.y & 0xffffu)}), kernels::widen(T{std::uint16_t(u.y >> 16)}));
        }
        return make_float4(kernels::widen(p[0]), kernels::widen(p[1]), kernels::widen(p[2]), kernels::widen(p[3]));
    }
}

// p[0..3] = v, each rounded to T once; one vector store where `aligned`.
template <core::Storage T>
__device__ inline void store4(T* p, float4 v, bool aligned)
{
    if constexpr (std::same_as<T, float>) {
        if (aligned) *reinterpret_cast<float4*>(p) = v;
        else {
            p[0] = v.x;
            p[1] = v.y;
            p[2] = v.z;
            p[3] = v.w;
        }
    } else {
        const T a = kernels::narrow<T>(v.x), b = kernels::narrow<T>(v.y), c = kernels::narrow<T>(v.z),
                d = kernels::narrow<T>(v.w);
        if (aligned) {
            *reinterpret_cast<uint2*>(p) =
                make_uint2(unsigned(a.bits) | (unsigned(b.bits) << 16), unsigned(c.bits) | (unsigned(d.bits) << 16));
        } else {
            p[0] = a;
            p[1] = b;
            p[2] = c;
            p[3] = d;
        }
    }
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
