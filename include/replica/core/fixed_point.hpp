#pragma once
// Order-independent sums, for the reproducible mode: each float term becomes a 64-bit integer at one
// fixed scale (2^-40), integers add associatively, so a sum of many terms is the same whatever their
// order or grouping (which replica computed which term, which order an all-reduce used). Terms must
// stay below 2^22 in magnitude, sums below 2^23; resolution 2^-40 (about 9e-13).
//
// The per-element rules are shared by the CPU loops below and the GPU kernels (backend/cuda), so both
// produce the same integers from the same floats.

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

// acc[i] += round(g[i] * 2^40)
inline void add_fixed(const float* g, std::int64_t* acc, std::size_t n)
{
    for (std::size_t i = 0; i < n; ++i) {
        std::int64_t v;
        if (!to_fixed(g[i], v)) throw fixed_range_error(std::to_string(g[i]));
        acc[i] += v;
    }
}

// g[i] = acc[i] * 2^-40
inline void fixed_to_float(const std::int64_t* acc, float* g, std::size_t n)
{
    for (std::size_t i = 0; i < n; ++i) g[i] = from_fixed(acc[i]);
}

} // namespace replica::core
