#pragma once
// Counter-based random numbers (Philox4x32-10, Salmon et al., SC'11).
//
// Every random choice in replica is a pure function of (seed, stream, layer, index): nothing depends
// on which replica, thread or device draws it, or in which order. That is what lets a model with
// dropout train the same on 1 or N replicas.

#include <array>
#include <cstdint>

#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::core {

// What a random number is for; part of the counter so that streams never overlap.
enum class Stream : std::uint32_t { init = 1, dropout = 2, shuffle = 3, synthetic = 4, augment = 5, split = 6,
                                    text_window = 7, sample = 8 };

REPLICA_HOST_DEVICE std::array<std::uint32_t, 4> philox4x32(std::array<std::uint32_t, 4> c,
                                                           std::array<std::uint32_t, 2> k)
{
    constexpr std::uint32_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;
    constexpr std::uint32_t w0 = 0x9E3779B9u, w1 = 0xBB67AE85u;
    for (int round = 0; round < 10; ++round) {
        std::uint64_t p0 = std::uint64_t{m0} * c[0];
        std::uint64_t p1 = std::uint64_t{m1} * c[2];
        c = {std::uint32_t(p1 >> 32) ^ c[1] ^ k[0], std::uint32_t(p1),
             std::uint32_t(p0 >> 32) ^ c[3] ^ k[1], std::uint32_t(p0)};
        k[0] += w0;
        k[1] += w1;
    }
    return c;
}

// 32 random bits for element `element` of item `item` in (stream, layer) under `seed`.
REPLICA_HOST_DEVICE std::uint32_t random_bits(std::uint64_t seed, Stream stream, std::uint32_t layer,
                                              std::uint64_t item, std::uint32_t element)
{
    auto r = philox4x32({element, std::uint32_t(item), std::uint32_t(item >> 32),
                         (std::uint32_t(stream) << 24) ^ layer},
                        {std::uint32_t(seed), std::uint32_t(seed >> 32)});
    return r[0];
}

// Uniform in [0, 1) with 24 random bits.
REPLICA_HOST_DEVICE float random_uniform(std::uint64_t seed, Stream stream, std::uint32_t layer,
                                         std::uint64_t item, std::uint32_t element)
{
    return float(random_bits(seed, stream, layer, item, element) >> 8) * (1.0f / 16777216.0f);
}

} // namespace replica::core
