#pragma once
// What the convolutions' and products' kernels (conv/) need of their element type T (float, bf16,
// fp16; core::Storage): loads that give a float and stores that round once (core::from_float), the
// library type names of T, and the widening of a T result to float (cuDNN's filter gradient). For
// T = float a load is the plain load and a store the plain store. Only under nvcc.

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
#include "replica/core/number.hpp"

namespace replica::backend::cuda::detail {

static_assert(sizeof(core::bf16) == sizeof(__nv_bfloat16) && sizeof(core::fp16) == sizeof(__half));

template <core::Storage T>
inline constexpr cudnnDataType_t cudnn_type = std::same_as<T, float>        ? CUDNN_DATA_FLOAT
                                              : std::same_as<T, core::bf16> ? CUDNN_DATA_BFLOAT16
                                                                            : CUDNN_DATA_HALF;

// p[0] as a float, through the read-only cache.
template <core::Storage T>
__device__ inline float load_ldg(const T* p)
{
    if constexpr (std::same_as<T, float>) return __ldg(p);
    else return core::to_float(T{__ldg(reinterpret_cast<const unsigned short*>(p))});
}

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
            return make_float4(core::to_float(T{std::uint16_t(u.x & 0xffffu)}), core::to_float(T{std::uint16_t(u.x >> 16)}),
                               core::to_float(T{std::uint16_t(u.y & 0xffffu)}), core::to_float(T{std::uint16_t(u.y >> 16)}));
        }
        return make_float4(core::to_float(p[0]), core::to_float(p[1]), core::to_float(p[2]), core::to_float(p[3]));
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
        const T a = core::from_float<T>(v.x), b = core::from_float<T>(v.y), c = core::from_float<T>(v.z),
                d = core::from_float<T>(v.w);
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

namespace replica::backend::cuda::kernels {
// dst[i] = src[i] as a float (exact): a result that a library wrote in T into scratch, to a float
// gradient.
template <class T>
__global__ void to_float_copy(const T* src, float* dst, std::size_t count)
{
    REPLICA_GRID_LOOP(i, count) dst[i] = core::to_float(src[i]);
}
} // namespace replica::backend::cuda::kernels

namespace replica::backend::cuda::detail {
template <core::Storage T>
void to_float_copy(cudaStream_t stream, const T* src, float* dst, std::size_t count)
{
    if (count == 0) return;
    kernels::to_float_copy<T><<<blocks_for(count), kThreads, 0, stream>>>(src, dst, count);
    check_launch("to_float_copy");
}
} // namespace replica::backend::cuda::detail
