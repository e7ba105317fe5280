#pragma once
// Number formats for activations: bf16 and fp16, stored as their 16 bits, converted to and from float
// on host and device alike (the same bits on both: round to nearest, ties to even, NaN kept NaN, fp16
// overflowing to infinity). Layout-compatible with CUDA's __nv_bfloat16 and __half, so the libraries
// (cuDNN, cuBLASLt) read them directly; arithmetic always happens in float.
//
//   float f = to_float(v);           // exact
//   T v = from_float<T>(f);          // rounded; from_float<float>(f) == f
//
// Element types a model's activations may have: float (fp32), bf16, fp16 (`Storage`).

#include <bit>
#include <concepts>
#include <cstdint>
#include <cstring>

#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::core {

struct bf16 {
    std::uint16_t bits;
};
struct fp16 {
    std::uint16_t bits;
};
static_assert(sizeof(bf16) == 2 && sizeof(fp16) == 2);

template <class T>
concept Storage = std::same_as<T, float> || std::same_as<T, bf16> || std::same_as<T, fp16>;

namespace detail {
REPLICA_HOST_DEVICE std::uint32_t bits_of(float f)
{
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    return std::bit_cast<std::uint32_t>(f);
#endif
}
REPLICA_HOST_DEVICE float float_of(std::uint32_t u)
{
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    return std::bit_cast<float>(u);
#endif
}

// bf16 is float's upper half: round the lower half away, to nearest, ties to even. A NaN stays a
// (quiet) NaN; a value that rounds past the largest finite bf16 becomes infinity, as float does.
REPLICA_HOST_DEVICE std::uint16_t bf16_bits(float f)
{
    const std::uint32_t u = bits_of(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((u >> 16) | 0x40u);   // NaN
    const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return std::uint16_t((u + rounding) >> 16);
}

// IEEE binary16: 1 sign, 5 exponent (bias 15), 10 fraction bits; subnormals below 2^-14; values at or
// above 65520 round to infinity.
REPLICA_HOST_DEVICE std::uint16_t fp16_bits(float f)
{
    const std::uint32_t u = bits_of(f);
    const std::uint16_t sign = std::uint16_t((u >> 16) & 0x8000u);
    const std::uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return std::uint16_t(sign | 0x7e00u);                 // NaN
    if (a >= 0x477ff000u) return std::uint16_t(sign | 0x7c00u);                // >= 65520: infinity
    if (a < 0x38800000u) {                                                     // below 2^-14: subnormal
        // The value in units of 2^-24, rounded to nearest even: shift the 24-bit significand.
        const std::uint32_t e = a >> 23;
        if (e < 102) return sign;                                              // below 2^-25: zero
        const std::uint32_t m = (a & 0x7fffffu) | 0x800000u;
        const std::uint32_t shift = 126 - e;                                   // 14 .. 24
        const std::uint32_t half = 1u << (shift - 1);
        const std::uint32_t rest = m & ((1u << shift) - 1u);
        std::uint32_t q = m >> shift;
        if (rest > half || (rest == half && (q & 1u))) ++q;
        return std::uint16_t(sign | q);
    }
    // Normal: rebias the exponent (127 -> 15) and round the 13 dropped fraction bits.
    const std::uint32_t r = a - 0x38000000u;
    const std::uint32_t rounded = r + 0xfffu + ((r >> 13) & 1u);
    return std::uint16_t(sign | (rounded >> 13));
}

REPLICA_HOST_DEVICE float fp16_value(std::uint16_t h)
{
    const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
    const std::uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return float_of(sign | 0x7f800000u | (m << 13));            // inf, NaN
    if (e != 0) return float_of(sign | ((e + 112) << 23) | (m << 13));
    if (m == 0) return float_of(sign);
    // Subnormal: m * 2^-24, exact in float.
    const float v = float(m) * 5.9604644775390625e-8f;
    return sign ? -v : v;
}
} // namespace detail

REPLICA_HOST_DEVICE float to_float(float v) { return v; }
REPLICA_HOST_DEVICE float to_float(bf16 v) { return detail::float_of(std::uint32_t(v.bits) << 16); }
REPLICA_HOST_DEVICE float to_float(fp16 v) { return detail::fp16_value(v.bits); }

template <class T>
REPLICA_HOST_DEVICE T from_float(float f)
{
    if constexpr (std::same_as<T, float>) return f;
    else if constexpr (std::same_as<T, bf16>) return bf16{detail::bf16_bits(f)};
    else return fp16{detail::fp16_bits(f)};
}

// f rounded through T and back: the value that storing f as T keeps.
template <class T>
REPLICA_HOST_DEVICE float round_through(float f)
{
    return to_float(from_float<T>(f));
}

template <class T>
inline constexpr const char* storage_name = std::same_as<T, float> ? "fp32" : std::same_as<T, bf16> ? "bf16" : "fp16";

} // namespace replica::core
