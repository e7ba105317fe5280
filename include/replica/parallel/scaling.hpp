#pragma once
// Scaling: what a batch size means when training on several devices.
//   Scaling::strong  batch_size is the GLOBAL batch, split over the devices: the same optimisation
//                    problem as on one device (the default).
//   Scaling::weak    batch_size is PER DEVICE: the global batch is devices x batch_size, so an epoch
//                    takes fewer steps; optionally the learning rate is scaled by the device count.

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>

#include "replica/core/config.hpp"
#include "replica/core/error.hpp"

namespace REPLICA_NAMESPACE::parallel {

enum class Scaling { strong, weak };

inline std::size_t global_batch(std::size_t batch_size, std::size_t devices, Scaling s)
{
    return s == Scaling::strong ? batch_size : batch_size * devices;
}

inline Scaling parse_scaling(std::string_view text)
{
    if (text == "strong") return Scaling::strong;
    if (text == "weak") return Scaling::weak;
    throw Error("bad scaling '" + std::string(text) + "': write strong (global batch) or weak (batch per device)");
}

// Replica r's share of n samples over `replicas`: the first n % replicas replicas take one more.
struct Share {
    std::size_t offset, count;
};
inline Share share(std::size_t n, std::size_t replicas, std::size_t r)
{
    const std::size_t base = n / replicas, extra = n % replicas;
    return {r * base + std::min(r, extra), base + (r < extra ? 1 : 0)};
}

} // namespace replica::parallel

namespace REPLICA_NAMESPACE {
using parallel::Scaling;
} // namespace replica
