#pragma once
// The reproducible mode's family: exact sums of float gradients in fixed point (core/fixed_point.hpp),
// whose result does not depend on the order of their terms, and the switch to deterministic algorithms
// (model/exact_gradient.hpp; what every family shares: kernels/kernels.hpp). Float and 64-bit
// integers only, whatever the model's element type.

#include <concepts>
#include <cstddef>
#include <cstdint>

#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::backend::kernels {

template <class C>
concept ReproducibleKernels = requires(const C& ctx, const float* g, float* out, std::int64_t* acc,
                                       const std::int64_t* sum, std::size_t count, std::size_t rows, std::size_t stride) {
    // From now on this context's ops give the same bits on the same inputs in every run (deterministic
    // algorithms, chosen without timing); what was planned before is planned again. Host work: the
    // first call may wait for the work queued so far, a later one does nothing; it queues nothing.
    make_deterministic(ctx);
    // acc = 0 (queued).
    zero_fixed(ctx, acc, count);
    // acc += g in fixed point (queued). A term out of the fixed-point range throws
    // core::FixedRangeError, here or from the next check_fixed.
    add_fixed(ctx, g, acc, count);
    // acc += g[r stride, r stride + count) in fixed point for r < rows, each term as add_fixed adds it
    // (queued; the same integers as rows calls of add_fixed, in one pass over acc).
    add_fixed_rows(ctx, g, rows, stride, acc, count);
    // out = sum as float, assigned (queued).
    fixed_to_float(ctx, sum, out, count);
    // Throws core::FixedRangeError where an add_fixed since the last check met a term out of range.
    // Call it after synchronize(); it queues nothing.
    check_fixed(ctx);
};

} // namespace replica::backend::kernels
