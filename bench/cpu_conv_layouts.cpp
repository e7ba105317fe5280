// What keeping activations in oneDNN's layouts between layers would save on this CPU (issue 45): one
// convolution's three passes through oneDNN, timed for activations kept
//   plain    (n, c, h, w), as the CPU backend keeps them: each pass reorders its activations to the
//            layout oneDNN prefers and its results back, as backend/cpu/onednn/conv.hpp does;
//   nhwc     channels-last, which oneDNN's kernels read and write directly;
//   blocked  oneDNN's preferred layout (channel blocks of 8 or 16: what format_tag::any picks), read
//            and written directly.
// The weights are reordered in every layout (the backend keeps them (out, in, kh, kw)). Each layout is
// timed `rounds` times over `steps` steps, the layouts interleaved; medians a step.
//   cpu_conv_layouts [--shape N,C,H,W,K,KH,STRIDE ...] [--steps 10] [--rounds 5]
// (default shapes: ResNet-20's three stages at batch 128.) Threads: OMP_NUM_THREADS.
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace {

using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

struct Shape {
    long n, c, h, w, k, kh, stride;
};

enum class Kept { plain, nhwc, blocked };
const char* name(Kept k) { return k == Kept::plain ? "plain" : k == Kept::nhwc ? "nhwc" : "blocked"; }

// Deterministic, non-zero values (timing on zeros is not timing).
void fill(dnnl::memory& m)
{
    float* p = static_cast<float*>(m.get_data_handle());
    const std::size_t count = m.get_desc().get_size() / sizeof(float);
    for (std::size_t i = 0; i < count; ++i) p[i] = 0.01f * float(int(i % 97) - 48);
}

// One layer's passes in one layout: forward, data gradient, weight gradient; plain runs the reorders.
class Layer {
public:
    Layer(const dnnl::engine& e, const Shape& s, Kept kept) : kept_(kept)
    {
        const long oh = (s.h + 2 * (s.kh / 2) - s.kh) / s.stride + 1, ow = (s.w + 2 * (s.kh / 2) - s.kh) / s.stride + 1;
        const dnnl::memory::dims x{s.n, s.c, s.h, s.w}, w{s.k, s.c, s.kh, s.kh}, y{s.n, s.k, oh, ow};
        const dnnl::memory::dims strides{s.stride, s.stride}, pad{s.kh / 2, s.kh / 2};
        const tag act = kept == Kept::nhwc ? tag::nhwc : tag::any;
        const dnnl::memory::desc xd(x, dt::f32, act), yd(y, dt::f32, act), wd(w, dt::f32, tag::any);
        const auto algo = dnnl::algorithm::convolution_direct;
        const dnnl::convolution_forward::primitive_desc fpd(
            {dnnl::prop_kind::forward_training, algo, xd, wd, yd, strides, pad, pad}, e);
        const dnnl::convolution_backward_data::primitive_desc dpd({algo, xd, wd, yd, strides, pad, pad}, e, fpd);
        const dnnl::convolution_backward_weights::primitive_desc wpd({algo, xd, wd, yd, strides, pad, pad}, e, fpd);
        forward_ = dnnl::convolution_forward(fpd);
        data_ = dnnl::convolution_backward_data(dpd);
        weights_ = dnnl::convolution_backward_weights(wpd);
        impl_ = fpd.impl_info_str();
        // The kernels' operands, in the layouts their primitives chose.
        x_ = dnnl::memory(fpd.src_desc(), e), y_ = dnnl::memory(fpd.dst_desc(), e);
        dy_ = dnnl::memory(wpd.diff_dst_desc(), e), dx_ = dnnl::memory(dpd.diff_src_desc(), e);
        w_ = dnnl::memory(fpd.weights_desc(), e), wd_ = dnnl::memory(dpd.weights_desc(), e);
        dw_ = dnnl::memory(wpd.diff_weights_desc(), e);
        // The backend's copies: plain activations (plain only) and plain weights (every layout).
        const dnnl::memory::desc px(x, dt::f32, tag::nchw), py(y, dt::f32, tag::nchw), pw(w, dt::f32, tag::oihw);
        plain_w_ = dnnl::memory(pw, e), plain_dw_ = dnnl::memory(pw, e);
        if (kept == Kept::plain) {
            plain_x_ = dnnl::memory(px, e), plain_y_ = dnnl::memory(py, e);
            plain_dy_ = dnnl::memory(py, e), plain_dx_ = dnnl::memory(px, e);
            fill(plain_x_), fill(plain_dy_);
        }
        fill(x_), fill(dy_), fill(plain_w_);
        // The reorders, made once as the backend's plans make theirs.
        w_in_ = Reorder(plain_w_, w_), wd_in_ = Reorder(plain_w_, wd_), dw_out_ = Reorder(dw_, plain_dw_);
        if (kept == Kept::plain) {
            x_in_ = Reorder(plain_x_, x_), y_out_ = Reorder(y_, plain_y_);
            dy_in_ = Reorder(plain_dy_, dy_), dx_out_ = Reorder(dx_, plain_dx_);
        }
    }

    void step(dnnl::stream& s)
    {
        x_in_.run(s);
        w_in_.run(s);
        forward_.execute(s, {{DNNL_ARG_SRC, x_}, {DNNL_ARG_WEIGHTS, w_}, {DNNL_ARG_DST, y_}});
        y_out_.run(s);
        x_in_.run(s), dy_in_.run(s);
        weights_.execute(s, {{DNNL_ARG_SRC, x_}, {DNNL_ARG_DIFF_DST, dy_}, {DNNL_ARG_DIFF_WEIGHTS, dw_}});
        dw_out_.run(s);
        wd_in_.run(s);
        data_.execute(s, {{DNNL_ARG_DIFF_DST, dy_}, {DNNL_ARG_WEIGHTS, wd_}, {DNNL_ARG_DIFF_SRC, dx_}});
        dx_out_.run(s);
        s.wait();
    }

    const std::string& impl() const { return impl_; }
    std::string activations() const
    {
        const auto d = x_.get_desc();
        return kept_ == Kept::nhwc ? "nhwc" : d.data.format_desc.blocking.inner_nblks ? "blocked" : "plain";
    }

private:
    // from -> to, or nothing where the layouts agree (or for a layout that keeps its activations).
    class Reorder {
    public:
        Reorder() = default;
        Reorder(dnnl::memory& from, dnnl::memory& to) : from_(from), to_(to), needed_(from.get_desc() != to.get_desc())
        {
            if (needed_) prim_ = dnnl::reorder(from, to);
        }
        void run(dnnl::stream& s)
        {
            if (needed_) prim_.execute(s, from_, to_);
        }

    private:
        dnnl::memory from_, to_;
        dnnl::reorder prim_;
        bool needed_ = false;
    };

    Kept kept_;
    dnnl::primitive forward_, data_, weights_;
    std::string impl_;
    dnnl::memory x_, y_, dy_, dx_, w_, wd_, dw_, plain_w_, plain_dw_, plain_x_, plain_y_, plain_dy_, plain_dx_;
    Reorder x_in_, y_out_, dy_in_, dx_out_, w_in_, wd_in_, dw_out_;
};

double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

} // namespace

int main(int argc, char** argv)
{
    CLI::App app{"oneDNN convolution passes with activations kept plain (reordered), channels-last or blocked"};
    std::vector<std::string> shapes{"128,16,28,28,16,3,1", "128,32,14,14,32,3,1", "128,64,7,7,64,3,1"};
    int steps = 10, rounds = 5;
    app.add_option("--shape", shapes, "N,C,H,W,K,KH,STRIDE (square windows, padding KH/2)");
    app.add_option("--steps", steps, "steps a round")->check(CLI::Range(1, 1000));
    app.add_option("--rounds", rounds, "rounds, the layouts interleaved")->check(CLI::Range(1, 100));
    CLI11_PARSE(app, argc, argv);

    dnnl::engine e(dnnl::engine::kind::cpu, 0);
    dnnl::stream s(e);
    for (const std::string& text : shapes) {
        Shape sh{};
        if (std::sscanf(text.c_str(), "%ld,%ld,%ld,%ld,%ld,%ld,%ld", &sh.n, &sh.c, &sh.h, &sh.w, &sh.k, &sh.kh, &sh.stride) != 7 ||
            sh.n < 1 || sh.c < 1 || sh.h < 1 || sh.w < 1 || sh.k < 1 || sh.kh < 1 || sh.stride < 1) {
            std::fprintf(stderr, "--shape %s: expected seven positive integers N,C,H,W,K,KH,STRIDE\n", text.c_str());
            return 2;
        }
        std::vector<Layer> layers;
        for (Kept k : {Kept::plain, Kept::nhwc, Kept::blocked}) layers.emplace_back(e, sh, k);
        std::vector<std::vector<double>> times(layers.size());
        for (auto& l : layers) l.step(s);   // warm-up: JIT, first touch
        for (int r = 0; r < rounds; ++r)
            for (std::size_t i = 0; i < layers.size(); ++i) {
                const auto start = std::chrono::steady_clock::now();
                for (int k = 0; k < steps; ++k) layers[i].step(s);
                times[i].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / steps);
            }
        const double plain = median(times[0]);
        for (std::size_t i = 0; i < layers.size(); ++i)
            std::printf("{\"shape\": \"%s\", \"kept\": \"%s\", \"kernel_layout\": \"%s\", \"impl\": \"%s\", \"median_ms\": %.3f, "
                        "\"against_plain\": %.3f}\n",
                        text.c_str(), name(Kept(i)), layers[i].activations().c_str(), layers[i].impl().c_str(),
                        median(times[i]), median(times[i]) / plain);
    }
}
