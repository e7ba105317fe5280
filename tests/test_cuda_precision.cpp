// The CUDA kernels on bf16 and fp16 activations (issue 23) against the float computation they round:
// each function of backend/cuda/{elementwise,activation,pool,loss,normalization}.hpp runs on values
// already rounded to T, and is compared with the CPU backend's float function (or a loop, where the
// CPU has none) on the same values. Built as CUDA (nvcc) only, a program of its own; every test but the
// first (the order of the values in a 16-byte move, on the host) skips without a GPU.
//
// Exact, bit for bit, where the kernel computes the CPU's float from the same inputs and rounds it
// once: ReLU, add, add_into, the channel bias, dropout, fill, copies, channel slices, conversions, max
// pooling, average pooling forward, the arg-max count. Elsewhere the GPU's float differs from the CPU's
// in its last bits (CUDA's expf, tanhf and erff; sums in another order; fused multiply-adds): there the
// result must equal the GPU's own float kernel rounded to T, bit for bit, and the CPU's float rounded to
// T within 1 unit of T's last place (ulp: 2^-7 of the power of two at or below the magnitude for bf16,
// 2^-10 for fp16, taken at no less than 2^-10 of the largest value, so that cancellation near zero is
// judged on the inputs' scale); sums kept as float (BatchNorm's, in double on both) within 1 float ulp, the loss within 1e-9.
//
// Elementwise passes run on 8 k + 5 values, on pointers 16-byte aligned (the eight-value kernels and a
// scalar tail) and one value off (the scalar kernels alone).

#include <algorithm>
#include <bit>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <iterator>
#include <string>
#include <type_traits>
#include <vector>

#include "catch.hpp"
#include "replica/backend/backend.hpp"
#include "replica/backend/cpu/cpu.hpp"
#include "replica/backend/cuda/cuda.hpp"
#include "replica/core/number.hpp"
#include "replica/core/rng.hpp"
#include "support.hpp"

using namespace replica;
using namespace replica::testing;
namespace cuda = replica::backend::cuda;
namespace cpu = replica::backend::cpu;

namespace {

// A test case for T = bf16 and T = fp16 (TestType).
#define PRECISION_TEST_CASE(name) TEMPLATE_TEST_CASE(name, "[cuda][precision]", core::bf16, core::fp16)

// What each test case starts with: the CPU backend as `host`, GPU 0 as `ctx`; or a skip without a GPU.
#define CPU_AND_GPU(host, ctx)                                                               \
    if (cuda_devices().empty()) REPLICA_SKIP("no GPU on this machine: [cuda] test skipped"); \
    [[maybe_unused]] const cpu::Context host;                                                \
    const cuda::Context ctx { Device::cuda(0) }

// n values in [-scale, scale), rounded to T: the inputs both backends see.
template <class T>
std::vector<float> inputs(std::size_t n, std::uint64_t seed, float scale = 4.0f)
{
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i)
        v[i] = core::round_through<T>(
            scale * (2.0f * core::random_uniform(seed, core::Stream::synthetic, 23, i / 65536, std::uint32_t(i % 65536)) - 1.0f));
    return v;
}

template <class T>
std::vector<float> rounded(const std::vector<float>& v)
{
    std::vector<float> r(v.size());
    std::transform(v.begin(), v.end(), r.begin(), [](float f) { return core::round_through<T>(f); });
    return r;
}

// Device memory of T holding v (rounded to T) from element `offset` on (0, or 1 for a pointer one value
// off 16-byte alignment), with room for 8 more.
template <class T>
class OnGpu {
public:
    OnGpu(const cuda::Context& ctx, const std::vector<float>& v, std::size_t offset)
        : ctx_(ctx), n_(v.size()), offset_(offset), buffer_(ctx.allocate<T>(v.size() + 8 + offset))
    {
        std::vector<T> host(n_);
        std::transform(v.begin(), v.end(), host.begin(), [](float f) { return core::from_float<T>(f); });
        ctx.upload(data(), host.data(), n_);
    }
    T* data() { return buffer_.data() + offset_; }
    // The values, widened to float (exact).
    std::vector<float> values() const
    {
        std::vector<T> host(n_);
        ctx_.download(host.data(), buffer_.data() + offset_, n_);
        ctx_.synchronize();
        std::vector<float> v(n_);
        std::transform(host.begin(), host.end(), v.begin(), [](T t) { return core::to_float(t); });
        return v;
    }

private:
    const cuda::Context& ctx_;
    std::size_t n_, offset_;
    core::Buffer<T> buffer_;
};

// The largest |got - want| in units of T's last place at |want| (no less than 2^-10 of max |want|);
// T: float, bf16 or fp16.
template <class T>
double ulps(const std::vector<float>& got, const std::vector<float>& want)
{
    REQUIRE(got.size() == want.size());
    double top = 0.0, worst = 0.0;
    for (float w : want) top = std::max(top, double(std::abs(w)));
    const int bits = std::same_as<T, float> ? 23 : std::same_as<T, core::bf16> ? 7 : 10;
    const double smallest = std::same_as<T, core::fp16> ? std::ldexp(1.0, -14) : std::ldexp(1.0, -126);
    for (std::size_t i = 0; i < got.size(); ++i) {
        const double m = std::max({double(std::abs(want[i])), top * std::ldexp(1.0, -10), smallest});
        const double ulp = std::ldexp(1.0, int(std::floor(std::log2(m))) - bits);
        worst = std::max(worst, std::abs(double(got[i]) - double(want[i])) / ulp);
    }
    return worst;
}

// f(offset) for a 16-byte aligned layout (offset 0) and one a value off (offset 1).
template <class F>
void aligned_and_not(F&& f)
{
    for (std::size_t offset : {std::size_t(0), std::size_t(1)}) {
        INFO("pointers " << (offset ? "one value off 16-byte alignment" : "16-byte aligned"));
        f(offset);
    }
}

constexpr std::size_t kCount = 8 * 37 + 5;

} // namespace

// On the host (no GPU needed): the 16-byte moves of the vector kernels keep the values in order.
PRECISION_TEST_CASE("bf16 and fp16: eight values loaded in one 16-byte move are the values in order, and stored back")
{
    using T = TestType;
    alignas(16) T packed[8];
    float want[8], got[8];
    for (int k = 0; k < 8; ++k) {
        want[k] = core::round_through<T>(0.3f * float(k + 1) - 1.0f);
        packed[k] = core::from_float<T>(want[k]);
    }
    cuda::kernels::load8(packed, got);
    for (int k = 0; k < 8; ++k) CHECK(got[k] == want[k]);

    alignas(16) T stored[8];
    const float values[8] = {0.1f, -2.5f, 3.0f, 1e-3f, -7.25f, 100.0f, 0.0f, -0.3f};
    cuda::kernels::store8(stored, values);
    for (int k = 0; k < 8; ++k) CHECK(stored[k].bits == core::from_float<T>(values[k]).bits);
}

PRECISION_TEST_CASE("bf16 and fp16 on the GPU: ReLU, add, add_into, fill, copy equal the CPU's float rounded once")
{
    using T = TestType;
    CPU_AND_GPU(host, ctx);
    const auto x = inputs<T>(kCount, 1), dy = inputs<T>(kCount, 2), b = inputs<T>(kCount, 3);
    aligned_and_not([&](std::size_t offset) {
        std::vector<float> want(kCount);
        OnGpu<T> x_d(ctx, x, offset), dy_d(ctx, dy, offset), b_d(ctx, b, offset), y_d(ctx, want, offset);

        cuda::relu_forward(ctx, x_d.data(), y_d.data(), kCount);
        cpu::relu_forward(host, x.data(), want.data(), kCount);
        CHECK(differences(y_d.values(), rounded<T>(want)) == "");
        const auto relu_y = y_d.values();

        cuda::relu_backward(ctx, y_d.data(), dy_d.data(), y_d.data(), kCount);
        cpu::relu_backward(host, relu_y.data(), dy.data(), want.data(), kCount);
        CHECK(differences(y_d.values(), rounded<T>(want)) == "");

        for (const bool relu : {false, true}) {
            INFO("add_into, relu " << relu);
            cuda::add_into(ctx, x_d.data(), b_d.data(), y_d.data(), kCount, relu);
            cpu::add_into(host, x.data(), b.data(), want.data(), kCount, relu);
            CHECK(differences(y_d.values(), rounded<T>(want)) == "");
        }

        want = dy;
        cuda::add(ctx, x_d.data(), dy_d.data(), kCount);
        cpu::add(host, x.data(), want.data(), kCount);
        CHECK(differences(dy_d.values(), rounded<T>(want)) == "");

        cuda::fill(ctx, y_d.data(), 0.1f, kCount);
        CHECK(differences(y_d.values(), std::vector<float>(kCount, core::round_through<T>(0.1f))) == "");

        cuda::copy(ctx, x_d.data(), y_d.data(), kCount);
        CHECK(differences(y_d.values(), x) == "");
    });
}

PRECISION_TEST_CASE("bf16 and fp16 on the GPU: conversions from and to float and between the two round once")
{
    using T = TestType;
    using Other = std::conditional_t<std::same_as<T, core::bf16>, core::fp16, core::bf16>;
    CPU_AND_GPU(host, ctx);
    // Floats that are not values of T, some out of fp16's range (infinity) and below its normals; then
    // ties, infinities, signed zeros and NaNs with payloads, whose bits must be core's too.
    std::vector<float> f(kCount);
    for (std::size_t i = 0; i < kCount; ++i)
        f[i] = std::ldexp(2.0f * core::random_uniform(4, core::Stream::synthetic, 23, 0, std::uint32_t(i)) - 1.0f,
                          int(i % 48) - 30);
    const std::uint32_t special[] = {0x7f800000u, 0xff800000u, 0x80000000u, 0x7fc00001u, 0xffa12345u, 0x7f812000u,
                                     0x3f808000u, 0x3f818000u, 0x477ff000u, 0x477fefffu, 0x33000000u, 0x33000001u};
    for (std::size_t k = 0; k < std::size(special); ++k) f[kCount - 1 - 2 * k] = std::bit_cast<float>(special[k]);
    aligned_and_not([&](std::size_t offset) {
        OnGpu<float> f_d(ctx, f, offset), back_d(ctx, std::vector<float>(kCount), offset);
        OnGpu<T> t_d(ctx, std::vector<float>(kCount), offset), same_d(ctx, std::vector<float>(kCount), offset);
        OnGpu<Other> o_d(ctx, std::vector<float>(kCount), offset);

        cuda::convert(ctx, f_d.data(), t_d.data(), kCount);
        CHECK(differences(t_d.values(), rounded<T>(f)) == "");
        cuda::convert(ctx, t_d.data(), back_d.data(), kCount);
        CHECK(differences(back_d.values(), rounded<T>(f)) == "");
        cuda::convert(ctx, t_d.data(), o_d.data(), kCount);
        CHECK(differences(o_d.values(), rounded<Other>(rounded<T>(f))) == "");
        cuda::convert(ctx, t_d.data(), same_d.data(), kCount);
        CHECK(differences(same_d.values(), rounded<T>(f)) == "");
        cuda::convert(ctx, f_d.data(), back_d.data(), kCount);
        CHECK(differences(back_d.values(), f) == "");
    });
}

PRECISION_TEST_CASE("bf16 and fp16 on the GPU: Sigmoid, Tanh, GELU round the GPU's float once, within 1 ulp of the CPU's")
{
    using T = TestType;
    CPU_AND_GPU(host, ctx);
    const auto x = inputs<T>(kCount, 5), dy = inputs<T>(kCount, 6);
    // One activation: forward from x, backward from y (Sigmoid, Tanh) or from x (GELU).
    const auto check = [&](const char* name, auto gpu_forward, auto gpu_backward, auto cpu_forward, auto cpu_backward,
                           bool from_output, std::size_t offset) {
        INFO(name);
        std::vector<float> want(kCount), zero(kCount);
        OnGpu<T> x_d(ctx, x, offset), dy_d(ctx, dy, offset), y_d(ctx, zero, offset), dx_d(ctx, zero, offset);
        OnGpu<float> xf_d(ctx, x, offset), dyf_d(ctx, dy, offset), yf_d(ctx, zero, offset), dxf_d(ctx, zero, offset);

        gpu_forward(x_d.data(), y_d.data());
        gpu_forward(xf_d.data(), yf_d.data());
        const auto y = y_d.values();
        CHECK(differences(y, rounded<T>(yf_d.values())) == "");
        cpu_forward(x.data(), want.data());
        CHECK(ulps<T>(y, rounded<T>(want)) <= 1.0);

        // The backward pass reads the rounded output (or input), as the layer's would.
        OnGpu<float> a_f(ctx, from_output ? y : x, offset);
        gpu_backward(from_output ? y_d.data() : x_d.data(), dy_d.data(), dx_d.data());
        gpu_backward(a_f.data(), dyf_d.data(), dxf_d.data());
        const auto dx = dx_d.values();
        CHECK(differences(dx, rounded<T>(dxf_d.values())) == "");
        cpu_backward((from_output ? y : x).data(), dy.data(), want.data());
        CHECK(ulps<T>(dx, rounded<T>(want)) <= 1.0);
    };
#define REPLICA_ACTIVATION(name, from_output)                                                                       \
    check(                                                                                                         \
        #name, [&](const auto* a, auto* b) { cuda::name##_forward(ctx, a, b, kCount); },                           \
        [&](const auto* a, const auto* d, auto* b) { cuda::name##_backward(ctx, a, d, b, kCount); },               \
        [&](const float* a, float* b) { cpu::name##_forward(host, a, b, kCount); },                                \
        [&](const float* a, const float* d, float* b) { cpu::name##_backward(host, a, d, b, kCount); }, from_output, \
        offset)
    aligned_and_not([&](std::size_t offset) {
        REPLICA_ACTIVATION(sigmoid, true);
        REPLICA_ACTIVATION(tanh, true);
        REPLICA_ACTIVATION(gelu, false);
    });
#undef REPLICA_ACTIVATION
}

PRECISION_TEST_CASE("bf16 and fp16 on the GPU: the channel bias (and its fused ReLU) and dropout round the CPU's float once")
{
    using T = TestType;
    CPU_AND_GPU(host, ctx);
    const std::size_t n = 3, channels = 5;
    const auto b = inputs<float>(channels, 7);   // biases stay float
    auto b_d = ctx.allocate<float>(channels);
    ctx.upload(b_d.data(), b.data(), channels);
    // s = 16: eight-value moves within a channel; s = 13: the scalar kernel.
    for (const std::size_t s : {std::size_t(16), std::size_t(13)})
        for (const bool relu : {false, true}) {
            INFO("s " << s << ", relu " << relu);
            const auto y = inputs<T>(n * channels * s, 8);
            std::vector<float> want(y.size());
            for (std::size_t i = 0; i < y.size(); ++i) {
                const float v = y[i] + b[(i / s) % channels];
                want[i] = relu && v < 0.0f ? 0.0f : v;
            }
            aligned_and_not([&](std::size_t offset) {
                OnGpu<T> y_d(ctx, y, offset);
                cuda::add_channel_bias(ctx, b_d.data(), y_d.data(), n, channels, s, relu);
                CHECK(differences(y_d.values(), rounded<T>(want)) == "");
            });
        }

    const std::size_t size = 8 * 5 + 5;
    const auto x = inputs<T>(n * size, 9);
    std::vector<float> want(x.size());
    cpu::dropout_apply(host, 0.3f, 77, 4, 1000, x.data(), want.data(), n, size);
    aligned_and_not([&](std::size_t offset) {
        OnGpu<T> x_d(ctx, x, offset), y_d(ctx, std::vector<float>(x.size()), offset);
        cuda::dropout_apply(ctx, 0.3f, 77, 4, 1000, x_d.data(), y_d.data(), n, size);
        CHECK(differences(y_d.values(), rounded<T>(want)) == "");
    });
}

PRECISION_TEST_CASE("bf16 and fp16 on the GPU: channel slices in and out equal the CPU's")
{
    using T = TestType;
    CPU_AND_GPU(host, ctx);
    const std::size_t n = 3, c = 2, channels = 5, offset_c = 2;
    // 8 pixels: rows of whole 16-byte moves; 7: the scalar kernel.
    for (const std::size_t pixels : {std::size_t(8), std::size_t(7)}) {
        INFO(pixels << " pixels");
        const auto src = inputs<T>(n * c * pixels, 10), whole = inputs<T>(n * channels * pixels, 11);
        std::vector<float> in = whole, out(src.size());
        cpu::copy_channels_in(host, src.data(), n, c, pixels, in.data(), channels, offset_c);
        cpu::copy_channels_out(host, whole.data(), channels, offset_c, n, c, pixels, out.data());
        aligned_and_not([&](std::size_t offset) {
            OnGpu<T> src_d(ctx, src, offset), whole_d(ctx, whole, offset), out_d(ctx, std::vector<float>(src.size()), offset);
            cuda::copy_channels_out(ctx, whole_d.data(), channels, offset_c, n, c, pixels, out_d.data());
            CHECK(differences(out_d.values(), out) == "");
            cuda::copy_channels_in(ctx, src_d.data(), n, c, pixels, whole_d.data(), channels, offset_c);
            CHECK(differences(whole_d.values(), in) == "");
        });
    }
}

PRECISION_TEST_CASE("bf16 and fp16 on the GPU: max and average pooling round the CPU's float once")
{
    using T = TestType;
    CPU_AND_GPU(host, ctx);
    // 3 x 3, stride 2; padding 1 on rows; the last column window half outside (ceil mode).
    constexpr core::Window g{3, 9, 8, 3, 3, 2, 2, 1, 0, 5, 4};
    const std::size_t n = 2, in = n * g.in_size(), out = n * g.c * g.out_pixels();
    const auto x = inputs<T>(in, 12), dy = inputs<T>(out, 13);
    std::vector<float> y(out), dx(in);
    std::vector<core::pool_position_t<g>> arg(out), arg_got(out);
    OnGpu<T> x_d(ctx, x, 0), dy_d(ctx, dy, 0), y_d(ctx, y, 0), dx_d(ctx, dx, 0);
    OnGpu<float> dyf_d(ctx, dy, 0), dxf_d(ctx, dx, 0);
    auto arg_d = ctx.allocate<core::pool_position_t<g>>(out);

    cuda::max_pool_forward<g>(ctx, x_d.data(), y_d.data(), arg_d.data(), n);
    cpu::max_pool_forward<g>(host, x.data(), y.data(), arg.data(), n);
    CHECK(differences(y_d.values(), y) == "");
    ctx.download(arg_got.data(), arg_d.data(), out);
    ctx.synchronize();
    CHECK(arg_got == arg);

    cuda::max_pool_backward<g>(ctx, arg_d.data(), dy_d.data(), dx_d.data(), n);
    cpu::max_pool_backward<g>(host, arg.data(), dy.data(), dx.data(), n);
    CHECK(differences(dx_d.values(), rounded<T>(dx)) == "");

    cuda::avg_pool_forward<g>(ctx, x_d.data(), y_d.data(), n);
    cpu::avg_pool_forward<g>(host, x.data(), y.data(), n);
    CHECK(differences(y_d.values(), rounded<T>(y)) == "");

    // The CPU scales each window's share before adding, the GPU after: not the same float.
    cuda::avg_pool_backward<g>(ctx, dy_d.data(), dx_d.data(), n);
    cuda::avg_pool_backward<g>(ctx, dyf_d.data(), dxf_d.data(), n);
    cpu::avg_pool_backward<g>(host, dy.data(), dx.data(), n);
    CHECK(differences(dx_d.values(), rounded<T>(dxf_d.values())) == "");
    CHECK(ulps<T>(dx_d.values(), rounded<T>(dx)) <= 1.0);
}

PRECISION_TEST_CASE("bf16 and fp16 on the GPU: softmax cross-entropy and the arg-max count read rounded logits as the CPU")
{
    using T = TestType;
    CPU_AND_GPU(host, ctx);
    const int classes = 10;
    const std::size_t n = 4;
    // One label a sample (a block a sample) and six (a thread a labelled element).
    for (const int pixels : {1, 6}) {
        INFO(pixels << " labels a sample");
        const std::size_t count = n * classes * pixels;
        const auto logits = inputs<T>(count, 14);
        std::vector<std::int32_t> labels(n * pixels);
        for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = std::int32_t((i * 7 + 3) % classes);
        auto labels_d = ctx.allocate<std::int32_t>(labels.size());
        ctx.upload(labels_d.data(), labels.data(), labels.size());
        std::vector<float> dlogits(count);
        core::LossSlot want_slot, slot, float_slot;
        cpu::softmax_cross_entropy(host, classes, pixels, logits.data(), labels.data(), n, 0.25f, dlogits.data(), &want_slot);

        OnGpu<T> logits_d(ctx, logits, 0), d_d(ctx, dlogits, 0);
        OnGpu<float> logitsf_d(ctx, logits, 0), df_d(ctx, dlogits, 0);
        cuda::softmax_cross_entropy(ctx, classes, pixels, logits_d.data(), labels_d.data(), n, 0.25f, d_d.data(), &slot);
        cuda::softmax_cross_entropy(ctx, classes, pixels, logitsf_d.data(), labels_d.data(), n, 0.25f, df_d.data(),
                                    &float_slot);
        ctx.synchronize();
        CHECK(slot.bad_position == 0.0);
        CHECK(slot.sum == float_slot.sum);
        CHECK(std::abs(slot.sum - want_slot.sum) <= 1e-9 * std::abs(want_slot.sum));
        const auto d = d_d.values();
        CHECK(differences(d, rounded<T>(df_d.values())) == "");
        CHECK(ulps<T>(d, rounded<T>(dlogits)) <= 1.0);

        core::LossSlot loss_only;
        cuda::softmax_cross_entropy(ctx, classes, pixels, logits_d.data(), labels_d.data(), n, 0.25f, nullptr, &loss_only);
        ctx.synchronize();
        CHECK(loss_only.sum == slot.sum);

        CHECK(cuda::count_correct(ctx, classes, pixels, logits_d.data(), labels_d.data(), n) ==
              cpu::count_correct(host, classes, pixels, logits.data(), labels.data(), n));
    }
}

PRECISION_TEST_CASE("bf16 and fp16 on the GPU: BatchNorm's sums, apply and backward read and write T, statistics float")
{
    using T = TestType;
    CPU_AND_GPU(host, ctx);
    // Planes of 37 values (read value by value), 36 (moves of 4, a chunk of 8 across two samples),
    // 56 and 64 (moves of 8), each from aligned pointers and from pointers one value off.
    const std::size_t n = 3, c = 4;
    const auto inner = GENERATE(std::size_t(37), std::size_t(36), std::size_t(56), std::size_t(64));
    const std::size_t count = n * c * inner;
    INFO("inner " << inner);
    const auto x = inputs<T>(count, 15), dy = inputs<T>(count, 16);
    // A ReLU's output as the backward's mask: values of both signs, and zeros; dz = relu_backward(relu_y,
    // dy), what the masked calls read in dy's place.
    auto relu_y = inputs<T>(count, 22);
    for (std::size_t i = 0; i < count; i += 3) relu_y[i] = 0.0f;
    std::vector<float> dz(count);
    cpu::relu_backward(host, relu_y.data(), dy.data(), dz.data(), count);
    // Parameters and statistics (float): weight, bias, mean (also the sums' shift), invstd > 0, the
    // backward sums [sum dy * xhat | sum dy], the element count a channel.
    const auto weight = inputs<float>(c, 17), bias = inputs<float>(c, 18), mean = inputs<float>(c, 19, 0.5f);
    auto invstd = inputs<float>(c, 20, 0.5f);
    for (float& v : invstd) v += 1.0f;
    const auto back_sums = inputs<float>(2 * c, 21, 50.0f);
    const std::vector<float> elements{float(n * inner)};
    const auto on_gpu = [&](const std::vector<float>& v) {
        auto b = ctx.allocate<float>(v.size());
        ctx.upload(b.data(), v.data(), v.size());
        return b;
    };
    auto weight_d = on_gpu(weight), bias_d = on_gpu(bias), mean_d = on_gpu(mean), invstd_d = on_gpu(invstd);
    auto back_sums_d = on_gpu(back_sums), elements_d = on_gpu(elements);
    auto scratch = ctx.allocate<float>(cuda::batch_norm_scratch<T>(ctx, c));
    auto sums_d = ctx.allocate<float>(2 * c + 1);
    const std::vector<float> zero(count);
    std::vector<float> first_sums, first_back_sums, first_masked_sums;   // those of the aligned run

    aligned_and_not([&](std::size_t offset) {
        std::vector<float> sums(2 * c + 1), got(2 * c + 1), want(count);
        // Sums in double on both, in another order: the floats they end in agree to float precision.
        OnGpu<T> x_d(ctx, x, offset), dy_d(ctx, dy, offset), y_d(ctx, zero, offset);
        cuda::batch_norm_sums(ctx, x_d.data(), n, c, inner, mean_d.data(), sums_d.data(), scratch.data());
        cpu::batch_norm_sums(host, x.data(), n, c, inner, mean.data(), sums.data(), nullptr);
        ctx.download(got.data(), sums_d.data(), got.size());
        ctx.synchronize();
        CHECK(ulps<float>(got, sums) <= 1.0);
        CHECK(got[2 * c] == float(n * inner));
        // How the values are read (moves of 8, 4 or one at a time) leaves the sums' bits alone.
        if (offset == 0) first_sums = got;
        else CHECK(differences(got, first_sums) == "");

        cuda::batch_norm_backward_sums(ctx, x_d.data(), dy_d.data(), n, c, inner, mean_d.data(), invstd_d.data(),
                                       sums_d.data(), scratch.data());
        cpu::batch_norm_backward_sums(host, x.data(), dy.data(), n, c, inner, mean.data(), invstd.data(), sums.data(),
                                      nullptr);
        ctx.download(got.data(), sums_d.data(), 2 * c);
        ctx.synchronize();
        got.resize(2 * c);
        sums.resize(2 * c);
        CHECK(ulps<float>(got, sums) <= 1.0);
        if (offset == 0) first_back_sums = got;
        else CHECK(differences(got, first_back_sums) == "");

        // Through the ReLU's mask: the unmasked sums of dz, bit for bit; the CPU's within 1 ulp.
        OnGpu<T> relu_d(ctx, relu_y, offset), dz_d(ctx, dz, offset);
        std::vector<float> masked(2 * c);
        cuda::batch_norm_backward_sums(ctx, x_d.data(), dz_d.data(), n, c, inner, mean_d.data(), invstd_d.data(),
                                       sums_d.data(), scratch.data());
        ctx.download(got.data(), sums_d.data(), 2 * c);
        cuda::batch_norm_backward_sums(ctx, x_d.data(), dy_d.data(), n, c, inner, mean_d.data(), invstd_d.data(),
                                       sums_d.data(), scratch.data(), relu_d.data());
        ctx.download(masked.data(), sums_d.data(), 2 * c);
        cpu::batch_norm_backward_sums(host, x.data(), dy.data(), n, c, inner, mean.data(), invstd.data(), sums.data(),
                                      nullptr, relu_y.data());
        ctx.synchronize();
        CHECK(differences(masked, got) == "");
        CHECK(ulps<float>(masked, sums) <= 1.0);
        if (offset == 0) first_masked_sums = masked;
        else CHECK(differences(masked, first_masked_sums) == "");

        // Elementwise passes: the GPU's float kernel rounded once; the CPU's within 1 ulp (fused multiply-adds).
        OnGpu<float> xf_d(ctx, x, offset), dyf_d(ctx, dy, offset), yf_d(ctx, zero, offset);
        for (const bool relu : {false, true}) {
            INFO("apply, relu " << relu);
            cuda::batch_norm_apply(ctx, x_d.data(), y_d.data(), n, c, inner, weight_d.data(), bias_d.data(),
                                   mean_d.data(), invstd_d.data(), relu);
            cuda::batch_norm_apply(ctx, xf_d.data(), yf_d.data(), n, c, inner, weight_d.data(), bias_d.data(),
                                   mean_d.data(), invstd_d.data(), relu);
            cpu::batch_norm_apply(host, x.data(), want.data(), n, c, inner, weight.data(), bias.data(), mean.data(),
                                  invstd.data(), relu);
            CHECK(differences(y_d.values(), rounded<T>(yf_d.values())) == "");
            CHECK(ulps<T>(y_d.values(), rounded<T>(want)) <= 1.0);
        }

        cuda::batch_norm_backward_input(ctx, x_d.data(), dy_d.data(), y_d.data(), n, c, inner, weight_d.data(),
                                        mean_d.data(), invstd_d.data(), back_sums_d.data(), elements_d.data());
        cuda::batch_norm_backward_input(ctx, xf_d.data(), dyf_d.data(), yf_d.data(), n, c, inner, weight_d.data(),
                                        mean_d.data(), invstd_d.data(), back_sums_d.data(), elements_d.data());
        cpu::batch_norm_backward_input(host, x.data(), dy.data(), want.data(), n, c, inner, weight.data(), mean.data(),
                                       invstd.data(), back_sums.data(), elements.data());
        CHECK(differences(y_d.values(), rounded<T>(yf_d.values())) == "");
        CHECK(ulps<T>(y_d.values(), rounded<T>(want)) <= 1.0);

        // Through the ReLU's mask: the unmasked pass on dz, bit for bit, in T and in float; the CPU's
        // masked float within 1 ulp.
        OnGpu<float> reluf_d(ctx, relu_y, offset), dzf_d(ctx, dz, offset), unmaskedf_d(ctx, zero, offset);
        OnGpu<T> unmasked_d(ctx, zero, offset);
        cuda::batch_norm_backward_input(ctx, x_d.data(), dz_d.data(), unmasked_d.data(), n, c, inner, weight_d.data(),
                                        mean_d.data(), invstd_d.data(), back_sums_d.data(), elements_d.data());
        cuda::batch_norm_backward_input(ctx, x_d.data(), dy_d.data(), y_d.data(), n, c, inner, weight_d.data(),
                                        mean_d.data(), invstd_d.data(), back_sums_d.data(), elements_d.data(),
                                        relu_d.data());
        cuda::batch_norm_backward_input(ctx, xf_d.data(), dzf_d.data(), unmaskedf_d.data(), n, c, inner, weight_d.data(),
                                        mean_d.data(), invstd_d.data(), back_sums_d.data(), elements_d.data());
        cuda::batch_norm_backward_input(ctx, xf_d.data(), dyf_d.data(), yf_d.data(), n, c, inner, weight_d.data(),
                                        mean_d.data(), invstd_d.data(), back_sums_d.data(), elements_d.data(),
                                        reluf_d.data());
        cpu::batch_norm_backward_input(host, x.data(), dy.data(), want.data(), n, c, inner, weight.data(), mean.data(),
                                       invstd.data(), back_sums.data(), elements.data(), relu_y.data());
        CHECK(differences(y_d.values(), unmasked_d.values()) == "");
        CHECK(differences(yf_d.values(), unmaskedf_d.values()) == "");
        CHECK(ulps<T>(y_d.values(), rounded<T>(want)) <= 1.0);
    });
}

