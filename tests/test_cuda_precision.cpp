// The CUDA kernels on bf16 and fp16 activations (issue 23) against the float computation they round:
// each function of backend/cuda/{elementwise,activation,pool,loss,normalization,layer_norm}.hpp runs on values
// already rounded to T, and is compared with the CPU backend's float function (or a loop, where the
// CPU has none) on the same values. Built as CUDA (nvcc) only, a program of its own; every test but the
// first (the order of the values in a 16-byte move, on the host) skips without a GPU.
//
// The last case runs the kernels that know what a channel is on channels-last activations
// (backend/cuda/layout.hpp) and requires the channels-first results, transposed, bit for bit (sums:
// within 1 float ulp of the CPU's).
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
#include <utility>
#include <vector>

#include "catch.hpp"
#include "replica/backend/backend.hpp"
#include "replica/backend/cpu/cpu.hpp"
#include "replica/backend/cuda/cuda.hpp"
#include "replica/core/number.hpp"
#include "replica/core/rng.hpp"
#include "cuda_support.hpp"
#include "support.hpp"

using namespace replica;
using namespace replica::testing;
namespace cuda = replica::backend::cuda;
namespace cpu = replica::backend::cpu;

namespace {

// A test case for T = bf16 and T = fp16 (TestType).
#define PRECISION_TEST_CASE(name) TEMPLATE_TEST_CASE(name, "[cuda][precision]", core::bf16, core::fp16)

// What each test case starts with: the CPU backend as `host`, GPU 0 as `ctx` with activations
// (channels, pixels) as the CPU's; or a skip without a GPU.
#define CPU_AND_GPU(host, ctx)                                                               \
    if (cuda_devices().empty()) REPLICA_SKIP("no GPU on this machine: [cuda] test skipped"); \
    [[maybe_unused]] const cpu::Context host;                                                \
    const cuda::Context ctx = gpu_context(false)

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

// The channels-last BatchNorm sums' bound (columns.hpp): a lane adds up to lane_rows values in float,
// each term (x - shift and its square; dy and dy * (x - mean)) rounded at most twice in float on the
// way, and the rest is added in double; so a sum is within (lane_rows + 2) * 2^-24 * (the sum of its
// terms' magnitudes) of the exact one. Laid out as the sums are: forward [x - shift (c) | its square (c)
// | the count (exact)], backward (dy given) [dy * (x - mean) times invstd (c) | dy (c)]. x and dy are
// (n, c, inner).
std::vector<double> column_sum_bounds(const std::vector<float>& x, const std::vector<float>& dy, std::size_t n,
                                      std::size_t c, std::size_t inner, const std::vector<float>& shift,
                                      const std::vector<float>& invstd)
{
    const std::size_t rows = n * inner, parts = cuda::detail::column_parts(rows, c);
    const std::size_t lane_rows = ((rows + parts - 1) / parts + cuda::detail::kLanes - 1) / cuda::detail::kLanes;
    const double u = std::ldexp(double(lane_rows + 2), -24);
    std::vector<double> bound(dy.empty() ? 2 * c + 1 : 2 * c, 0.0);
    for (std::size_t i = 0; i < n; ++i)
        for (std::size_t ch = 0; ch < c; ++ch)
            for (std::size_t j = 0; j < inner; ++j) {
                const std::size_t at = (i * c + ch) * inner + j;
                const double d = double(x[at]) - double(shift[ch]);
                if (dy.empty()) {
                    bound[ch] += u * std::abs(d);
                    bound[c + ch] += u * d * d;
                } else {
                    bound[ch] += u * std::abs(dy[at] * d) * invstd[ch];
                    bound[c + ch] += u * std::abs(double(dy[at]));
                }
            }
    return bound;
}
// The largest |got - want| / (bound + one float ulp of want): at most 1 where got keeps to the bound
// (the ulp: the CPU's and the GPU's double rounded to float).
double beyond(const std::vector<float>& got, const std::vector<float>& want, const std::vector<double>& bound)
{
    REQUIRE(got.size() == want.size());
    REQUIRE(got.size() == bound.size());
    double worst = 0.0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        const double magnitude = std::max(double(std::abs(want[i])), 0x1p-126);
        const double ulp = std::ldexp(1.0, int(std::floor(std::log2(magnitude))) - 23);
        worst = std::max(worst, std::abs(double(got[i]) - double(want[i])) / (bound[i] + ulp));
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

// BatchNorm's values over n x c x inner, rounded to T: x and dy; the output relu_y of the normalisation
// and the ReLU after it (what the masked backward calls recompute from x), and dz = relu_backward(relu_y,
// dy), what they read in dy's place (dz_float: the same from the output in float, for the float kernels'
// masks). Its parameters and statistics (float), also on `ctx`: weight, bias,
// mean (also the sums' shift), invstd > 0, the backward sums [sum dy * xhat | sum dy], the element
// count a channel. Channel 0 has mean 0 and bias 1e-9, and every third x of it is 0: y = 1e-9, which
// fp16 rounds to 0 (the mask off) and float and bf16 keep. Seeds: x, dy, then the parameters' five
// from `params` on.
template <class T>
struct BatchNormValues {
    std::vector<float> x, dy, relu_y, dz, dz_float, weight, bias, mean, invstd, back_sums, elements;
    core::Buffer<float> weight_d, bias_d, mean_d, invstd_d, back_sums_d, elements_d;

    BatchNormValues(const cpu::Context& host, const cuda::Context& ctx, std::size_t n, std::size_t c, std::size_t inner,
                    std::uint64_t x_seed, std::uint64_t dy_seed, std::uint64_t params)
        : x(inputs<T>(n * c * inner, x_seed)), dy(inputs<T>(n * c * inner, dy_seed)), relu_y(n * c * inner),
          dz(n * c * inner), dz_float(n * c * inner), weight(inputs<float>(c, params)), bias(inputs<float>(c, params + 1)),
          mean(inputs<float>(c, params + 2, 0.5f)), invstd(inputs<float>(c, params + 3, 0.5f)),
          back_sums(inputs<float>(2 * c, params + 4, 50.0f)), elements{float(n * inner)}
    {
        for (float& v : invstd) v += 1.0f;
        mean[0] = 0.0f, bias[0] = 1e-9f;
        for (std::size_t i = 0; i < n; ++i)
            for (std::size_t j = 0; j < inner; j += 3) x[i * c * inner + j] = 0.0f;
        cpu::batch_norm_apply(host, x.data(), relu_y.data(), n, c, inner, weight.data(), bias.data(), mean.data(),
                              invstd.data(), true);
        cpu::relu_backward(host, relu_y.data(), dy.data(), dz_float.data(), dz.size());
        relu_y = rounded<T>(relu_y);
        CHECK((relu_y[0] > 0.0f) == !std::is_same_v<T, core::fp16>);
        cpu::relu_backward(host, relu_y.data(), dy.data(), dz.data(), dz.size());
        const auto on_gpu = [&](const std::vector<float>& v) {
            auto b = ctx.allocate<float>(v.size());
            ctx.upload(b.data(), v.data(), v.size());
            return b;
        };
        weight_d = on_gpu(weight), bias_d = on_gpu(bias), mean_d = on_gpu(mean), invstd_d = on_gpu(invstd);
        back_sums_d = on_gpu(back_sums), elements_d = on_gpu(elements);
    }
};

// For each v[i]: out[2 i] = the BatchNorm + ReLU mask recomputed from x (kernels::relu_grad_from_x, with
// the coefficients of the identity, so the normalised value is v[i]), out[2 i + 1] = the rule it
// stands for, relu_grad of the ReLU's output rounded to T; the gradient is 1.
template <class T>
__global__ void mask_from_x(const float* v, float* out, unsigned n)
{
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    out[2 * i] = cuda::kernels::relu_grad_from_x<T>(v[i], {1.0f, 0.0f}, 1.0f);
    const float y = cuda::kernels::widen(cuda::kernels::narrow<T>(cuda::kernels::relu(v[i])));
    out[2 * i + 1] = cuda::kernels::relu_grad(y, 1.0f);
}

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
    const std::size_t n = 3;
    const auto b = inputs<float>(16, 7);   // biases stay float
    auto b_d = ctx.allocate<float>(16);
    ctx.upload(b_d.data(), b.data(), 16);
    // s = 16: eight-value moves within a channel; s = 13: the scalar kernel; s = 1 (a Linear's (n,
    // channels)): eight channels a move where 8 divides them, else one.
    for (const auto& [channels, s] : {std::pair<std::size_t, std::size_t>{5, 16}, {5, 13}, {5, 1}, {16, 1}})
        for (const bool relu : {false, true}) {
            INFO("channels " << channels << ", s " << s << ", relu " << relu);
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
    cpu::dropout_apply(host, 0.3f, 77, 4, 1000, x.data(), want.data(), n, size, size);
    aligned_and_not([&](std::size_t offset) {
        OnGpu<T> x_d(ctx, x, offset), y_d(ctx, std::vector<float>(x.size()), offset);
        cuda::dropout_apply(ctx, 0.3f, 77, 4, 1000, x_d.data(), y_d.data(), n, size, size);
        CHECK(differences(y_d.values(), rounded<T>(want)) == "");
    });
}

PRECISION_TEST_CASE("bf16 and fp16 on the GPU: LayerNorm, a warp a row or a block a row, rounds the GPU's float once, "
                    "within 1 ulp of the CPU's")
{
    using T = TestType;
    CPU_AND_GPU(host, ctx);
    // Rows of 768 (GPT-2's: 3 packs a lane), 2048 (8, the most), 264 (2, the second partial), 8 (one
    // lane), taken a warp a row, in one move a pack or value by value (the same bits); 300 and 2056 a
    // block a row (not packs of 8; too long).
    for (const auto& [rows, features] : {std::pair<std::size_t, std::size_t>{37, 768}, {9, 2048}, {11, 264}, {5, 8},
                                         {7, 300}, {3, 2056}})
        for (const bool affine : {true, false}) {
            INFO("rows " << rows << ", features " << features << ", affine " << affine);
            const std::size_t count = rows * features;
            const auto x = inputs<T>(count, 41), dy = inputs<T>(count, 42);
            const auto w = inputs<float>(2 * features, 43);   // weight, then bias; float
            auto w_d = ctx.allocate<float>(2 * features), stats_d = ctx.allocate<float>(4 * rows);
            auto grads_d = ctx.allocate<float>(4 * features);
            ctx.upload(w_d.data(), w.data(), 2 * features);
            const float* weight = affine ? static_cast<const float*>(w_d.data()) : nullptr;
            const float* bias = affine ? static_cast<const float*>(w_d.data() + features) : nullptr;
            std::vector<float> want_y(count), want_dx(count), want_stats(2 * rows), want_grads(2 * features);
            cpu::layer_norm_forward(host, x.data(), want_y.data(), affine ? w.data() : nullptr,
                                    affine ? w.data() + features : nullptr, rows, features, 1e-5f, want_stats.data(),
                                    want_stats.data() + rows);
            cpu::layer_norm_backward(host, x.data(), dy.data(), affine ? w.data() : nullptr,
                                     static_cast<const float*>(want_stats.data()),
                                     static_cast<const float*>(want_stats.data() + rows), want_dx.data(),
                                     affine ? want_grads.data() : nullptr, affine ? want_grads.data() + features : nullptr,
                                     rows, features);
            std::vector<std::vector<float>> outputs;   // y, dx, the statistics, the parameter gradients, by offset
            aligned_and_not([&](std::size_t offset) {
                const std::vector<float> zero(count);
                OnGpu<T> x_d(ctx, x, offset), dy_d(ctx, dy, offset), y_d(ctx, zero, offset), dx_d(ctx, zero, offset);
                OnGpu<float> xf_d(ctx, x, offset), dyf_d(ctx, dy, offset), yf_d(ctx, zero, offset), dxf_d(ctx, zero, offset);
                float* stats = stats_d.data();
                cuda::layer_norm_forward(ctx, static_cast<const T*>(x_d.data()), y_d.data(), weight, bias, rows, features,
                                         1e-5f, stats, stats + rows);
                cuda::layer_norm_forward(ctx, static_cast<const float*>(xf_d.data()), yf_d.data(), weight, bias, rows,
                                         features, 1e-5f, stats + 2 * rows, stats + 3 * rows);
                cuda::layer_norm_backward(ctx, static_cast<const T*>(x_d.data()), static_cast<const T*>(dy_d.data()), weight,
                                          static_cast<const float*>(stats), static_cast<const float*>(stats + rows),
                                          dx_d.data(), affine ? grads_d.data() : nullptr,
                                          affine ? grads_d.data() + features : nullptr, rows, features);
                cuda::layer_norm_backward(ctx, static_cast<const float*>(xf_d.data()), static_cast<const float*>(dyf_d.data()),
                                          weight, static_cast<const float*>(stats + 2 * rows),
                                          static_cast<const float*>(stats + 3 * rows), dxf_d.data(),
                                          affine ? grads_d.data() + 2 * features : nullptr,
                                          affine ? grads_d.data() + 3 * features : nullptr, rows, features);
                std::vector<float> got_stats(4 * rows), got_grads(4 * features);
                ctx.download(got_stats.data(), stats_d.data(), got_stats.size());
                ctx.download(got_grads.data(), grads_d.data(), got_grads.size());
                ctx.synchronize();
                // The T kernels are the float kernels on the same values, each stored value rounded once;
                // the statistics and the parameter gradients (float) the same bits. dx within 1 ulp: the
                // compiler may contract its multiply-adds otherwise in the two instantiations (seen once
                // in 2,100 fp16 values of the block-a-row kernel).
                const auto y = y_d.values(), dx = dx_d.values();
                CHECK(differences(y, rounded<T>(yf_d.values())) == "");
                CHECK(ulps<T>(dx, rounded<T>(dxf_d.values())) <= 1.0);
                CHECK(std::equal(got_stats.begin(), got_stats.begin() + 2 * rows, got_stats.begin() + 2 * rows));
                if (affine) CHECK(std::equal(got_grads.begin(), got_grads.begin() + 2 * features, got_grads.begin() + 2 * features));
                // Against the CPU: its sums in another order.
                CHECK(ulps<T>(y, rounded<T>(want_y)) <= 1.0);
                CHECK(ulps<T>(dx, rounded<T>(want_dx)) <= 1.0);
                CHECK(ulps<float>(std::vector<float>(got_stats.begin(), got_stats.begin() + 2 * rows), want_stats) <= 64.0);
                if (affine)
                    CHECK(ulps<float>(std::vector<float>(got_grads.begin(), got_grads.begin() + 2 * features), want_grads) <=
                          4096.0);
                outputs.push_back(y);
                outputs.push_back(dx);
                outputs.push_back(got_stats);
                outputs.push_back(affine ? got_grads : std::vector<float>{});
            });
            // Where the values start changes no bit.
            REQUIRE(outputs.size() == 8);
            for (std::size_t i = 0; i < 4; ++i) CHECK(differences(outputs[i + 4], outputs[i]) == "");
        }
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
    const std::size_t n = 4;
    // One label a sample (a block a sample; 64 classes: eight values a load) and six (a thread a
    // labelled element, in double as for float logits).
    for (const auto& [classes, pixels] : {std::pair{10, 1}, std::pair{64, 1}, std::pair{10, 6}}) {
        INFO(classes << " classes, " << pixels << " labels a sample");
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
        const auto d = d_d.values();
        if (pixels == 1) {   // float exponentials and sums: float noise, and at most T's step in the gradient
            CHECK(std::abs(slot.sum - float_slot.sum) <= 1e-6 * std::abs(float_slot.sum));
            CHECK(std::abs(slot.sum - want_slot.sum) <= 1e-6 * std::abs(want_slot.sum));
            CHECK(ulps<T>(d, rounded<T>(df_d.values())) <= 1.0);
        } else {   // the float logits' arithmetic, on values read from T
            CHECK(slot.sum == float_slot.sum);
            CHECK(std::abs(slot.sum - want_slot.sum) <= 1e-9 * std::abs(want_slot.sum));
            CHECK(differences(d, rounded<T>(df_d.values())) == "");
        }
        CHECK(ulps<T>(d, rounded<T>(dlogits)) <= 1.0);

        core::LossSlot loss_only;
        cuda::softmax_cross_entropy(ctx, classes, pixels, logits_d.data(), labels_d.data(), n, 0.25f, nullptr, &loss_only);
        ctx.synchronize();
        CHECK(loss_only.sum == slot.sum);

        CHECK(cuda::count_correct(ctx, classes, pixels, logits_d.data(), labels_d.data(), n) ==
              cpu::count_correct(host, classes, pixels, logits.data(), labels.data(), n));
    }
}

PRECISION_TEST_CASE("bf16 and fp16 on the GPU: the ReLU's mask from x is the rounded output's, at the edges of zero")
{
    using T = TestType;
    CPU_AND_GPU(host, ctx);
    // Around the largest floats that round to zero in bf16 (2^-134) and fp16 (2^-25), T's smallest
    // subnormals, zeros, infinities, NaN, fp16's overflow.
    std::vector<float> v{0.0f, -0.0f, 0x1p-149f, -0x1p-149f, 0x1p-135f, 0x1p-134f, std::nextafter(0x1p-134f, 1.0f),
                         0x1p-133f, 0x1p-26f, 0x1p-25f, std::nextafter(0x1p-25f, 1.0f), 0x1p-24f, 1.0f, -1.0f, 65504.0f,
                         65520.0f, 1e30f, INFINITY, -INFINITY, NAN};
    auto v_d = ctx.allocate<float>(v.size()), out_d = ctx.allocate<float>(2 * v.size());
    ctx.upload(v_d.data(), v.data(), v.size());
    mask_from_x<T><<<1, 32, 0, ctx.stream()>>>(v_d.data(), out_d.data(), unsigned(v.size()));
    REQUIRE(cudaGetLastError() == cudaSuccess);
    std::vector<float> out(2 * v.size());
    ctx.download(out.data(), out_d.data(), out.size());
    ctx.synchronize();
    for (std::size_t i = 0; i < v.size(); ++i) {
        INFO("v = " << v[i]);
        CHECK(std::bit_cast<std::uint32_t>(out[2 * i]) == std::bit_cast<std::uint32_t>(out[2 * i + 1]));
    }
    // The values that T rounds to zero are there: the mask is off at the bound and on just above it.
    const float largest_zero = std::is_same_v<T, core::bf16> ? 0x1p-134f : 0x1p-25f;
    const std::size_t bound = std::size_t(std::find(v.begin(), v.end(), largest_zero) - v.begin());
    REQUIRE(bound + 1 < v.size());
    CHECK(out[2 * bound + 1] == 0.0f);
    CHECK(out[2 * bound + 3] == 1.0f);
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
    BatchNormValues<T> v(host, ctx, n, c, inner, 15, 16, 17);
    const auto &x = v.x, &dy = v.dy, &dz = v.dz, &mean = v.mean, &invstd = v.invstd;
    const auto &weight = v.weight, &bias = v.bias, &back_sums = v.back_sums, &elements = v.elements;
    auto &weight_d = v.weight_d, &bias_d = v.bias_d, &mean_d = v.mean_d, &invstd_d = v.invstd_d;
    auto &back_sums_d = v.back_sums_d, &elements_d = v.elements_d;
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

        // Through the ReLU's mask, recomputed from x: the unmasked sums of dz, bit for bit; the CPU's of dz
        // within 1 ulp (the CPU's own masked passes: tests/test_precision.cpp).
        const backend::ReluAfter<T> relu_d{.weight = weight_d.data(), .bias = bias_d.data()};
        const backend::ReluAfter<float> reluf_d{.weight = weight_d.data(), .bias = bias_d.data()};
        OnGpu<T> dz_d(ctx, dz, offset);
        std::vector<float> masked(2 * c);
        cuda::batch_norm_backward_sums(ctx, x_d.data(), dz_d.data(), n, c, inner, mean_d.data(), invstd_d.data(),
                                       sums_d.data(), scratch.data());
        ctx.download(got.data(), sums_d.data(), 2 * c);
        cuda::batch_norm_backward_sums(ctx, x_d.data(), dy_d.data(), n, c, inner, mean_d.data(), invstd_d.data(),
                                       sums_d.data(), scratch.data(), relu_d);
        ctx.download(masked.data(), sums_d.data(), 2 * c);
        cpu::batch_norm_backward_sums(host, x.data(), dz.data(), n, c, inner, mean.data(), invstd.data(), sums.data(),
                                      nullptr);
        ctx.synchronize();
        CHECK(differences(masked, got) == "");
        CHECK(ulps<float>(masked, sums) <= 1.0);
        if (offset == 0) first_masked_sums = masked;
        else CHECK(differences(masked, first_masked_sums) == "");

        // Through the mask read from the ReLU's output after an addend (dy as the addend): the unmasked
        // sums of relu_backward(y, dy), bit for bit, which the sums write to dz as they read dy.
        OnGpu<T> after_d(ctx, zero, offset), relu_dz_d(ctx, zero, offset), written_d(ctx, zero, offset);
        cuda::batch_norm_apply(ctx, x_d.data(), after_d.data(), n, c, inner, weight_d.data(), bias_d.data(), mean_d.data(),
                               invstd_d.data(), true, dy_d.data());
        cuda::relu_backward(ctx, after_d.data(), dy_d.data(), relu_dz_d.data(), count);
        cuda::batch_norm_backward_sums(ctx, x_d.data(), relu_dz_d.data(), n, c, inner, mean_d.data(), invstd_d.data(),
                                       sums_d.data(), scratch.data());
        ctx.download(got.data(), sums_d.data(), 2 * c);
        cuda::batch_norm_backward_sums(ctx, x_d.data(), dy_d.data(), n, c, inner, mean_d.data(), invstd_d.data(),
                                       sums_d.data(), scratch.data(), {.y = after_d.data(), .dz = written_d.data()});
        ctx.download(masked.data(), sums_d.data(), 2 * c);
        ctx.synchronize();
        CHECK(differences(masked, got) == "");
        CHECK(differences(written_d.values(), relu_dz_d.values()) == "");

        // Elementwise passes: the GPU's float kernel rounded once; the CPU's within 1 ulp (fused multiply-adds).
        OnGpu<float> xf_d(ctx, x, offset), dyf_d(ctx, dy, offset), yf_d(ctx, zero, offset);
        for (const bool relu : {false, true})
            for (const bool add : {false, true}) {   // add: dy as the addend (a Residual's other branch)
                INFO("apply, relu " << relu << ", addend " << add);
                cuda::batch_norm_apply(ctx, x_d.data(), y_d.data(), n, c, inner, weight_d.data(), bias_d.data(),
                                       mean_d.data(), invstd_d.data(), relu, add ? dy_d.data() : nullptr);
                cuda::batch_norm_apply(ctx, xf_d.data(), yf_d.data(), n, c, inner, weight_d.data(), bias_d.data(),
                                       mean_d.data(), invstd_d.data(), relu, add ? dyf_d.data() : nullptr);
                cpu::batch_norm_apply(host, x.data(), want.data(), n, c, inner, weight.data(), bias.data(), mean.data(),
                                      invstd.data(), relu, add ? dy.data() : nullptr);
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
        // float on dz within 1 ulp.
        OnGpu<float> dzf_d(ctx, v.dz_float, offset), unmaskedf_d(ctx, zero, offset);
        OnGpu<T> unmasked_d(ctx, zero, offset);
        cuda::batch_norm_backward_input(ctx, x_d.data(), dz_d.data(), unmasked_d.data(), n, c, inner, weight_d.data(),
                                        mean_d.data(), invstd_d.data(), back_sums_d.data(), elements_d.data());
        cuda::batch_norm_backward_input(ctx, x_d.data(), dy_d.data(), y_d.data(), n, c, inner, weight_d.data(),
                                        mean_d.data(), invstd_d.data(), back_sums_d.data(), elements_d.data(), relu_d);
        cuda::batch_norm_backward_input(ctx, xf_d.data(), dzf_d.data(), unmaskedf_d.data(), n, c, inner, weight_d.data(),
                                        mean_d.data(), invstd_d.data(), back_sums_d.data(), elements_d.data());
        cuda::batch_norm_backward_input(ctx, xf_d.data(), dyf_d.data(), yf_d.data(), n, c, inner, weight_d.data(),
                                        mean_d.data(), invstd_d.data(), back_sums_d.data(), elements_d.data(), reluf_d);
        cpu::batch_norm_backward_input(host, x.data(), dz.data(), want.data(), n, c, inner, weight.data(), mean.data(),
                                       invstd.data(), back_sums.data(), elements.data());
        CHECK(differences(y_d.values(), unmasked_d.values()) == "");
        CHECK(differences(yf_d.values(), unmaskedf_d.values()) == "");
        CHECK(ulps<T>(y_d.values(), rounded<T>(want)) <= 1.0);
    });
}


PRECISION_TEST_CASE("bf16 and fp16 on the GPU: channels-last kernels equal channels-first ones, transposed")
{
    using T = TestType;
    CPU_AND_GPU(host, first);
    const cuda::Context last = gpu_context(true);
    REQUIRE(cuda::channels_last<T>(last));
    REQUIRE_FALSE(cuda::channels_last<T>(first));
    REQUIRE_FALSE(cuda::channels_last<float>(last));
    const std::size_t n = 3;
    // A sample (c, pixels) on the GPU in `ctx`'s layout, and back as (c, pixels).
    const auto put = [&](const cuda::Context& ctx, const std::vector<float>& v, std::size_t c, std::size_t pixels, std::size_t offset) {
        return OnGpu<T>(ctx, &ctx == &last ? to_channels_last(v, v.size() / (c * pixels), c, pixels) : v, offset);
    };
    const auto get = [&](const cuda::Context& ctx, const OnGpu<T>& d, std::size_t c, std::size_t pixels) {
        const auto v = d.values();
        return &ctx == &last ? to_channels_first(v, v.size() / (c * pixels), c, pixels) : v;
    };

    SECTION("the model's input and outputs: transposed on the way in and out, rounded once")
    {
        const std::size_t c = 5, pixels = 21;
        const auto x = inputs<float>(n * c * pixels, 30);
        auto x_d = first.allocate<float>(x.size()), back = first.allocate<float>(x.size());
        first.upload(x_d.data(), x.data(), x.size());
        OnGpu<T> t(last, std::vector<float>(x.size()), 0);
        cuda::to_activation_layout(last, x_d.data(), t.data(), n, c, pixels);
        CHECK(differences(t.values(), to_channels_last(rounded<T>(x), n, c, pixels)) == "");
        cuda::from_activation_layout(last, t.data(), back.data(), n, c, pixels);
        std::vector<float> got(x.size());
        last.download(got.data(), back.data(), got.size());
        last.synchronize();
        CHECK(differences(got, rounded<T>(x)) == "");
    }
    SECTION("channel bias (and ReLU), its gradient (and the ReLU's rule), dropout, channel slices")
    {
        const std::size_t s = 12;
        // 16 channels: moves of 8 channels; 5: channel by channel.
        for (const std::size_t c : {std::size_t(16), std::size_t(5)})
            for (const bool relu : {false, true})
                aligned_and_not([&](std::size_t offset) {
                    INFO(c << " channels, relu " << relu);
                    const auto b = inputs<float>(c, 31);
                    auto b_d = first.allocate<float>(c);
                    first.upload(b_d.data(), b.data(), c);
                    const auto y = inputs<T>(n * c * s, 32), dy = inputs<T>(n * c * s, 33);
                    std::vector<std::vector<float>> out, dz, db;
                    for (const cuda::Context* ctx : {&first, &last}) {
                        auto y_d = put(*ctx, y, c, s, offset), dy_d = put(*ctx, dy, c, s, offset);
                        auto dz_d = put(*ctx, std::vector<float>(y.size()), c, s, offset);
                        cuda::add_channel_bias(*ctx, b_d.data(), y_d.data(), n, c, s, relu);
                        out.push_back(get(*ctx, y_d, c, s));
                        auto partial = ctx->allocate<float>(cuda::detail::bias_scratch<T>(c, n * s));
                        auto db_d = ctx->allocate<float>(c);
                        cuda::detail::channel_sums(*ctx, dy_d.data(), db_d.data(), c, n, s, partial.data(),
                                                   relu ? y_d.data() : nullptr, relu ? dz_d.data() : nullptr);
                        std::vector<float> g(c);
                        ctx->download(g.data(), db_d.data(), c);
                        ctx->synchronize();
                        db.push_back(g);
                        dz.push_back(get(*ctx, dz_d, c, s));
                    }
                    CHECK(differences(out[1], out[0]) == "");
                    CHECK(differences(dz[1], dz[0]) == "");
                    // float sums of the same values in another order: against a double sum
                    const auto& z = relu ? dz[0] : rounded<T>(dy);
                    for (std::size_t ch = 0; ch < c; ++ch) {
                        double want = 0.0, size = 0.0;
                        for (std::size_t i = 0; i < n; ++i)
                            for (std::size_t p = 0; p < s; ++p) {
                                want += z[(i * c + ch) * s + p];
                                size += std::abs(z[(i * c + ch) * s + p]);
                            }
                        CHECK(std::abs(db[1][ch] - want) <= 1e-6 * size);
                    }
                });

        const std::size_t c = 5, pixels = 9, size = c * pixels;
        const auto x = inputs<T>(n * size, 34);
        std::vector<std::vector<float>> dropped;
        for (const cuda::Context* ctx : {&first, &last}) {
            auto x_d = put(*ctx, x, c, pixels, 0), y_d = put(*ctx, std::vector<float>(x.size()), c, pixels, 0);
            cuda::dropout_apply(*ctx, 0.3f, 77, 4, 1000, x_d.data(), y_d.data(), n, size, c);
            dropped.push_back(get(*ctx, y_d, c, pixels));
        }
        CHECK(differences(dropped[1], dropped[0]) == "");
        std::vector<float> want(x.size());
        cpu::dropout_apply(host, 0.3f, 77, 4, 1000, x.data(), want.data(), n, size, c);
        CHECK(differences(dropped[1], rounded<T>(want)) == "");

        const std::size_t cs = 2, channels = 5, at = 2;
        for (const std::size_t px : {std::size_t(8), std::size_t(7)}) {
            const auto src = inputs<T>(n * cs * px, 35), whole = inputs<T>(n * channels * px, 36);
            std::vector<std::vector<float>> in, out;
            for (const cuda::Context* ctx : {&first, &last}) {
                auto src_d = put(*ctx, src, cs, px, 0), whole_d = put(*ctx, whole, channels, px, 0);
                auto out_d = put(*ctx, std::vector<float>(src.size()), cs, px, 0);
                cuda::copy_channels_out(*ctx, whole_d.data(), channels, at, n, cs, px, out_d.data());
                out.push_back(get(*ctx, out_d, cs, px));
                cuda::copy_channels_in(*ctx, src_d.data(), n, cs, px, whole_d.data(), channels, at);
                in.push_back(get(*ctx, whole_d, channels, px));
            }
            CHECK(differences(out[1], out[0]) == "");
            CHECK(differences(in[1], in[0]) == "");
        }
    }
    SECTION("max and average pooling, a global average, forward and backward")
    {
        // offset 0: channels-last activations of a multiple of 8 channels run eight channels a
        // thread; offset 1 (buffers not 16-byte aligned) one; both give channels-first's bits.
        const auto pools = [&](auto window, std::size_t offset) {
            constexpr core::Window g = decltype(window)::value;
            const std::size_t in = n * g.in_size(), out = n * g.c * g.out_pixels(), ip = std::size_t(g.h) * g.w,
                              op = std::size_t(g.oh) * g.ow;
            const auto x = inputs<T>(in, 37), dy = inputs<T>(out, 38);
            std::vector<std::vector<float>> r[5];
            std::vector<std::vector<core::pool_position_t<g>>> args;
            for (const cuda::Context* ctx : {&first, &last}) {
                auto x_d = put(*ctx, x, g.c, ip, offset), dy_d = put(*ctx, dy, g.c, op, offset);
                auto y_d = put(*ctx, std::vector<float>(out), g.c, op, offset), dx_d = put(*ctx, std::vector<float>(in), g.c, ip, offset);
                auto arg_d = ctx->allocate<core::pool_position_t<g>>(out);
                cuda::max_pool_forward<g>(*ctx, x_d.data(), y_d.data(), arg_d.data(), n);
                r[0].push_back(get(*ctx, y_d, g.c, op));
                std::vector<core::pool_position_t<g>> a(out);
                ctx->download(a.data(), arg_d.data(), out);
                ctx->synchronize();
                args.push_back(ctx == &last ? to_channels_first(a, n, g.c, op) : a);
                cuda::max_pool_backward<g>(*ctx, arg_d.data(), dy_d.data(), dx_d.data(), n);
                r[1].push_back(get(*ctx, dx_d, g.c, ip));
                cuda::avg_pool_forward<g>(*ctx, x_d.data(), y_d.data(), n);
                r[2].push_back(get(*ctx, y_d, g.c, op));
                cuda::avg_pool_backward<g>(*ctx, dy_d.data(), dx_d.data(), n);
                r[3].push_back(get(*ctx, dx_d, g.c, ip));
            }
            for (int k = 0; k < 4; ++k) CHECK(differences(r[k][1], r[k][0]) == "");
            CHECK(args[1] == args[0]);
        };
        for (const std::size_t offset : {std::size_t(0), std::size_t(1)}) {
            CAPTURE(offset);
            pools(std::integral_constant<core::Window, core::Window{3, 9, 8, 3, 3, 2, 2, 1, 0, 5, 4}>{}, offset);
            pools(std::integral_constant<core::Window, core::Window{16, 9, 8, 3, 3, 2, 2, 1, 1, 5, 4}>{}, offset);
            pools(std::integral_constant<core::Window, core::Window{16, 6, 5, 3, 3, 1, 1, 1, 1, 6, 5}>{}, offset);   // inception's
            pools(std::integral_constant<core::Window, core::Window{8, 7, 7, 7, 7, 1, 1, 0, 0, 1, 1}>{}, offset);
        }
    }
    SECTION("softmax cross-entropy over pixels, and the arg-max count")
    {
        const int classes = 10, pixels = 6;
        const auto logits = inputs<T>(n * classes * pixels, 39);
        std::vector<std::int32_t> labels(n * pixels);
        for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = std::int32_t((i * 7 + 3) % classes);
        auto labels_d = first.allocate<std::int32_t>(labels.size());
        first.upload(labels_d.data(), labels.data(), labels.size());
        std::vector<std::vector<float>> d;
        std::vector<double> sums;
        std::vector<std::size_t> hits;
        for (const cuda::Context* ctx : {&first, &last}) {
            auto z_d = put(*ctx, logits, classes, pixels, 0), d_d = put(*ctx, std::vector<float>(logits.size()), classes, pixels, 0);
            core::LossSlot slot;
            cuda::softmax_cross_entropy(*ctx, classes, pixels, z_d.data(), labels_d.data(), n, 0.25f, d_d.data(), &slot);
            ctx->synchronize();
            sums.push_back(slot.sum);
            d.push_back(get(*ctx, d_d, classes, pixels));
            hits.push_back(cuda::count_correct(*ctx, classes, pixels, z_d.data(), labels_d.data(), n));
        }
        CHECK(sums[1] == sums[0]);
        CHECK(differences(d[1], d[0]) == "");
        CHECK(hits[1] == hits[0]);
    }
    SECTION("BatchNorm over many rows (a lane of the channels-last sums adds about 32, four loads in flight): sums within their bound, the same bits from moves of eight and of one; maps bit for bit")
    {
        // 655,366 rows of 64 channels. The masked sums are checked against the unmasked sums of the GPU's
        // own relu_backward, bit for bit (a value whose sign the CPU's rounding flips would move a whole
        // sum).
        const std::size_t rows_n = 2, c = 64, inner = 327683, count = rows_n * c * inner;
        BatchNormValues<T> v(host, first, rows_n, c, inner, 50, 51, 53);
        const backend::ReluAfter<T> relu{.weight = v.weight_d.data(), .bias = v.bias_d.data()};
        std::vector<float> want(2 * c + 1), want_back(2 * c);
        cpu::batch_norm_sums(host, v.x.data(), rows_n, c, inner, v.mean.data(), want.data(), nullptr);
        cpu::batch_norm_backward_sums(host, v.x.data(), v.dy.data(), rows_n, c, inner, v.mean.data(), v.invstd.data(),
                                      want_back.data(), nullptr);
        const auto bound = column_sum_bounds(v.x, {}, rows_n, c, inner, v.mean, v.invstd);
        const auto back_bound = column_sum_bounds(v.x, v.dy, rows_n, c, inner, v.mean, v.invstd);
        std::vector<std::vector<float>> applied, added, written, back, sums_last;
        const std::vector<float> zero(count);
        for (const cuda::Context* ctx : {&first, &last}) {
            INFO((ctx == &last ? "channels-last" : "channels-first"));
            auto scratch = ctx->allocate<float>(cuda::batch_norm_scratch<T>(*ctx, c));
            auto sums_d = ctx->allocate<float>(2 * c + 1);
            auto x_d = put(*ctx, v.x, c, inner, 0), dy_d = put(*ctx, v.dy, c, inner, 0);
            auto y_d = put(*ctx, zero, c, inner, 0), g_d = put(*ctx, zero, c, inner, 0), w_d = put(*ctx, zero, c, inner, 0);
            const auto read = [&](std::size_t k) {
                std::vector<float> r(k);
                ctx->download(r.data(), sums_d.data(), k);
                ctx->synchronize();
                return r;
            };
            const auto backward_sums = [&](OnGpu<T>& d, backend::ReluAfter<T> mask) {
                cuda::batch_norm_backward_sums(*ctx, x_d.data(), d.data(), rows_n, c, inner, v.mean_d.data(), v.invstd_d.data(),
                                               sums_d.data(), scratch.data(), mask);
                return read(2 * c);
            };
            cuda::batch_norm_sums(*ctx, x_d.data(), rows_n, c, inner, v.mean_d.data(), sums_d.data(), scratch.data());
            const auto s = read(2 * c + 1);
            const auto bs = backward_sums(dy_d, {});
            if (ctx == &last) {
                CHECK(beyond(s, want, bound) <= 1.0);
                CHECK(beyond(bs, want_back, back_bound) <= 1.0);
                sums_last = {s, bs};
            } else {
                CHECK(ulps<float>(s, want) <= 1.0);
                CHECK(ulps<float>(bs, want_back) <= 1.0);
            }
            for (const bool add : {false, true}) {
                INFO("apply, addend " << add);
                cuda::batch_norm_apply(*ctx, x_d.data(), y_d.data(), rows_n, c, inner, v.weight_d.data(), v.bias_d.data(),
                                       v.mean_d.data(), v.invstd_d.data(), true, add ? dy_d.data() : nullptr);
                (add ? added : applied).push_back(get(*ctx, y_d, c, inner));
                cuda::relu_backward(*ctx, y_d.data(), dy_d.data(), g_d.data(), count);
                const auto unmasked = backward_sums(g_d, {});
                if (add) {   // the mask read from y, its gradient written
                    CHECK(differences(backward_sums(dy_d, {.y = y_d.data(), .dz = w_d.data()}), unmasked) == "");
                    CHECK(differences(w_d.values(), g_d.values()) == "");
                    written.push_back(get(*ctx, w_d, c, inner));
                } else {   // the mask recomputed from x
                    CHECK(differences(backward_sums(dy_d, relu), unmasked) == "");
                }
            }
            cuda::batch_norm_backward_input(*ctx, x_d.data(), dy_d.data(), y_d.data(), rows_n, c, inner, v.weight_d.data(),
                                            v.mean_d.data(), v.invstd_d.data(), v.back_sums_d.data(), v.elements_d.data(), relu);
            back.push_back(get(*ctx, y_d, c, inner));
        }
        {   // channels-last from pointers a value off 16-byte alignment: values one at a time, the same sums
            INFO("channels-last, one value at a time");
            auto scratch = last.allocate<float>(cuda::batch_norm_scratch<T>(last, c));
            auto sums_d = last.allocate<float>(2 * c + 1);
            auto x_d = put(last, v.x, c, inner, 1), dy_d = put(last, v.dy, c, inner, 1);
            std::vector<float> s(2 * c + 1), bs(2 * c);
            cuda::batch_norm_sums(last, x_d.data(), rows_n, c, inner, v.mean_d.data(), sums_d.data(), scratch.data());
            last.download(s.data(), sums_d.data(), s.size());
            cuda::batch_norm_backward_sums(last, x_d.data(), dy_d.data(), rows_n, c, inner, v.mean_d.data(), v.invstd_d.data(),
                                           sums_d.data(), scratch.data());
            last.download(bs.data(), sums_d.data(), bs.size());
            last.synchronize();
            REQUIRE(sums_last.size() == 2);
            CHECK(differences(s, sums_last[0]) == "");
            CHECK(differences(bs, sums_last[1]) == "");
        }
        CHECK(differences(applied[1], applied[0]) == "");
        CHECK(differences(added[1], added[0]) == "");
        CHECK(differences(written[1], written[0]) == "");
        CHECK(differences(back[1], back[0]) == "");
        CHECK(ulps<T>(applied[0], v.relu_y) <= 1.0);
    }
    SECTION("BatchNorm: sums within a float ulp of the CPU's (channels-last: within the bound of its float lanes), whatever the alignment; apply and backward bit for bit")
    {
        const std::size_t inner = 36;
        for (const std::size_t c : {std::size_t(16), std::size_t(5)}) {
            INFO(c << " channels");
            const std::size_t count = n * c * inner;
            BatchNormValues<T> v(host, first, n, c, inner, 40, 41, 43);
            const auto &x = v.x, &dy = v.dy, &dz = v.dz, &mean = v.mean, &invstd = v.invstd;
            auto &weight_d = v.weight_d, &bias_d = v.bias_d, &mean_d = v.mean_d, &invstd_d = v.invstd_d;
            const backend::ReluAfter<T> relu{.weight = weight_d.data(), .bias = bias_d.data()};
            auto &back_sums_d = v.back_sums_d, &elements_d = v.elements_d;
            std::vector<float> want(2 * c + 1), want_back(2 * c), want_masked(2 * c);
            cpu::batch_norm_sums(host, x.data(), n, c, inner, mean.data(), want.data(), nullptr);
            cpu::batch_norm_backward_sums(host, x.data(), dy.data(), n, c, inner, mean.data(), invstd.data(), want_back.data(), nullptr);
            cpu::batch_norm_backward_sums(host, x.data(), dz.data(), n, c, inner, mean.data(), invstd.data(), want_masked.data(), nullptr);
            // After an addend (dy): the CPU's sums of relu_backward(y, dy), y rounded to T.
            std::vector<float> after(count), after_dz(count), want_after(2 * c);
            cpu::batch_norm_apply(host, x.data(), after.data(), n, c, inner, v.weight.data(), v.bias.data(), mean.data(),
                                  invstd.data(), true, dy.data());
            after = rounded<T>(after);
            cpu::relu_backward(host, after.data(), dy.data(), after_dz.data(), count);
            cpu::batch_norm_backward_sums(host, x.data(), after_dz.data(), n, c, inner, mean.data(), invstd.data(),
                                          want_after.data(), nullptr);
            const auto bound = column_sum_bounds(x, {}, n, c, inner, mean, invstd);
            const auto back_bound = column_sum_bounds(x, dy, n, c, inner, mean, invstd);
            const auto masked_bound = column_sum_bounds(x, dz, n, c, inner, mean, invstd);
            const auto after_bound = column_sum_bounds(x, after_dz, n, c, inner, mean, invstd);
            // Within a float ulp of the CPU's double sums (channels-first, in double too); channels-last
            // within the bound of its float lanes.
            const auto close = [&](const cuda::Context* ctx, const std::vector<float>& got, const std::vector<float>& want,
                                   const std::vector<double>& b) {
                return ctx == &last ? beyond(got, want, b) <= 1.0 : ulps<float>(got, want) <= 1.0;
            };
            std::vector<float> first_bits[4];
            std::vector<std::vector<float>> applied, back, back_masked, written;
            for (const cuda::Context* ctx : {&first, &last})
                aligned_and_not([&](std::size_t offset) {
                    INFO((ctx == &last ? "channels-last" : "channels-first"));
                    auto scratch = ctx->allocate<float>(cuda::batch_norm_scratch<T>(*ctx, c));
                    auto sums_d = ctx->allocate<float>(2 * c + 1);
                    auto x_d = put(*ctx, x, c, inner, offset), dy_d = put(*ctx, dy, c, inner, offset);
                    auto y_d = put(*ctx, std::vector<float>(count), c, inner, offset);
                    const auto read = [&](std::size_t k) {
                        std::vector<float> v(k);
                        ctx->download(v.data(), sums_d.data(), k);
                        ctx->synchronize();
                        return v;
                    };
                    cuda::batch_norm_sums(*ctx, x_d.data(), n, c, inner, mean_d.data(), sums_d.data(), scratch.data());
                    const auto s = read(2 * c + 1);
                    CHECK(close(ctx, s, want, bound));
                    {   // the statistics in the sums' last pass: batch_norm_statistics' bits, and the same sums
                        std::vector<float> running(2 * c);   // [mean | var], the same start both ways
                        for (std::size_t ch = 0; ch < c; ++ch)
                            running[ch] = mean[ch], running[c + ch] = 0.5f + 0.25f * float(ch);
                        std::vector<float> got[2];
                        for (const bool fused : {false, true}) {
                            auto r_d = ctx->allocate<float>(2 * c), stats_d = ctx->allocate<float>(2 * c);
                            auto sums2_d = ctx->allocate<float>(2 * c + 1);
                            ctx->upload(r_d.data(), running.data(), running.size());
                            const backend::StatisticsUpdate then{.running_mean = r_d.data(), .running_var = r_d.data() + c,
                                                                 .momentum = 0.1f, .eps = 1e-5f, .mean = stats_d.data(),
                                                                 .invstd = stats_d.data() + c};
                            if (fused) {
                                cuda::batch_norm_sums(*ctx, x_d.data(), n, c, inner, r_d.data(), sums2_d.data(), scratch.data(), then);
                            } else {
                                cuda::batch_norm_sums(*ctx, x_d.data(), n, c, inner, r_d.data(), sums2_d.data(), scratch.data());
                                cuda::batch_norm_statistics(*ctx, sums2_d.data(), then.running_mean, then.running_var,
                                                            then.momentum, then.eps, then.mean, then.invstd, c);
                            }
                            std::vector<float> out(6 * c + 1);
                            ctx->download(out.data(), sums2_d.data(), 2 * c + 1);
                            ctx->download(out.data() + 2 * c + 1, r_d.data(), 2 * c);
                            ctx->download(out.data() + 4 * c + 1, stats_d.data(), 2 * c);
                            ctx->synchronize();
                            got[fused] = out;
                        }
                        CHECK(differences(got[1], got[0]) == "");
                        CHECK(got[0][5 * c + 1] > 0.0f);   // an invstd was written (the buffer starts zeroed)
                    }
                    cuda::batch_norm_backward_sums(*ctx, x_d.data(), dy_d.data(), n, c, inner, mean_d.data(), invstd_d.data(),
                                                   sums_d.data(), scratch.data());
                    const auto bs = read(2 * c);
                    CHECK(close(ctx, bs, want_back, back_bound));
                    cuda::batch_norm_backward_sums(*ctx, x_d.data(), dy_d.data(), n, c, inner, mean_d.data(), invstd_d.data(),
                                                   sums_d.data(), scratch.data(), relu);
                    const auto ms = read(2 * c);
                    CHECK(close(ctx, ms, want_masked, masked_bound));
                    // The mask read from the output after an addend (dy), its gradient written as the sums go.
                    auto after_d = put(*ctx, std::vector<float>(count), c, inner, offset);
                    auto written_d = put(*ctx, std::vector<float>(count), c, inner, offset);
                    cuda::batch_norm_apply(*ctx, x_d.data(), after_d.data(), n, c, inner, weight_d.data(), bias_d.data(),
                                           mean_d.data(), invstd_d.data(), true, dy_d.data());
                    cuda::batch_norm_backward_sums(*ctx, x_d.data(), dy_d.data(), n, c, inner, mean_d.data(), invstd_d.data(),
                                                   sums_d.data(), scratch.data(), {.y = after_d.data(), .dz = written_d.data()});
                    const auto ys = read(2 * c);
                    written.push_back(get(*ctx, written_d, c, inner));
                    CHECK(close(ctx, ys, want_after, after_bound));
                    if (offset == 0) {
                        first_bits[0] = s, first_bits[1] = bs, first_bits[2] = ms, first_bits[3] = ys;
                    } else {   // how values are read leaves the sums' bits alone
                        CHECK(differences(s, first_bits[0]) == "");
                        CHECK(differences(bs, first_bits[1]) == "");
                        CHECK(differences(ms, first_bits[2]) == "");
                        CHECK(differences(ys, first_bits[3]) == "");
                    }
                    cuda::batch_norm_apply(*ctx, x_d.data(), y_d.data(), n, c, inner, weight_d.data(), bias_d.data(), mean_d.data(),
                                           invstd_d.data(), true);
                    applied.push_back(get(*ctx, y_d, c, inner));
                    cuda::batch_norm_backward_input(*ctx, x_d.data(), dy_d.data(), y_d.data(), n, c, inner, weight_d.data(),
                                                    mean_d.data(), invstd_d.data(), back_sums_d.data(), elements_d.data());
                    back.push_back(get(*ctx, y_d, c, inner));
                    cuda::batch_norm_backward_input(*ctx, x_d.data(), dy_d.data(), y_d.data(), n, c, inner, weight_d.data(),
                                                    mean_d.data(), invstd_d.data(), back_sums_d.data(), elements_d.data(),
                                                    relu);
                    back_masked.push_back(get(*ctx, y_d, c, inner));
                });
            for (std::size_t k = 1; k < applied.size(); ++k) {
                CHECK(differences(applied[k], applied[0]) == "");
                CHECK(differences(back[k], back[0]) == "");
                CHECK(differences(back_masked[k], back_masked[0]) == "");
                CHECK(differences(written[k], written[0]) == "");
            }
        }
    }
}
