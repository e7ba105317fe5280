#pragma once
// Window: the geometry of a 2-D sliding window (convolution, pooling). Plain data, shared by backends.

namespace replica::core {

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

} // namespace replica::core
