#pragma once
// Order-independent sums, for the reproducible mode: each float term becomes a 64-bit integer at one
// fixed scale (2^-40), integers add associatively, so a sum of many terms is the same whatever their
// order or grouping (which replica computed which term, which order an all-reduce used). Terms must
// stay below 2^22 in magnitude, sums below 2^23; resolution 2^-40 (about 9e-13).

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "replica/core/error.hpp"

namespace replica::core {

inline constexpr double kFixedScale = 1099511627776.0;   // 2^40

// acc[i] += round(g[i] * 2^40)
inline void add_fixed(const float* g, std::int64_t* acc, std::size_t n)
{
    for (std::size_t i = 0; i < n; ++i) {
        const double v = double(g[i]) * kFixedScale;
        if (!(std::abs(v) < 4611686018427387904.0))   // 2^62: room for sums; also catches NaN
            throw Error("a gradient of " + std::to_string(g[i]) + " is outside what the reproducible mode can sum "
                        "exactly (|g| < 2^22): lower the learning rate or check the data for NaN or huge values");
        acc[i] += std::llrint(v);
    }
}

// g[i] = acc[i] * 2^-40
inline void fixed_to_float(const std::int64_t* acc, float* g, std::size_t n)
{
    for (std::size_t i = 0; i < n; ++i) g[i] = float(double(acc[i]) / kFixedScale);
}

} // namespace replica::core
