#pragma once
// Convolutions through oneDNN (REPLICA_ONEDNN builds): the plans cpu/conv.hpp runs where oneDNN is
// chosen for a layer (cpu/conv_path.hpp). A plan holds the primitives of one pass of one shape, the
// memory objects bound to the caller's tensors, and the memory oneDNN's preferred layouts and
// scratchpads need: made once per key in the context's Runtime, then run with no allocation.
//
// Tensors as cpu/conv.hpp has them, float: x (n, c, h, w), y and dy (n, cout, oh, ow), w and dw
// (cout, c, kh, kw), b and db (cout). The direct algorithm, and the right padding that makes oneDNN's
// output size the layer's (floor division), which may be smaller than the left.

#include <compare>
#include <cstddef>
#include <memory>
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
    auto operator<=>(const ConvKey&) const = default;
};

inline ConvKey conv_key(const core::Window& g, int cout, std::size_t n, bool bias, bool relu, bool data, int threads)
{
    return {g.c, g.h, g.w, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.oh, g.ow, cout, n, bias, relu, data, threads};
}

namespace detail {
struct ConvDims {
    dnnl::memory::dims x, w, b, y, strides, left, right;
};
inline ConvDims conv_dims(const ConvKey& k)
{
    using dim = dnnl::memory::dim;
    const dim n = dim(k.n);
    return {{n, k.c, k.h, k.w},
            {k.cout, k.c, k.kh, k.kw},
            {k.cout},
            {n, k.cout, k.oh, k.ow},
            {k.sh, k.sw},
            {k.ph, k.pw},
            {dim(k.oh - 1) * k.sh + k.kh - k.h - k.ph, dim(k.ow - 1) * k.sw + k.kw - k.w - k.pw}};
}
inline dnnl::convolution_forward::primitive_desc conv_forward_pd(const dnnl::engine& e, const ConvKey& k,
                                                                   const dnnl::primitive_attr& attr)
{
    const ConvDims d = conv_dims(k);
    const auto desc = k.bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                                               dnnl::algorithm::convolution_direct, any(d.x),
                                                               any(d.w), plain(d.b), any(d.y), d.strides, d.left,
                                                               d.right)
                             : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                                               dnnl::algorithm::convolution_direct, any(d.x),
                                                               any(d.w), any(d.y), d.strides, d.left, d.right);
    return {desc, attr, e};
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
        const auto pd = detail::conv_forward_pd(e, k, attr);
        prim_ = dnnl::convolution_forward(pd);
        x_ = Operand(e, plain(d.x), pd.src_desc(), true, false);
        w_ = Operand(e, plain(d.w), pd.weights_desc(), true, false);
        y_ = Operand(e, plain(d.y), pd.dst_desc(), false, true);
        b_ = dnnl::memory(plain(d.b), e, DNNL_MEMORY_NONE);
        scratch_ = dnnl::memory(pd.scratchpad_desc(), e);
        args_ = {{DNNL_ARG_SRC, x_.inner()}, {DNNL_ARG_WEIGHTS, w_.inner()}, {DNNL_ARG_DST, y_.inner()},
                 {DNNL_ARG_SCRATCHPAD, scratch_}};
        if (bias_) args_.emplace(DNNL_ARG_BIAS, b_);
    }

    void run(dnnl::stream& s, const float* w, const float* b, const float* x, float* y)
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
    dnnl::convolution_forward prim_;
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
        const detail::ConvDims d = detail::conv_dims(k);
        const dnnl::primitive_attr attr = detail::user_scratchpad();
        const auto hint = detail::conv_forward_pd(e, k, dnnl::primitive_attr());
        const auto wdesc =
            bias_ ? dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, any(d.x), any(d.w),
                                                             plain(d.b), any(d.y), d.strides, d.left, d.right)
                  : dnnl::convolution_backward_weights::desc(dnnl::algorithm::convolution_direct, any(d.x), any(d.w),
                                                             any(d.y), d.strides, d.left, d.right);
        const dnnl::convolution_backward_weights::primitive_desc wpd(wdesc, attr, e, hint);
        weights_ = dnnl::convolution_backward_weights(wpd);
        x_ = Operand(e, plain(d.x), wpd.src_desc(), true, false);
        dy_ = Operand(e, plain(d.y), wpd.diff_dst_desc(), true, false);
        dw_ = Operand(e, plain(d.w), wpd.diff_weights_desc(), false, true);
        db_ = dnnl::memory(plain(d.b), e, DNNL_MEMORY_NONE);
        weights_scratch_ = dnnl::memory(wpd.scratchpad_desc(), e);
        weights_args_ = {{DNNL_ARG_SRC, x_.inner()}, {DNNL_ARG_DIFF_DST, dy_.inner()},
                         {DNNL_ARG_DIFF_WEIGHTS, dw_.inner()}, {DNNL_ARG_SCRATCHPAD, weights_scratch_}};
        if (bias_) weights_args_.emplace(DNNL_ARG_DIFF_BIAS, db_);
        if (!data_) return;
        const dnnl::convolution_backward_data::desc ddesc(dnnl::algorithm::convolution_direct, any(d.x), any(d.w),
                                                          any(d.y), d.strides, d.left, d.right);
        const dnnl::convolution_backward_data::primitive_desc dpd(ddesc, attr, e, hint);
        data_prim_ = dnnl::convolution_backward_data(dpd);
        w_ = Operand(e, plain(d.w), dpd.weights_desc(), true, false);
        shared_dy_ = dpd.diff_dst_desc() == wpd.diff_dst_desc();
        if (!shared_dy_) data_dy_ = Operand(e, plain(d.y), dpd.diff_dst_desc(), true, false);
        dx_ = Operand(e, plain(d.x), dpd.diff_src_desc(), false, true, true);
        data_scratch_ = dnnl::memory(dpd.scratchpad_desc(), e);
        data_args_ = {{DNNL_ARG_DIFF_DST, shared_dy_ ? dy_.inner() : data_dy_.inner()},
                      {DNNL_ARG_WEIGHTS, w_.inner()}, {DNNL_ARG_DIFF_SRC, dx_.inner()},
                      {DNNL_ARG_SCRATCHPAD, data_scratch_}};
    }

    // dx null: no input gradient (a plan made with data computes none then).
    void run(dnnl::stream& s, const float* w, const float* x, const float* dy, float* dx, float* dw, float* db,
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
    dnnl::convolution_backward_weights weights_;
    dnnl::convolution_backward_data data_prim_;
    Operand x_, dy_, dw_, w_, data_dy_, dx_;
    dnnl::memory db_, weights_scratch_, data_scratch_;
    std::unordered_map<int, dnnl::memory> weights_args_, data_args_;
    bool bias_, data_, shared_dy_ = false;
};

} // namespace replica::backend::cpu::onednn
