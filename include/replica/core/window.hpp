#pragma once
// Window: the geometry of a 2-D sliding window (convolution, pooling). Plain data, shared by backends.

#include <cstdint>
#include <limits>
#include <type_traits>

#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::core {

// The geometry of a 2-D sliding window (a 1-D one has h = kh = 1, sh = 1, ph = 0).
struct Window {
    int c, h, w;     // input channels and size
    int kh, kw;      // kernel
    int sh, sw;      // stride
    int ph, pw;      // zero padding
    int oh, ow;      // output size
    constexpr int in_size() const { return c * h * w; }
    constexpr int out_pixels() const { return oh * ow; }
    constexpr int col_rows() const { return c * kh * kw; }
};

// Where a max pooling output's maximum lies within its window: 0 .. kh*kw - 1, rows then columns
// (positions in the padding or past the input included), in the smallest unsigned type that also
// holds pool_no_position<g>, the mark of a window that has no maximum (the GPU writes it when every
// element is NaN or -inf; the CPU then names the window's first element inside the input).
template <Window g>
struct PoolPosition {
    static_assert(g.kh * g.kw < 65536,
                  "max pooling windows hold at most 65535 elements: use a smaller window, or pool in two steps");
    using type = std::conditional_t<(g.kh * g.kw < 256), std::uint8_t, std::uint16_t>;
};
template <Window g>
using pool_position_t = typename PoolPosition<g>::type;

template <Window g>
inline constexpr pool_position_t<g> pool_no_position = std::numeric_limits<pool_position_t<g>>::max();

// The offset in its input plane of position p of output (oy, ox)'s window (p inside the input).
REPLICA_HOST_DEVICE constexpr int pool_input_offset(const Window& g, int oy, int ox, int p)
{
    return (oy * g.sh - g.ph + p / g.kw) * g.w + ox * g.sw - g.pw + p % g.kw;
}

} // namespace replica::core
