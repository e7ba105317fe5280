#pragma once
// Order-independent sums, for the reproducible mode: each float term becomes a 64-bit integer at one
// fixed scale (2^-40), integers add associatively, so a sum of many terms is the same whatever their
// order or grouping (which replica computed which term, which order an all-reduce used). Terms must
// stay below 2^22 in magnitude, sums below 2^23; resolution 2^-40 (about 9e-13).
//
// The per-element rules are shared by the CPU loops below and the GPU kernels (backend/cuda), so both
// produce the same integers from the same floats.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "replica/core/config.hpp"
#include "replica/core/error.hpp"

namespace REPLICA_NAMESPACE::core {

inline constexpr double kFixedScale = 1099511627776.0;   // 2^40
inline constexpr double kFixedLimit = 4611686018427387904.0;   // 2^62: room for sums

// g in fixed point; false (and nothing added) when g is out of range or NaN.
REPLICA_HOST_DEVICE bool to_fixed(float g, std::int64_t& out)
{
    const double v = double(g) * kFixedScale;
    if (!(v < kFixedLimit && v > -kFixedLimit)) return false;
    out = llrint(v);   // round half to even, on host and device alike
    return true;
}
REPLICA_HOST_DEVICE float from_fixed(std::int64_t a) { return float(double(a) / kFixedScale); }

// Where a GPU kernel reports an out-of-range term (pinned host memory).
struct FixedStatus {
    int bad = 0;
    float value = 0.0f;
};

// A term out of range: its own type, so that loss scaling (train/loss_scale.hpp) can take it for an
// overflow of the scaled gradient.
class FixedRangeError : public Error {
public:
    using Error::Error;
};

inline FixedRangeError fixed_range_error(const std::string& value)
{
    return FixedRangeError("a gradient (or a BatchNorm batch sum) of " + value + " is outside what the reproducible mode can "
                 "sum exactly (|g| < 2^22): lower the learning rate, normalise the inputs, or check the data for NaN "
                 "or huge values");
}

namespace detail {

// Terms below 2^11 in magnitude (|g| 2^40 < 2^51): adding 1.5 * 2^52 to g 2^40 as doubles rounds it
// to an integer as llrint does (to nearest, ties to even, in the default rounding mode) and leaves
// that integer in the sum's low bits, so subtracting the constant's bits gives to_fixed's integer
// with a double addition and integer ones, which a compiler vectorises.
inline constexpr std::int32_t kFastFixedBound = 0x45000000;   // 2048.0f's bits
inline constexpr double kFixedRound = 6755399441055744.0;    // 1.5 * 2^52

// Every |g[i]| below 2^11, compared as bits without the sign (so NaN and infinities are above).
inline bool below_fast_bound(const float* g, std::size_t n)
{
    std::int32_t above = 0;
    for (std::size_t i = 0; i < n; ++i)
        above |= std::int32_t((std::bit_cast<std::int32_t>(g[i]) & 0x7fffffff) >= kFastFixedBound);
    return above == 0;
}
inline void add_fixed_fast(const float* __restrict g, std::int64_t* __restrict acc, std::size_t n)
{
    const std::int64_t round_bits = std::bit_cast<std::int64_t>(kFixedRound);
    for (std::size_t i = 0; i < n; ++i)
        acc[i] += std::bit_cast<std::int64_t>(double(g[i]) * kFixedScale + kFixedRound) - round_bits;
}
inline void add_fixed_checked(const float* g, std::int64_t* acc, std::size_t n)
{
    for (std::size_t i = 0; i < n; ++i) {
        std::int64_t v;
        if (!to_fixed(g[i], v)) throw fixed_range_error(std::to_string(g[i]));
        acc[i] += v;
    }
}
inline constexpr std::size_t kFixedBlock = 256;   // elements: a block of acc stays in L1 over the rows

} // namespace detail

// acc[i] += round(g[i] * 2^40)
inline void add_fixed(const float* g, std::int64_t* acc, std::size_t n)
{
    for (std::size_t i = 0; i < n; i += detail::kFixedBlock) {
        const std::size_t m = std::min(detail::kFixedBlock, n - i);
        if (detail::below_fast_bound(g + i, m)) detail::add_fixed_fast(g + i, acc + i, m);
        else detail::add_fixed_checked(g + i, acc + i, m);
    }
}

// acc[i] += round(g[r stride + i] * 2^40) for r = 0 .. rows - 1: the rows' terms added as add_fixed
// adds each (the same integers), reading acc once for all of them.
inline void add_fixed_rows(const float* g, std::size_t rows, std::size_t stride, std::int64_t* acc, std::size_t n)
{
    for (std::size_t i = 0; i < n; i += detail::kFixedBlock) {
        const std::size_t m = std::min(detail::kFixedBlock, n - i);
        for (std::size_t r = 0; r < rows; ++r) {
            const float* row = g + r * stride + i;
            if (detail::below_fast_bound(row, m)) detail::add_fixed_fast(row, acc + i, m);
            else detail::add_fixed_checked(row, acc + i, m);
        }
    }
}

namespace detail {

// Sums below 2^51 in magnitude: their bits added to those of 1.5 * 2^52 are the double 1.5 * 2^52 +
// a, from which a double subtraction gives a exactly (from_fixed's double(a)), in a loop a compiler
// vectorises.
inline bool fixed_below_fast_bound(const std::int64_t* acc, std::size_t n)
{
    std::uint64_t above = 0;
    for (std::size_t i = 0; i < n; ++i) above |= (std::uint64_t(acc[i]) + (std::uint64_t{1} << 51)) >> 52;
    return above == 0;
}
inline void fixed_to_float_fast(const std::int64_t* __restrict acc, float* __restrict g, std::size_t n)
{
    const std::uint64_t round_bits = std::bit_cast<std::uint64_t>(kFixedRound);
    for (std::size_t i = 0; i < n; ++i)
        g[i] = float((std::bit_cast<double>(round_bits + std::uint64_t(acc[i])) - kFixedRound) / kFixedScale);
}

} // namespace detail

// g[i] = acc[i] * 2^-40 (from_fixed)
inline void fixed_to_float(const std::int64_t* acc, float* g, std::size_t n)
{
    for (std::size_t i = 0; i < n; i += detail::kFixedBlock) {
        const std::size_t m = std::min(detail::kFixedBlock, n - i);
        if (detail::fixed_below_fast_bound(acc + i, m)) {
            detail::fixed_to_float_fast(acc + i, g + i, m);
        } else {
            for (std::size_t j = i; j < i + m; ++j) g[j] = from_fixed(acc[j]);
        }
    }
}

} // namespace replica::core
