#pragma once
// Activation values (core::Storage: float, bf16, fp16) in kernels, and elementwise maps over them.
// Kernels compute in float: a value is read with widen (core::to_float) and written with narrow<T>
// (core::from_float<T>), one rounding per stored value (none for float). Passes bound by memory move
// 16 bytes a thread and step where every pointer is 16-byte aligned: four floats (a float4) or eight
// 16-bit values (a uint4), with the scalar kernel over the rest. The float kernels are those of the
// float-only backend.

#include <cuda_fp16.h>

#include <concepts>
#include <cstddef>
#include <cstdint>

#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/launch.hpp"
#include "replica/core/config.hpp"
#include "replica/core/number.hpp"

namespace REPLICA_NAMESPACE::backend::cuda {

namespace kernels {
// core::to_float and core::from_float<T>, the same bits (NaNs included), with fp16 through the
// conversion instructions on the device (the portable forms take dozens of instructions a value,
// more than the memory time of a pass).
__host__ __device__ inline float widen(float v) { return v; }
__host__ __device__ inline float widen(core::bf16 v) { return core::to_float(v); }
__host__ __device__ inline float widen(core::fp16 v)
{
#if defined(__CUDA_ARCH__)
    const float f = __half2float(__ushort_as_half(v.bits));
    // A NaN keeps its sign and payload, as core::to_float keeps them.
    const std::uint32_t nan = std::uint32_t(v.bits & 0x8000u) << 16 | 0x7f800000u | std::uint32_t(v.bits & 0x3ffu) << 13;
    return f != f ? __uint_as_float(nan) : f;
#else
    return core::to_float(v);
#endif
}
template <core::Storage T>
__host__ __device__ inline T narrow(float f)
{
#if defined(__CUDA_ARCH__)
    if constexpr (std::same_as<T, core::fp16>) {
        const auto h = std::uint16_t(__half_as_ushort(__float2half_rn(f)));
        // A NaN becomes core::from_float's quiet NaN of the same sign.
        const auto nan = std::uint16_t((__float_as_uint(f) >> 16 & 0x8000u) | 0x7e00u);
        return T{f != f ? nan : h};
    } else {
        return core::from_float<T>(f);
    }
#else
    return core::from_float<T>(f);
#endif
}

// *p as float, through the read-only data cache.
template <core::Storage T>
__device__ inline float load_ldg(const T* p)
{
    if constexpr (std::same_as<T, float>) return __ldg(p);
    else return widen(T{__ldg(&p->bits)});
}

// The eight values at p (16-byte aligned) as floats, and eight floats stored there as T. Host and
// device (the tests check the order of the values on the host).
template <core::Storage T>
__host__ __device__ inline void load8(const T* p, float (&v)[8])
{
    if constexpr (std::same_as<T, float>) {
        const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
        const uint4 r = *reinterpret_cast<const uint4*>(p);
        const unsigned w[4] = {r.x, r.y, r.z, r.w};
        for (int k = 0; k < 4; ++k) {   // little-endian: the lower half is the first value
            v[2 * k] = widen(T{std::uint16_t(w[k] & 0xffffu)});
            v[2 * k + 1] = widen(T{std::uint16_t(w[k] >> 16)});
        }
    }
}
template <core::Storage T>
__host__ __device__ inline void store8(T* p, const float (&v)[8])
{
    if constexpr (std::same_as<T, float>) {
        reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
        reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
        unsigned w[4];
        for (int k = 0; k < 4; ++k)
            w[k] = unsigned(narrow<T>(v[2 * k]).bits) | unsigned(narrow<T>(v[2 * k + 1]).bits) << 16;
        *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
    }
}

// V consecutive values at p as floats (v[0..V-1]), and V floats stored there as T, one rounding each:
// V = 8 (p 16-byte aligned), 4 (p aligned to four values: 16 bytes of float, 8 of a 16-bit type) or 1.
template <int V, core::Storage T>
__device__ inline void load_v(const T* p, float (&v)[8])
{
    if constexpr (V == 8) {
        load8(p, v);
    } else if constexpr (V == 4 && std::same_as<T, float>) {
        const float4 a = *reinterpret_cast<const float4*>(p);
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
    } else if constexpr (V == 4) {
        const uint2 r = *reinterpret_cast<const uint2*>(p);
        v[0] = widen(T{std::uint16_t(r.x & 0xffffu)}), v[1] = widen(T{std::uint16_t(r.x >> 16)});
        v[2] = widen(T{std::uint16_t(r.y & 0xffffu)}), v[3] = widen(T{std::uint16_t(r.y >> 16)});
    } else {
        v[0] = widen(*p);
    }
}
template <int V, core::Storage T>
__device__ inline void store_v(T* p, const float (&v)[8])
{
    if constexpr (V == 8) {
        store8(p, v);
    } else if constexpr (V == 4 && std::same_as<T, float>) {
        *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
    } else if constexpr (V == 4) {
        const auto two = [](float a, float b) { return unsigned(narrow<T>(a).bits) | unsigned(narrow<T>(b).bits) << 16; };
        *reinterpret_cast<uint2*>(p) = make_uint2(two(v[0], v[1]), two(v[2], v[3]));
    } else {
        *p = narrow<T>(v[0]);
    }
}

// V values of T (V = 8 or 1) as they lie in memory, a register a 4 bytes: read now (load_raw) and
// widened later (widen_raw, the same floats as load_v), so that a thread can have several rows' loads
// in flight before it uses the first.
template <int V, core::Storage T>
struct Raw {
    static_assert(V == 8 || V == 1, "Raw: one value or one 16-byte move of eight");
    unsigned w[(V * sizeof(T) + 3) / 4];
};
template <int V, core::Storage T>
__device__ inline Raw<V, T> load_raw(const T* p)
{
    Raw<V, T> r;
    if constexpr (V == 1) {
        if constexpr (std::same_as<T, float>) r.w[0] = __float_as_uint(*p);
        else r.w[0] = p->bits;
    } else {
        const uint4* q = reinterpret_cast<const uint4*>(p);
#pragma unroll
        for (int k = 0; k < int(sizeof(r.w) / 16); ++k) {
            const uint4 u = q[k];
            r.w[4 * k] = u.x, r.w[4 * k + 1] = u.y, r.w[4 * k + 2] = u.z, r.w[4 * k + 3] = u.w;
        }
    }
    return r;
}
template <int V, core::Storage T>
__device__ inline void widen_raw(const Raw<V, T>& r, float (&v)[8])
{
    if constexpr (std::same_as<T, float>) {
#pragma unroll
        for (int k = 0; k < V; ++k) v[k] = __uint_as_float(r.w[k]);
    } else if constexpr (V == 1) {
        v[0] = widen(T{std::uint16_t(r.w[0])});
    } else {
#pragma unroll
        for (int k = 0; k < 4; ++k) {   // little-endian: the lower half is the first value
            v[2 * k] = widen(T{std::uint16_t(r.w[k] & 0xffffu)});
            v[2 * k + 1] = widen(T{std::uint16_t(r.w[k] >> 16)});
        }
    }
}

// y = f(x): over single values, over float4s, over groups of eight values.
template <class F, core::Storage T>
__global__ void map1(F f, const T* x, T* y, std::size_t count)
{
    REPLICA_GRID_LOOP(i, count) y[i] = narrow<T>(f(widen(x[i])));
}
template <class F>
__global__ void map1_4(F f, const float4* x, float4* y, std::size_t quads)
{
    REPLICA_GRID_LOOP(i, quads)
    {
        const float4 v = x[i];
        y[i] = make_float4(f(v.x), f(v.y), f(v.z), f(v.w));
    }
}
template <class F, core::Storage T>
__global__ void map1_8(F f, const T* x, T* y, std::size_t octets)
{
    REPLICA_GRID_LOOP(i, octets)
    {
        float v[8];
        load8(x + 8 * i, v);
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = f(v[k]);
        store8(y + 8 * i, v);
    }
}
// dx = f(a, dy), a being the forward's input or output (or any second operand).
template <class F, core::Storage T>
__global__ void map2(F f, const T* a, const T* dy, T* dx, std::size_t count)
{
    REPLICA_GRID_LOOP(i, count) dx[i] = narrow<T>(f(widen(a[i]), widen(dy[i])));
}
template <class F>
__global__ void map2_4(F f, const float4* a, const float4* dy, float4* dx, std::size_t quads)
{
    REPLICA_GRID_LOOP(i, quads)
    {
        const float4 v = a[i], d = dy[i];
        dx[i] = make_float4(f(v.x, d.x), f(v.y, d.y), f(v.z, d.z), f(v.w, d.w));
    }
}
template <class F, core::Storage T>
__global__ void map2_8(F f, const T* a, const T* dy, T* dx, std::size_t octets)
{
    REPLICA_GRID_LOOP(i, octets)
    {
        float u[8], d[8];
        load8(a + 8 * i, u);
        load8(dy + 8 * i, d);
#pragma unroll
        for (int k = 0; k < 8; ++k) u[k] = f(u[k], d[k]);
        store8(dx + 8 * i, u);
    }
}
} // namespace kernels

namespace detail {
// Every pointer 16-byte aligned (a float4 or eight 16-bit values at a time).
template <class... P>
bool quad_aligned(const P*... p)
{
    return ((reinterpret_cast<std::uintptr_t>(p) % alignof(float4) == 0) && ...);
}

// Values of T one 16-byte move carries.
template <core::Storage T>
inline constexpr std::size_t per_move = 16 / sizeof(T);

// count values in moves of k: vector(moves) over the whole moves when `aligned`, then scalar(done)
// over the values from `done` on (all of them when not aligned).
template <class Vector, class Scalar>
void in_moves(bool aligned, std::size_t count, std::size_t k, Vector&& vector, Scalar&& scalar)
{
    std::size_t done = 0;
    if (aligned && count >= k) {
        done = count / k * k;
        vector(count / k);
    }
    if (done < count) scalar(done);
}

// y = F{}(x), dx = F{}(a, dy): the vector kernel over the whole moves when every pointer is aligned,
// the scalar one over the rest.
template <class F, core::Storage T>
void map1(const Context& ctx, const T* x, T* y, std::size_t count, const char* what)
{
    const auto s = ctx.stream();
    in_moves(
        quad_aligned(x, y), count, per_move<T>,
        [&](std::size_t moves) {
            if constexpr (std::same_as<T, float>)
                kernels::map1_4<<<blocks_for(moves), kThreads, 0, s>>>(F{}, reinterpret_cast<const float4*>(x),
                                                                      reinterpret_cast<float4*>(y), moves);
            else
                kernels::map1_8<<<blocks_for(moves), kThreads, 0, s>>>(F{}, x, y, moves);
        },
        [&](std::size_t done) {
            kernels::map1<<<blocks_for(count - done), kThreads, 0, s>>>(F{}, x + done, y + done, count - done);
        });
    check_launch(what);
}
template <class F, core::Storage T>
void map2(const Context& ctx, const T* a, const T* dy, T* dx, std::size_t count, const char* what)
{
    const auto s = ctx.stream();
    in_moves(
        quad_aligned(a, dy, dx), count, per_move<T>,
        [&](std::size_t moves) {
            if constexpr (std::same_as<T, float>)
                kernels::map2_4<<<blocks_for(moves), kThreads, 0, s>>>(F{}, reinterpret_cast<const float4*>(a),
                                                                      reinterpret_cast<const float4*>(dy),
                                                                      reinterpret_cast<float4*>(dx), moves);
            else
                kernels::map2_8<<<blocks_for(moves), kThreads, 0, s>>>(F{}, a, dy, dx, moves);
        },
        [&](std::size_t done) {
            kernels::map2<<<blocks_for(count - done), kThreads, 0, s>>>(F{}, a + done, dy + done, dx + done, count - done);
        });
    check_launch(what);
}
} // namespace detail

} // namespace replica::backend::cuda
