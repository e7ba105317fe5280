#pragma once
// Size arithmetic on numbers that come from input (files, options, data sets): a product or sum that
// does not fit in std::size_t is an Error naming what was being sized, never a wrapped-around value.

#include <cstddef>
#include <limits>
#include <string>

#include "replica/core/config.hpp"
#include "replica/core/error.hpp"

namespace REPLICA_NAMESPACE::core {

// a * b, or Error "<what>: a x b does not fit in 64 bits ..." when it overflows.
inline std::size_t checked_mul(std::size_t a, std::size_t b, const std::string& what)
{
    std::size_t out = 0;
    if (__builtin_mul_overflow(a, b, &out))
        throw Error(what + ": " + std::to_string(a) + " x " + std::to_string(b) +
                    " does not fit in a 64-bit size: one of the sizes is far too large; use a smaller value");
    return out;
}

// a * b * c, each product checked as above.
inline std::size_t checked_mul(std::size_t a, std::size_t b, std::size_t c, const std::string& what)
{
    return checked_mul(checked_mul(a, b, what), c, what);
}

// a + b, or Error as above.
inline std::size_t checked_add(std::size_t a, std::size_t b, const std::string& what)
{
    std::size_t out = 0;
    if (__builtin_add_overflow(a, b, &out))
        throw Error(what + ": " + std::to_string(a) + " + " + std::to_string(b) +
                    " does not fit in a 64-bit size: one of the sizes is far too large; use a smaller value");
    return out;
}

} // namespace replica::core
