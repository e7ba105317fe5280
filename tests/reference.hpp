#pragma once
// Float64 references of the layers' forward passes, written from each layer's definition (its
// header's first comment), not from a backend: the forward-value tests compare the CPU backend with
// them, and the numerical gradient checks take their finite differences on them (test_layers.cpp).
//
//   Reference<L, In>::forward(x, p, n, at) -> y
//     x: n samples of In; p: L's parameters in its layout (L::op<In>::param_count values); at: the pass
//     (training or not, dropout's seed and first sample) and L's first layer id; y: n samples of L's
//     output shape. Everything in double.
//
// A layer kind without a specialisation has no reference (HasReference<L, In> is false).

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "replica/replica.hpp"

namespace replica::testing {

// ---------------------------------------------------------------------------------------------
// Convolution and pooling over explicit geometries.

struct ConvGeometry {
    std::size_t n, c, h, w, out, k, stride, pad, oh, ow;
};

// y[s][co][oy][ox] = b[co] + sum x[s][ci][oy*S - P + ki][ox*S - P + kj] * w[co][ci][ki][kj] (zero
// outside); no bias when bias is null.
template <class X, class W>
std::vector<double> ref_conv2d(const ConvGeometry& g, const X* x, const W* w, const W* bias)
{
    std::vector<double> y(g.n * g.out * g.oh * g.ow);
    for (std::size_t s = 0; s < g.n; ++s)
        for (std::size_t co = 0; co < g.out; ++co)
            for (std::size_t oy = 0; oy < g.oh; ++oy)
                for (std::size_t ox = 0; ox < g.ow; ++ox) {
                    double acc = bias ? double(bias[co]) : 0.0;
                    for (std::size_t ci = 0; ci < g.c; ++ci)
                        for (std::size_t ki = 0; ki < g.k; ++ki)
                            for (std::size_t kj = 0; kj < g.k; ++kj) {
                                const long iy = long(oy * g.stride + ki) - long(g.pad);
                                const long ix = long(ox * g.stride + kj) - long(g.pad);
                                if (iy < 0 || ix < 0 || iy >= long(g.h) || ix >= long(g.w)) continue;
                                acc += double(x[((s * g.c + ci) * g.h + std::size_t(iy)) * g.w + std::size_t(ix)]) *
                                       double(w[((co * g.c + ci) * g.k + ki) * g.k + kj]);
                            }
                    y[((s * g.out + co) * g.oh + oy) * g.ow + ox] = acc;
                }
    return y;
}

// y[s][co][l] = b[co] + sum x[s][ci][l*S - P + k] * w[co][ci][k] (g.h and g.oh are 1).
template <class X, class W>
std::vector<double> ref_conv1d(const ConvGeometry& g, const X* x, const W* w, const W* bias)
{
    std::vector<double> y(g.n * g.out * g.ow);
    for (std::size_t s = 0; s < g.n; ++s)
        for (std::size_t co = 0; co < g.out; ++co)
            for (std::size_t ol = 0; ol < g.ow; ++ol) {
                double acc = bias ? double(bias[co]) : 0.0;
                for (std::size_t ci = 0; ci < g.c; ++ci)
                    for (std::size_t kk = 0; kk < g.k; ++kk) {
                        const long il = long(ol * g.stride + kk) - long(g.pad);
                        if (il < 0 || il >= long(g.w)) continue;
                        acc += double(x[(s * g.c + ci) * g.w + std::size_t(il)]) * double(w[(co * g.c + ci) * g.k + kk]);
                    }
                y[(s * g.out + co) * g.ow + ol] = acc;
            }
    return y;
}

// Scatter: y[co][i*S - P + ki][j*S - P + kj] += x[ci][i][j] * w[ci][co][ki][kj], plus b[co].
template <class X, class W>
std::vector<double> ref_conv_transpose2d(const ConvGeometry& g, const X* x, const W* w, const W* bias)
{
    std::vector<double> y(g.n * g.out * g.oh * g.ow);
    for (std::size_t s = 0; s < g.n; ++s) {
        for (std::size_t co = 0; co < g.out; ++co)
            for (std::size_t p = 0; p < g.oh * g.ow; ++p) y[(s * g.out + co) * g.oh * g.ow + p] = bias ? double(bias[co]) : 0.0;
        for (std::size_t ci = 0; ci < g.c; ++ci)
            for (std::size_t i = 0; i < g.h; ++i)
                for (std::size_t j = 0; j < g.w; ++j)
                    for (std::size_t co = 0; co < g.out; ++co)
                        for (std::size_t ki = 0; ki < g.k; ++ki)
                            for (std::size_t kj = 0; kj < g.k; ++kj) {
                                const long oy = long(i * g.stride + ki) - long(g.pad);
                                const long ox = long(j * g.stride + kj) - long(g.pad);
                                if (oy < 0 || ox < 0 || oy >= long(g.oh) || ox >= long(g.ow)) continue;
                                y[((s * g.out + co) * g.oh + std::size_t(oy)) * g.ow + std::size_t(ox)] +=
                                    double(x[((s * g.c + ci) * g.h + i) * g.w + j]) *
                                    double(w[((ci * g.out + co) * g.k + ki) * g.k + kj]);
                            }
    }
    return y;
}

// Max or mean over each kh x kw window; taps outside the input are skipped (max) or count as zeros
// (mean, whose divisor is always kh * kw).
struct PoolGeometry {
    std::size_t n, c, h, w, kh, kw, sh, sw, ph, pw, oh, ow;
};
enum class Pooling { max, mean };
template <class X>
std::vector<double> ref_pool(Pooling kind, const PoolGeometry& g, const X* x)
{
    std::vector<double> y(g.n * g.c * g.oh * g.ow);
    for (std::size_t plane = 0; plane < g.n * g.c; ++plane)
        for (std::size_t oy = 0; oy < g.oh; ++oy)
            for (std::size_t ox = 0; ox < g.ow; ++ox) {
                double best = -std::numeric_limits<double>::infinity(), sum = 0.0;
                for (std::size_t ki = 0; ki < g.kh; ++ki)
                    for (std::size_t kj = 0; kj < g.kw; ++kj) {
                        const long iy = long(oy * g.sh + ki) - long(g.ph);
                        const long ix = long(ox * g.sw + kj) - long(g.pw);
                        if (iy < 0 || ix < 0 || iy >= long(g.h) || ix >= long(g.w)) continue;
                        const double v = double(x[(plane * g.h + std::size_t(iy)) * g.w + std::size_t(ix)]);
                        best = std::max(best, v);
                        sum += v;
                    }
                y[(plane * g.oh + oy) * g.ow + ox] = kind == Pooling::max ? best : sum / double(g.kh * g.kw);
            }
    return y;
}

// ---------------------------------------------------------------------------------------------
// Reference<L, In>.

struct At {
    model::Pass pass;
    std::uint32_t layer_id = 0;
};

template <class L, class In>
struct Reference;

template <class L, class In>
concept HasReference = requires(const double* v, std::size_t n, const At& at) {
    { Reference<L, In>::forward(v, v, n, at) } -> std::same_as<std::vector<double>>;
};

namespace detail {
template <class L, class In>
using ref_op = typename L::template op<In>;
template <class L, class In>
using ref_out = typename ref_op<L, In>::output_shape;
template <class... Ts>
struct type_list {};

// y = f(x) elementwise.
template <class F>
std::vector<double> map(const double* x, std::size_t count, F f)
{
    std::vector<double> y(count);
    for (std::size_t i = 0; i < count; ++i) y[i] = f(x[i]);
    return y;
}
} // namespace detail

template <std::size_t Out, std::size_t K, std::size_t S, std::size_t P, Bias B, class In>
struct Reference<Conv2d<Out, K, S, P, B>, In> {
    static std::vector<double> forward(const double* x, const double* p, std::size_t n, const At&)
    {
        using O = detail::ref_out<Conv2d<Out, K, S, P, B>, In>;
        constexpr std::size_t weights = Out * In::dims[0] * K * K;
        const ConvGeometry g{n, In::dims[0], In::dims[1], In::dims[2], Out, K, S, P, O::dims[1], O::dims[2]};
        return ref_conv2d(g, x, p, B == Bias::yes ? p + weights : nullptr);
    }
};

template <std::size_t Out, std::size_t K, std::size_t S, std::size_t P, Bias B, class In>
struct Reference<Conv1d<Out, K, S, P, B>, In> {
    static std::vector<double> forward(const double* x, const double* p, std::size_t n, const At&)
    {
        using O = detail::ref_out<Conv1d<Out, K, S, P, B>, In>;
        constexpr std::size_t weights = Out * In::dims[0] * K;
        const ConvGeometry g{n, In::dims[0], 1, In::dims[1], Out, K, S, P, 1, O::dims[1]};
        return ref_conv1d(g, x, p, B == Bias::yes ? p + weights : nullptr);
    }
};

template <std::size_t Out, std::size_t K, std::size_t S, std::size_t P, Bias B, class In>
struct Reference<ConvTranspose2d<Out, K, S, P, B>, In> {
    static std::vector<double> forward(const double* x, const double* p, std::size_t n, const At&)
    {
        using O = detail::ref_out<ConvTranspose2d<Out, K, S, P, B>, In>;
        constexpr std::size_t weights = In::dims[0] * Out * K * K;
        const ConvGeometry g{n, In::dims[0], In::dims[1], In::dims[2], Out, K, S, P, O::dims[1], O::dims[2]};
        return ref_conv_transpose2d(g, x, p, B == Bias::yes ? p + weights : nullptr);
    }
};

// y = W x + b, W (Out, in); over a sequence (positions, in), the same at each position.
template <std::size_t Out, class In>
struct Reference<Linear<Out>, In> {
    static std::vector<double> forward(const double* x, const double* p, std::size_t n, const At&)
    {
        constexpr std::size_t rows = In::rank == 1 ? 1 : In::dims[0], in = In::size / rows;
        std::vector<double> y(n * rows * Out);
        for (std::size_t s = 0; s < n * rows; ++s)
            for (std::size_t o = 0; o < Out; ++o) {
                double acc = p[Out * in + o];
                for (std::size_t i = 0; i < in; ++i) acc += p[o * in + i] * x[s * in + i];
                y[s * Out + o] = acc;
            }
        return y;
    }
};

// Each row of the last axis: (x - mean) / sqrt(biased var + eps) * weight + bias (affine).
template <LayerNormOptions O, class In>
struct Reference<LayerNorm<O>, In> {
    static std::vector<double> forward(const double* x, const double* p, std::size_t n, const At&)
    {
        constexpr std::size_t rows = In::rank == 1 ? 1 : In::dims[0], F = In::size / rows;
        std::vector<double> y(n * In::size);
        for (std::size_t r = 0; r < n * rows; ++r) {
            const double* xr = x + r * F;
            double mean = 0.0, var = 0.0;
            for (std::size_t f = 0; f < F; ++f) mean += xr[f];
            mean /= double(F);
            for (std::size_t f = 0; f < F; ++f) var += (xr[f] - mean) * (xr[f] - mean);
            var /= double(F);
            for (std::size_t f = 0; f < F; ++f) {
                const double h = (xr[f] - mean) / std::sqrt(var + double(O.eps));
                y[r * F + f] = O.affine ? h * p[f] + p[F + f] : h;
            }
        }
        return y;
    }
};

// qkv = x Wqkv^T + bqkv; per head h, o_h = softmax over j <= i of (q_i . k_j / sqrt(D / Heads)) v_j;
// y = o Wo^T + bo.
template <std::size_t Heads, class In>
struct Reference<CausalSelfAttention<Heads>, In> {
    static std::vector<double> forward(const double* x, const double* p, std::size_t n, const At& at)
    {
        constexpr std::size_t T = In::dims[0], D = In::dims[1], hd = D / Heads;
        const std::vector<double> qkv = Reference<Linear<3 * D>, In>::forward(x, p, n, at);
        std::vector<double> o(n * T * D), w(T);
        for (std::size_t s = 0; s < n; ++s)
            for (std::size_t h = 0; h < Heads; ++h)
                for (std::size_t i = 0; i < T; ++i) {
                    const double* q = qkv.data() + (s * T + i) * 3 * D + h * hd;
                    double most = -1e300, sum = 0.0;
                    for (std::size_t j = 0; j <= i; ++j) {
                        const double* k = qkv.data() + (s * T + j) * 3 * D + D + h * hd;
                        double dot = 0.0;
                        for (std::size_t c = 0; c < hd; ++c) dot += q[c] * k[c];
                        w[j] = dot / std::sqrt(double(hd));
                        most = std::max(most, w[j]);
                    }
                    for (std::size_t j = 0; j <= i; ++j) sum += (w[j] = std::exp(w[j] - most));
                    for (std::size_t c = 0; c < hd; ++c) {
                        double acc = 0.0;
                        for (std::size_t j = 0; j <= i; ++j) acc += w[j] * qkv[(s * T + j) * 3 * D + 2 * D + h * hd + c];
                        o[(s * T + i) * D + h * hd + c] = acc / sum;
                    }
                }
        return Reference<Linear<D>, In>::forward(o.data(), p + 3 * D * D + 3 * D, n, at);
    }
};

template <class In>
struct Reference<ReLU, In> {
    static std::vector<double> forward(const double* x, const double*, std::size_t n, const At&)
    {
        return detail::map(x, n * In::size, [](double v) { return std::max(v, 0.0); });
    }
};
template <class In>
struct Reference<Sigmoid, In> {
    static std::vector<double> forward(const double* x, const double*, std::size_t n, const At&)
    {
        return detail::map(x, n * In::size, [](double v) { return 1.0 / (1.0 + std::exp(-v)); });
    }
};
template <class In>
struct Reference<Tanh, In> {
    static std::vector<double> forward(const double* x, const double*, std::size_t n, const At&)
    {
        return detail::map(x, n * In::size, [](double v) { return std::tanh(v); });
    }
};
template <class In>
struct Reference<GELU, In> {
    static std::vector<double> forward(const double* x, const double*, std::size_t n, const At&)
    {
        return detail::map(x, n * In::size, [](double v) { return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))); });
    }
};
template <class In>
struct Reference<GELUWith<GeluApprox::tanh>, In> {
    static std::vector<double> forward(const double* x, const double*, std::size_t n, const At&)
    {
        return detail::map(x, n * In::size, [](double v) {
            return 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / 3.14159265358979323846) * (v + 0.044715 * v * v * v)));
        });
    }
};
template <class In>
struct Reference<Identity, In> {
    static std::vector<double> forward(const double* x, const double*, std::size_t n, const At&)
    {
        return std::vector<double>(x, x + n * In::size);
    }
};
// (channels, pixels) order: the same values, seen flat.
template <class In>
struct Reference<Flatten, In> : Reference<Identity, In> {};

// In training, element e of sample s is kept, scaled by 1 / (1 - P), where the dropout stream's
// uniform for (seed, layer id, global sample, e) is at least P; the identity in evaluation.
template <double P, class In>
struct Reference<Dropout<P>, In> {
    static std::vector<double> forward(const double* x, const double*, std::size_t n, const At& at)
    {
        std::vector<double> y(x, x + n * In::size);
        if (!at.pass.training) return y;
        for (std::size_t s = 0; s < n; ++s)
            for (std::size_t e = 0; e < In::size; ++e) {
                const float u = core::random_uniform(at.pass.seed, core::Stream::dropout, at.layer_id,
                                                     at.pass.first_sample + s, std::uint32_t(e));
                y[s * In::size + e] = u >= float(P) ? y[s * In::size + e] / (1.0 - P) : 0.0;
            }
        return y;
    }
};

template <std::size_t K, std::size_t S, std::size_t P, Rounding R, class In>
struct Reference<MaxPool2d<K, S, P, R>, In> {
    static std::vector<double> forward(const double* x, const double*, std::size_t n, const At&)
    {
        using O = detail::ref_out<MaxPool2d<K, S, P, R>, In>;
        return ref_pool(Pooling::max, {n, In::dims[0], In::dims[1], In::dims[2], K, K, S, S, P, P, O::dims[1], O::dims[2]}, x);
    }
};
template <std::size_t K, std::size_t S, std::size_t P, class In>
struct Reference<AvgPool2d<K, S, P>, In> {
    static std::vector<double> forward(const double* x, const double*, std::size_t n, const At&)
    {
        using O = detail::ref_out<AvgPool2d<K, S, P>, In>;
        return ref_pool(Pooling::mean, {n, In::dims[0], In::dims[1], In::dims[2], K, K, S, S, P, P, O::dims[1], O::dims[2]}, x);
    }
};
template <std::size_t K, std::size_t S, class In>
struct Reference<MaxPool1d<K, S>, In> {
    static std::vector<double> forward(const double* x, const double*, std::size_t n, const At&)
    {
        using O = detail::ref_out<MaxPool1d<K, S>, In>;
        return ref_pool(Pooling::max, {n, In::dims[0], 1, In::dims[1], 1, K, 1, S, 0, 0, 1, O::dims[1]}, x);
    }
};
template <class In>
struct Reference<GlobalAvgPool, In> {
    static std::vector<double> forward(const double* x, const double*, std::size_t n, const At&)
    {
        return ref_pool(Pooling::mean, {n, In::dims[0], In::dims[1], In::dims[2], In::dims[1], In::dims[2], 1, 1, 0, 0, 1, 1}, x);
    }
};

// y = weight * (x - mean) / sqrt(var + eps) + bias per channel (the first dimension), with the
// options' eps, and weight 1 and bias 0 without affine; in training (and without running statistics
// always) the mean and biased variance of the channel's n * inner values, in evaluation the initial
// running estimates (0 and 1).
template <std::size_t Rank, layers::BatchStats Stats, layers::BatchNormOptions Options, class In>
struct Reference<layers::BatchNorm<Rank, Stats, Options>, In> {
    static std::vector<double> forward(const double* x, const double* p, std::size_t n, const At& at)
    {
        constexpr std::size_t C = In::dims[0], inner = In::size / C;
        const double eps = double(Options.eps);
        std::vector<double> y(n * In::size);
        for (std::size_t c = 0; c < C; ++c) {
            double mean = 0.0, var = 1.0;
            if (at.pass.training || !Options.track_running_stats) {
                double sum = 0.0, squares = 0.0;
                for (std::size_t s = 0; s < n; ++s)
                    for (std::size_t j = 0; j < inner; ++j) sum += x[(s * C + c) * inner + j];
                mean = sum / double(n * inner);
                for (std::size_t s = 0; s < n; ++s)
                    for (std::size_t j = 0; j < inner; ++j) {
                        const double d = x[(s * C + c) * inner + j] - mean;
                        squares += d * d;
                    }
                var = squares / double(n * inner);
            }
            const double weight = Options.affine ? p[c] : 1.0, bias = Options.affine ? p[C + c] : 0.0;
            const double scale = weight / std::sqrt(var + eps);
            for (std::size_t s = 0; s < n; ++s)
                for (std::size_t j = 0; j < inner; ++j) {
                    const std::size_t i = (s * C + c) * inner + j;
                    y[i] = (x[i] - mean) * scale + bias;
                }
        }
        return y;
    }
};

// Composites: each part on its own parameters (in order) and layer ids (from at.layer_id on).
namespace detail {
template <class In, class... Es>
struct RefChain;
template <class In>
struct RefChain<In> {
    static std::vector<double> forward(const double* x, const double*, std::size_t n, const At&)
    {
        return std::vector<double>(x, x + n * In::size);
    }
};
template <class In, class E, class... Es>
struct RefChain<In, E, Es...> {
    static std::vector<double> forward(const double* x, const double* p, std::size_t n, const At& at)
    {
        if constexpr (model::is_input<E>::value) {
            return RefChain<In, Es...>::forward(x, p, n, at);
        } else {
            using O = ref_op<E, In>;
            const std::vector<double> y = Reference<E, In>::forward(x, p, n, at);
            return RefChain<typename O::output_shape, Es...>::forward(y.data(), p + O::param_count, n,
                                                                      At{at.pass, at.layer_id + O::layer_count});
        }
    }
};
} // namespace detail

namespace detail {
// Whether every layer of a chain from In has a reference.
template <class In, class... Es>
constexpr bool chain_has_reference()
{
    if constexpr (sizeof...(Es) == 0) {
        return true;
    } else {
        return []<class E, class... Rest>(type_list<E, Rest...>*) {
            if constexpr (model::is_input<E>::value) return chain_has_reference<In, Rest...>();
            else if constexpr (!HasReference<E, In>) return false;
            else return chain_has_reference<ref_out<E, In>, Rest...>();
        }(static_cast<type_list<Es...>*>(nullptr));
    }
}
} // namespace detail

template <class... Es, class In>
    requires(detail::chain_has_reference<In, Es...>())
struct Reference<Sequential<Es...>, In> : detail::RefChain<In, Es...> {};

// Body(x) + x, or Body(x) + Shortcut(x): the body's parameters and layer ids first.
template <class Body, class Shortcut, class In>
    requires(HasReference<Body, In> && (std::is_void_v<Shortcut> || HasReference<Shortcut, In>))
struct Reference<Residual<Body, Shortcut>, In> {
    static std::vector<double> forward(const double* x, const double* p, std::size_t n, const At& at)
    {
        using O = detail::ref_op<Body, In>;
        std::vector<double> y = Reference<Body, In>::forward(x, p, n, at);
        if constexpr (std::is_void_v<Shortcut>) {
            for (std::size_t i = 0; i < y.size(); ++i) y[i] += x[i];
        } else {
            const std::vector<double> s = Reference<Shortcut, In>::forward(x, p + O::param_count, n,
                                                                           At{at.pass, at.layer_id + O::layer_count});
            for (std::size_t i = 0; i < y.size(); ++i) y[i] += s[i];
        }
        return y;
    }
};

// Each branch on the same input; a sample's outputs are the branches' in order (concatenated on
// channels).
template <class... Bs, class In>
    requires(HasReference<Bs, In> && ...)
struct Reference<Concat<Bs...>, In> {
    static std::vector<double> forward(const double* x, const double* p, std::size_t n, const At& at)
    {
        constexpr std::size_t size = detail::ref_out<Concat<Bs...>, In>::size;
        std::vector<double> y(n * size);
        std::size_t offset = 0;   // within a sample
        At part = at;
        auto branch = [&]<class B>(B*) {
            using O = detail::ref_op<B, In>;
            constexpr std::size_t out = O::output_shape::size;
            const std::vector<double> b = Reference<B, In>::forward(x, p, n, part);
            for (std::size_t s = 0; s < n; ++s) std::copy_n(b.begin() + long(s * out), out, y.begin() + long(s * size + offset));
            offset += out;
            p += O::param_count;
            part.layer_id += O::layer_count;
        };
        (branch(static_cast<Bs*>(nullptr)), ...);
        return y;
    }
};

} // namespace replica::testing
