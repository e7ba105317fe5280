#pragma once
// Incremental decoding: a token model run one position at a time on the host, in float, from its
// parameters, with a cache of what later positions read (the attention's keys and values), so that a
// new token costs one position (train/generate.hpp runs it).
//
// Optional, on an op: a static member
//   static void decode(const DecodeArgs& a)     Writes a.y, the output row of position a.position,
//                                               from a.x, its input row (the first op of a token model:
//                                               the position's id, read with token_ids(a.x)), the op's
//                                               parameters a.params (host memory, float; a tied op's are
//                                               its home's) and the a.cache of the positions before.
//   static constexpr std::size_t decode_cache   Floats one sequence keeps in a.cache across positions
//                                               (default 0); decode at position p may read what the
//                                               calls at positions 0 .. p - 1 wrote, and writes
//                                               position p's share.
//   static constexpr std::size_t decode_scratch Floats a call may use at a.scratch (default 0); nothing
//                                               kept between calls.
// A row is the features of one position: (positions, features) shapes decode (features) rows. Its
// result equals the op's forward at that position of a sequence that holds the same ids at 0 .. p,
// within float rounding: decoding runs its own loops, products summed in double in a fixed order
// (no BLAS, no threads), so that the same parameters and ids give the same bits on every run.
// A composite (Chain, Residual) decodes its parts, and says whether they all can in `static constexpr
// bool decodes`; an op without decode makes generate a compile error that names it.

#include <cstddef>
#include <type_traits>

#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::layers {

struct DecodeArgs {
    const float* params = nullptr;   // the op's parameters (a tied op: those of its home)
    const float* x = nullptr;        // this position's input row
    float* y = nullptr;              // its output row
    std::size_t position = 0;        // 0 .. the model's positions - 1
    float* cache = nullptr;          // decode_cache floats, kept across the positions of a sequence
    float* scratch = nullptr;        // decode_scratch floats
};

template <class O>
concept Decodes = requires(const DecodeArgs& a) { O::decode(a); };

// Whether every op of O decodes: a composite's decodes, or a leaf's decode.
template <class O>
inline constexpr bool decodes_of = [] {
    if constexpr (requires { O::decodes; }) return bool(O::decodes);
    else return Decodes<O>;
}();
template <class O>
inline constexpr std::size_t decode_cache_of = [] {
    if constexpr (requires { O::decode_cache; }) return std::size_t(O::decode_cache);
    else return std::size_t{0};
}();
template <class O>
inline constexpr std::size_t decode_scratch_of = [] {
    if constexpr (requires { O::decode_scratch; }) return std::size_t(O::decode_scratch);
    else return std::size_t{0};
}();

// Features of one position of a (positions, ...) shape.
template <class S>
inline constexpr std::size_t row_size = S::size / S::dims[0];

// sum a[i] b[i], the float products summed in double by four accumulators in a fixed order.
inline float decode_dot(const float* a, const float* b, std::size_t n)
{
    double s[4] = {0.0, 0.0, 0.0, 0.0};
    const std::size_t whole = n - n % 4;
    for (std::size_t i = 0; i < whole; i += 4)
        for (std::size_t j = 0; j < 4; ++j) s[j] += double(a[i + j]) * double(b[i + j]);
    for (std::size_t i = whole; i < n; ++i) s[0] += double(a[i]) * double(b[i]);
    return float((s[0] + s[1]) + (s[2] + s[3]));
}

// y = W x + b for one row: W (out, in) as PyTorch lays it out, b (out) or null.
inline void decode_linear(const float* w, const float* b, const float* x, float* y, std::size_t in, std::size_t out)
{
    for (std::size_t o = 0; o < out; ++o) {
        const float d = decode_dot(w + o * in, x, in);
        y[o] = b ? d + b[o] : d;
    }
}

// Position-wise elementwise ops: y = f(x) over one row.
template <class In, class F>
void decode_map(const DecodeArgs& a, F f)
{
    for (std::size_t i = 0; i < row_size<In>; ++i) a.y[i] = f(a.x[i]);
}

} // namespace replica::layers
