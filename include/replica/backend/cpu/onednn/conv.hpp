#pragma once
// Convolutions through oneDNN (REPLICA_ONEDNN builds): the plans cpu/conv.hpp runs where oneDNN is
// chosen for a layer (cpu/conv_path.hpp). A plan holds the primitives of one pass of one shape, the
// memory objects bound to the caller's tensors, and the memory oneDNN's preferred layouts and
// scratchpads need: made once per key in the context's Runtime, then run with no allocation.
//
// Tensors as cpu/conv.hpp has them: x (n, c, h, w), y and dy (n, cout, oh, ow), w (cout, c, kh, kw)
// of float, or of bf16 where the key says bf16; dw and b, db (cout) of float. The direct algorithm,
// and the right padding that makes oneDNN's output size the layer's (floor division), which may be
// smaller than the left. A transposed convolution (the key's `transposed`: oneDNN's deconvolution)
// keeps cpu/conv.hpp's description of it, the adjoint of the convolution with window (c, h, w) ->
// (oh, ow): its x is (n, cout, oh, ow), its y (n, c, h, w), its w PyTorch's (cout, c, kh, kw) for
// ConvTranspose2d (input channels first), its bias (c).
//
// bf16 (the CPU's bf16 products, where it has them: native_bf16()): oneDNN multiplies the bf16
// operands and sums in float; y is rounded to bf16 once, after the bias and the ReLU; dx is computed
// in float and rounded once, after its sum with dx's values where it is added to them; dw and db stay
// float. That is the library's rule for a bf16 convolution (cpu/conv.hpp), in oneDNN's order of sums.

#include <compare>
#include <cstddef>
#include <memory>
#include <string_view>
#include <unordered_map>

#include "replica/backend/cpu/onednn/runtime.hpp"
#include "replica/core/config.hpp"
#include "replica/core/window.hpp"

namespace REPLICA_NAMESPACE::backend::cpu::onednn {

// What a convolution plan is made for. `data`: the backward pass computes the input gradient;
// `relu`: the forward pass applies a ReLU to its output.
struct ConvKey {
    int c, h, w, kh, kw, sh, sw, ph, pw, oh, ow, cout;
    std::size_t n;
    bool bias, relu, data;
    int threads;
    bool bf16 = false;         // x, w, y, dy and dx of bf16
    bool transposed = false;   // a transposed convolution (above)
    auto operator<=>(const ConvKey&) const = default;
};

inline ConvKey conv_key(const core::Window& g, int cout, std::size_t n, bool bias, bool relu, bool data, int threads,
                        bool bf16 = false, bool transposed = false)
{
    return {g.c, g.h, g.w, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.oh, g.ow, cout, n, bias, relu, data, threads, bf16,
            transposed};
}

namespace detail {
// A key's primitives: oneDNN's convolution, or its deconvolution for a transposed key (the same
// descriptors' arguments, the same queries).
struct Direct {
    using forward = dnnl::convolution_forward;
    using backward_data = dnnl::convolution_backward_data;
    using backward_weights = dnnl::convolution_backward_weights;
    static constexpr dnnl::algorithm algorithm = dnnl::algorithm::convolution_direct;
};
struct Transposed {
    using forward = dnnl::deconvolution_forward;
    using backward_data = dnnl::deconvolution_backward_data;
    using backward_weights = dnnl::deconvolution_backward_weights;
    static constexpr dnnl::algorithm algorithm = dnnl::algorithm::deconvolution_direct;
};
// f(Direct{}) or f(Transposed{}), as the key says.
template <class F>
void by_kind(const ConvKey& k, F&& f)
{
    if (k.transposed) f(Transposed{});
    else f(Direct{});
}

// Dimensions as oneDNN takes them: x the source, y the destination, w (out, in, kh, kw).
struct ConvDims {
    dnnl::memory::dims x, w, b, y, strides, left, right;
};
inline ConvDims conv_dims(const ConvKey& k)
{
    using dim = dnnl::memory::dim;
    const dim n = dim(k.n);
    // The right padding: the convolution's output (or the transposed one's input) size is (oh, ow).
    const dnnl::memory::dims right{dim(k.oh - 1) * k.sh + k.kh - k.h - k.ph, dim(k.ow - 1) * k.sw + k.kw - k.w - k.pw};
    if (k.transposed)
        return {{n, k.cout, k.oh, k.ow}, {k.c, k.cout, k.kh, k.kw}, {k.c}, {n, k.c, k.h, k.w}, {k.sh, k.sw}, {k.ph, k.pw}, right};
    return {{n, k.c, k.h, k.w}, {k.cout, k.c, k.kh, k.kw}, {k.cout}, {n, k.cout, k.oh, k.ow}, {k.sh, k.sw}, {k.ph, k.pw}, right};
}
// The weights in the library's layout: (out, in, kh, kw), or a transposed convolution's (in, out, kh, kw).
inline dnnl::memory::desc plain_weights(const ConvKey& k, const ConvDims& d,
                                        dnnl::memory::data_type type = dnnl::memory::data_type::f32)
{
    if (k.transposed) return {d.w, type, dnnl::memory::format_tag::iohw};
    return plain(d.w, type);
}
// The activations' and weights' type of a key.
inline dnnl::memory::data_type values(const ConvKey& k)
{
    return k.bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
}
template <class Kind>
typename Kind::forward::primitive_desc forward_pd(const dnnl::engine& e, const ConvKey& k, const dnnl::primitive_attr& attr)
{
    using desc = typename Kind::forward::desc;
    const ConvDims d = conv_dims(k);
    const auto t = values(k);
    const auto p = dnnl::prop_kind::forward_training;
    return {k.bias ? desc(p, Kind::algorithm, any(d.x, t), any(d.w, t), plain(d.b), any(d.y, t), d.strides, d.left, d.right)
                   : desc(p, Kind::algorithm, any(d.x, t), any(d.w, t), any(d.y, t), d.strides, d.left, d.right),
            attr, e};
}
// A bf16 plan runs on oneDNN's kernels for the CPU's bf16 products only: a reference implementation
// (oneDNN's fallback for what its kernels do not take) is slower than the library's own path, so the
// plan is refused (plan_for: no plan for the key).
template <class Pd>
void refuse_reference(const ConvKey& k, const Pd& pd)
{
    if (k.bf16 && std::string_view(pd.impl_info_str()).starts_with("ref"))
        throw dnnl::error(dnnl_unimplemented, "a reference implementation of a bf16 convolution");
}
inline dnnl::primitive_attr user_scratchpad()
{
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    return attr;
}
} // namespace detail

// y = conv(x, w) + b, then max(y, 0) where the key says relu.
class ConvForward {
public:
    explicit ConvForward(const dnnl::engine& e, const ConvKey& k) : bias_(k.bias)
    {
        const detail::ConvDims d = detail::conv_dims(k);
        dnnl::primitive_attr attr = detail::user_scratchpad();
        if (k.relu) {
            dnnl::post_ops ops;
            ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
            attr.set_post_ops(ops);
        }
        const auto t = detail::values(k);
        detail::by_kind(k, [&](auto kind) {
            using Kind = decltype(kind);
            const auto pd = detail::forward_pd<Kind>(e, k, attr);
            detail::refuse_reference(k, pd);
            prim_ = typename Kind::forward(pd);
            x_ = Operand(e, plain(d.x, t), pd.src_desc(), true, false);
            w_ = Operand(e, detail::plain_weights(k, d, t), pd.weights_desc(), true, false);
            y_ = Operand(e, plain(d.y, t), pd.dst_desc(), false, true);
            scratch_ = dnnl::memory(pd.scratchpad_desc(), e);
        });
        b_ = dnnl::memory(plain(d.b), e, DNNL_MEMORY_NONE);
        args_ = {{DNNL_ARG_SRC, x_.inner()}, {DNNL_ARG_WEIGHTS, w_.inner()}, {DNNL_ARG_DST, y_.inner()},
                 {DNNL_ARG_SCRATCHPAD, scratch_}};
        if (bias_) args_.emplace(DNNL_ARG_BIAS, b_);
    }

    // w, x, y: float, or bf16 where the key says bf16.
    void run(dnnl::stream& s, const void* w, const float* b, const void* x, void* y)
    {
        x_.bind(x);
        w_.bind(w);
        y_.bind(y);
        if (bias_) b_.set_data_handle(const_cast<float*>(b));
        x_.load(s);
        w_.load(s);
        prim_.execute(s, args_);
        y_.store(s);
        s.wait();
    }

private:
    dnnl::primitive prim_;
    Operand x_, w_, y_;
    dnnl::memory b_, scratch_;
    std::unordered_map<int, dnnl::memory> args_;
    bool bias_;
};

// dw = the weight gradient, db = the bias gradient (where the key says bias), both assigned; where
// the key says data, dx = the input gradient, assigned or added to dx's values.
class ConvBackward {
public:
    explicit ConvBackward(const dnnl::engine& e, const ConvKey& k) : bias_(k.bias), data_(k.data)
    {
        detail::by_kind(k, [&](auto kind) { make<decltype(kind)>(e, k); });
    }

    // dx null: no input gradient (a plan made with data computes none then). w, x, dy, dx: float, or
    // bf16 where the key says bf16.
    void run(dnnl::stream& s, const void* w, const void* x, const void* dy, void* dx, float* dw, float* db,
             bool accumulate)
    {
        x_.bind(x);
        dy_.bind(dy);
        dw_.bind(dw);
        if (bias_) db_.set_data_handle(db);
        x_.load(s);
        dy_.load(s);
        weights_.execute(s, weights_args_);
        dw_.store(s);
        if (data_ && dx) {
            w_.bind(w);
            w_.load(s);
            if (!shared_dy_) {
                data_dy_.bind(dy);
                data_dy_.load(s);
            }
            dx_.bind(dx, accumulate);
            data_prim_.execute(s, data_args_);
            dx_.store(s);
        }
        s.wait();
    }

private:
    template <class Kind>
    void make(const dnnl::engine& e, const ConvKey& k)
    {
        const detail::ConvDims d = detail::conv_dims(k);
        const auto t = detail::values(k);   // dw and db are float whatever t is; dx is computed in float
        const dnnl::primitive_attr attr = detail::user_scratchpad();
        const auto hint = detail::forward_pd<Kind>(e, k, dnnl::primitive_attr());
        using weights_desc = typename Kind::backward_weights::desc;
        const auto wdesc = bias_ ? weights_desc(Kind::algorithm, any(d.x, t), any(d.w), plain(d.b), any(d.y, t), d.strides,
                                                d.left, d.right)
                                 : weights_desc(Kind::algorithm, any(d.x, t), any(d.w), any(d.y, t), d.strides, d.left,
                                                d.right);
        const typename Kind::backward_weights::primitive_desc wpd(wdesc, attr, e, hint);
        detail::refuse_reference(k, wpd);
        weights_ = typename Kind::backward_weights(wpd);
        x_ = Operand(e, plain(d.x, t), wpd.src_desc(), true, false);
        dy_ = Operand(e, plain(d.y, t), wpd.diff_dst_desc(), true, false);
        dw_ = Operand(e, detail::plain_weights(k, d), wpd.diff_weights_desc(), false, true);
        db_ = dnnl::memory(plain(d.b), e, DNNL_MEMORY_NONE);
        weights_scratch_ = dnnl::memory(wpd.scratchpad_desc(), e);
        weights_args_ = {{DNNL_ARG_SRC, x_.inner()}, {DNNL_ARG_DIFF_DST, dy_.inner()},
                         {DNNL_ARG_DIFF_WEIGHTS, dw_.inner()}, {DNNL_ARG_SCRATCHPAD, weights_scratch_}};
        if (bias_) weights_args_.emplace(DNNL_ARG_DIFF_BIAS, db_);
        if (!data_) return;
        const typename Kind::backward_data::desc ddesc(Kind::algorithm, any(d.x), any(d.w, t), any(d.y, t), d.strides,
                                                       d.left, d.right);
        const typename Kind::backward_data::primitive_desc dpd(ddesc, attr, e, hint);
        detail::refuse_reference(k, dpd);
        data_prim_ = typename Kind::backward_data(dpd);
        w_ = Operand(e, detail::plain_weights(k, d, t), dpd.weights_desc(), true, false);
        shared_dy_ = dpd.diff_dst_desc() == wpd.diff_dst_desc();
        if (!shared_dy_) data_dy_ = Operand(e, plain(d.y, t), dpd.diff_dst_desc(), true, false);
        dx_ = Operand(e, plain(d.x, t), dpd.diff_src_desc(), false, true, true);
        data_scratch_ = dnnl::memory(dpd.scratchpad_desc(), e);
        data_args_ = {{DNNL_ARG_DIFF_DST, shared_dy_ ? dy_.inner() : data_dy_.inner()},
                      {DNNL_ARG_WEIGHTS, w_.inner()}, {DNNL_ARG_DIFF_SRC, dx_.inner()},
                      {DNNL_ARG_SCRATCHPAD, data_scratch_}};
    }

    dnnl::primitive weights_, data_prim_;
    Operand x_, dy_, dw_, w_, data_dy_, dx_;
    dnnl::memory db_, weights_scratch_, data_scratch_;
    std::unordered_map<int, dnnl::memory> weights_args_, data_args_;
    bool bias_, data_, shared_dy_ = false;
};

} // namespace replica::backend::cpu::onednn
