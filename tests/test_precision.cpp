// Mixed precision on the CPU backend (issue 23).
//
// Number formats: core::from_float and core::to_float for bf16 and fp16 against PyTorch's .bfloat16()
// and .half() (tests/pytorch/numbers.txt, written by tests/pytorch/make_number_fixtures.py), and every
// one of the 65536 bit patterns of each format round-tripped through float.
//
// Kernels: every CPU backend function that takes activations, in bf16 and fp16, against the same
// function in float on the same (already rounded) inputs. The CPU backend computes in float exactly
// as for float and rounds once where it stores a T value, so each check is exact: a T output must be
// from_float<T> of the float output bit for bit, and a float output (parameter gradients, statistics,
// the loss) the float output itself. No tolerance is needed anywhere.
//
// Random inputs draw from a fixed seed a test case (tests/seeds.hpp) and print it on failure with the
// command that reruns it; REPLICA_TEST_SEED=<seed> runs them on another.

#include <bit>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "replica/replica.hpp"

#include "catch.hpp"
#include "fixtures.hpp"
#include "seeds.hpp"
#include "support.hpp"

// The runner compiles the test files in groups (tests/meson.build): this file's names stay in its own
// namespace.
namespace test_precision {

namespace {

using namespace replica;
using Ctx = backend::cpu::Context;
using core::bf16;
using core::fp16;
namespace cpu = backend::cpu;

// A generator on the test's seed, and the line that reruns it.
struct Random {
    std::uint64_t seed = testing::test_seed();
    std::mt19937_64 rng{seed};
    std::string rerun = testing::rerun(seed);
};

std::uint32_t bits_of(float f) { return std::bit_cast<std::uint32_t>(f); }
std::uint32_t bits_of(bf16 v) { return v.bits; }
std::uint32_t bits_of(fp16 v) { return v.bits; }

// Random values in [lo, hi) rounded to T: `t` holds them as T, `f` the same values as float.
template <class T>
struct Rounded {
    std::vector<T> t;
    std::vector<float> f;
};

template <class T>
Rounded<T> rounded(std::size_t n, std::mt19937_64& rng, float lo = -2.0f, float hi = 2.0f)
{
    std::uniform_real_distribution<float> d(lo, hi);
    Rounded<T> r{std::vector<T>(n), std::vector<float>(n)};
    for (std::size_t i = 0; i < n; ++i) {
        r.t[i] = core::from_float<T>(d(rng));
        r.f[i] = core::to_float(r.t[i]);
    }
    return r;
}

std::vector<float> random_floats(std::size_t n, std::mt19937_64& rng, float lo = -1.0f, float hi = 1.0f)
{
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
}

// "" when got[i] is from_float<T>(want[i]) bit for bit for every i; otherwise how they differ.
template <class T>
std::string rounding_differences(const char* what, const std::vector<T>& got, const std::vector<float>& want)
{
    if (got.size() != want.size()) return std::string(what) + ": sizes differ";
    std::size_t count = 0, first = 0;
    for (std::size_t i = 0; i < got.size(); ++i)
        if (bits_of(got[i]) != bits_of(core::from_float<T>(want[i])) && count++ == 0) first = i;
    if (count == 0) return "";
    return std::string(what) + ": " + std::to_string(count) + " of " + std::to_string(got.size()) +
           " differ, first at " + std::to_string(first) + " (" + std::to_string(core::to_float(got[first])) +
           " vs float " + std::to_string(want[first]) + ")";
}

std::string float_differences(const char* what, const std::vector<float>& got, const std::vector<float>& want)
{
    const std::string d = testing::differences(got, want);
    return d.empty() ? d : std::string(what) + ": " + d;
}

// A kernel f(in..., out) run in float on the inputs' float values and in T on their T values.
template <class T, class F, class... R>
std::string unary_or_binary(const char* what, F f, std::size_t out_count, const R&... in)
{
    std::vector<float> want(out_count);
    std::vector<T> got(out_count);
    f(in.f.data()..., want.data());
    f(in.t.data()..., got.data());
    return rounding_differences(what, got, want);
}

// Scratch with a guard of NaNs past its end; guard_intact() says whether a kernel wrote past it.
class Scratch {
public:
    explicit Scratch(std::size_t n) : size_(n), v_(n + kGuard, std::numeric_limits<float>::quiet_NaN()) {}
    float* data() { return v_.data(); }
    bool guard_intact() const
    {
        for (std::size_t i = size_; i < v_.size(); ++i)
            if (!std::isnan(v_[i])) return false;
        return true;
    }

private:
    static constexpr std::size_t kGuard = 64;
    std::size_t size_;
    std::vector<float> v_;
};

} // namespace

// ---------------------------------------------------------------------------------------------
// Number formats

TEST_CASE("bf16 and fp16 conversions equal PyTorch's: ties to even, subnormals, overflow, NaN, infinity, -0",
          "[cpu][precision]")
{
    const auto f = testing::read_fixture("numbers.txt");
    const std::vector<double>& input = f.at("input");
    REQUIRE(input.size() > 1000);
    for (const char* name : {"bf16", "fp16", "bf16_float", "fp16_float"}) REQUIRE(f.at(name).size() == input.size());

    std::size_t nans = 0, checked = 0;
    std::string failures;
    auto fail = [&](const char* what, std::size_t i, std::uint32_t got, double want) {
        if (failures.size() < 2000)
            failures += std::string(what) + " of input " + std::to_string(std::uint32_t(input[i])) + ": got " +
                        std::to_string(got) + ", PyTorch " + std::to_string(std::uint64_t(want)) + "\n";
    };
    for (std::size_t i = 0; i < input.size(); ++i) {
        const float x = std::bit_cast<float>(std::uint32_t(input[i]));
        const bf16 b = core::from_float<bf16>(x);
        const fp16 h = core::from_float<fp16>(x);
        if (std::isnan(x)) {
            // PyTorch's NaN bits depend on its code path; a NaN must stay a NaN.
            ++nans;
            if (!std::isnan(core::to_float(b))) fail("bf16 NaN", i, b.bits, f.at("bf16")[i]);
            if (!std::isnan(core::to_float(h))) fail("fp16 NaN", i, h.bits, f.at("fp16")[i]);
            continue;
        }
        ++checked;
        if (b.bits != f.at("bf16")[i]) fail("from_float<bf16>", i, b.bits, f.at("bf16")[i]);
        if (h.bits != f.at("fp16")[i]) fail("from_float<fp16>", i, h.bits, f.at("fp16")[i]);
        const bf16 tb{std::uint16_t(f.at("bf16")[i])};
        const fp16 th{std::uint16_t(f.at("fp16")[i])};
        if (bits_of(core::to_float(tb)) != f.at("bf16_float")[i]) fail("to_float(bf16)", i, bits_of(core::to_float(tb)), f.at("bf16_float")[i]);
        if (bits_of(core::to_float(th)) != f.at("fp16_float")[i]) fail("to_float(fp16)", i, bits_of(core::to_float(th)), f.at("fp16_float")[i]);
        if (bits_of(core::round_through<bf16>(x)) != f.at("bf16_float")[i])
            fail("round_through<bf16>", i, bits_of(core::round_through<bf16>(x)), f.at("bf16_float")[i]);
        if (bits_of(core::round_through<fp16>(x)) != f.at("fp16_float")[i])
            fail("round_through<fp16>", i, bits_of(core::round_through<fp16>(x)), f.at("fp16_float")[i]);
    }
    INFO(checked << " finite or infinite inputs, " << nans << " NaNs");
    CHECK(nans >= 4);
    CHECK(failures == "");
}

TEST_CASE("Every bf16 and fp16 bit pattern survives to_float then from_float (NaNs stay NaN)", "[cpu][precision]")
{
    std::size_t bf16_nans = 0, fp16_nans = 0;
    std::string failures;
    for (std::uint32_t u = 0; u < 65536; ++u) {
        const bf16 b{std::uint16_t(u)};
        const fp16 h{std::uint16_t(u)};
        const float fb = core::to_float(b), fh = core::to_float(h);
        const bf16 b2 = core::from_float<bf16>(fb);
        const fp16 h2 = core::from_float<fp16>(fh);
        if (std::isnan(fb)) {
            ++bf16_nans;
            if (!std::isnan(core::to_float(b2))) failures += "bf16 NaN " + std::to_string(u) + " lost\n";
        } else if (b2.bits != b.bits) {
            failures += "bf16 " + std::to_string(u) + " -> " + std::to_string(b2.bits) + "\n";
        }
        if (std::isnan(fh)) {
            ++fp16_nans;
            if (!std::isnan(core::to_float(h2))) failures += "fp16 NaN " + std::to_string(u) + " lost\n";
        } else if (h2.bits != h.bits) {
            failures += "fp16 " + std::to_string(u) + " -> " + std::to_string(h2.bits) + "\n";
        }
        if (failures.size() > 2000) break;
    }
    CHECK(failures == "");
    // NaNs: an all-ones exponent with a non-zero fraction, either sign (7 fraction bits, 10).
    CHECK(bf16_nans == 2 * 127);
    CHECK(fp16_nans == 2 * 1023);
}

// ---------------------------------------------------------------------------------------------
// Kernels: T against float, same inputs

// The functions take T where the signature rule says so and deduce it from the pointers.
template <class X, class Y>
concept relu_takes = requires(const Ctx& c, const X* x, Y* y) { cpu::relu_forward(c, x, y, std::size_t{}); };
static_assert(relu_takes<float, float> && relu_takes<bf16, bf16> && relu_takes<fp16, fp16>);
static_assert(!relu_takes<bf16, float> && !relu_takes<fp16, bf16> && !relu_takes<double, double>);
template <class S, class D>
concept converts = requires(const Ctx& c, const S* s, D* d) { cpu::convert(c, s, d, std::size_t{}); };
static_assert(converts<float, bf16> && converts<fp16, bf16> && converts<bf16, bf16> && !converts<double, float>);

namespace {

// Activations and their gradients, dropout, copy, fill, add, add_into and the channel slices.
template <class T>
void check_elementwise(const Ctx& ctx, Random& random)
{
    auto& rng = random.rng;
    constexpr std::size_t n = 999;
    const auto x = rounded<T>(n, rng, -4.0f, 4.0f), y = rounded<T>(n, rng, -1.0f, 1.0f), dy = rounded<T>(n, rng);

    auto run = [&](const char* what, auto f, const auto&... in) { return unary_or_binary<T>(what, f, n, in...); };
    CHECK(run("relu_forward", [&](const auto* a, auto* b) { cpu::relu_forward(ctx, a, b, n); }, x) == "");
    CHECK(run("sigmoid_forward", [&](const auto* a, auto* b) { cpu::sigmoid_forward(ctx, a, b, n); }, x) == "");
    CHECK(run("tanh_forward", [&](const auto* a, auto* b) { cpu::tanh_forward(ctx, a, b, n); }, x) == "");
    CHECK(run("gelu_forward", [&](const auto* a, auto* b) { cpu::gelu_forward(ctx, a, b, n); }, x) == "");
    CHECK(run("relu_backward", [&](const auto* a, const auto* d, auto* b) { cpu::relu_backward(ctx, a, d, b, n); }, y, dy) == "");
    CHECK(run("sigmoid_backward", [&](const auto* a, const auto* d, auto* b) { cpu::sigmoid_backward(ctx, a, d, b, n); }, y, dy) == "");
    CHECK(run("tanh_backward", [&](const auto* a, const auto* d, auto* b) { cpu::tanh_backward(ctx, a, d, b, n); }, y, dy) == "");
    CHECK(run("gelu_backward", [&](const auto* a, const auto* d, auto* b) { cpu::gelu_backward(ctx, a, d, b, n); }, x, dy) == "");
    CHECK(run("dropout_apply", [&](const auto* a, auto* b) { cpu::dropout_apply(ctx, 0.3f, random.seed, 7, 11, a, b, 27, 37, 37); }, x) == "");
    CHECK(run("copy", [&](const auto* a, auto* b) { cpu::copy(ctx, a, b, n); }, x) == "");
    CHECK(run("fill", [&](auto* b) { cpu::fill(ctx, b, 0.1f, n); }) == "");
    CHECK(run("add", [&](const auto* a, const auto* d, auto* b) {
              cpu::copy(ctx, d, b, n);
              cpu::add(ctx, a, b, n);
          }, x, dy) == "");
    for (const bool relu : {false, true}) {
        INFO("relu " << relu);
        CHECK(run("add_into", [&](const auto* a, const auto* d, auto* b) { cpu::add_into(ctx, a, d, b, n, relu); }, x, dy) == "");
    }

    // Channel slices: (3, 5, 37) into channels [4, 9) of (3, 11, 37), and back out.
    constexpr std::size_t samples = 3, c = 5, channels = 11, offset = 4, pixels = 37;
    const auto part = rounded<T>(samples * c * pixels, rng), whole = rounded<T>(samples * channels * pixels, rng);
    std::vector<float> want = whole.f;
    std::vector<T> got = whole.t;
    cpu::copy_channels_in(ctx, part.f.data(), samples, c, pixels, want.data(), channels, offset);
    cpu::copy_channels_in(ctx, part.t.data(), samples, c, pixels, got.data(), channels, offset);
    CHECK(rounding_differences("copy_channels_in", got, want) == "");
    CHECK(unary_or_binary<T>("copy_channels_out", [&](const auto* a, auto* b) {
              cpu::copy_channels_out(ctx, a, channels, offset, samples, c, pixels, b);
          }, samples * c * pixels, whole) == "");
}

// float -> T, T -> float, T -> T and T -> the other 16-bit format; -0, infinity, fp16 overflow and
// subnormals among the values.
template <class T>
void check_convert(const Ctx& ctx, Random& random)
{
    auto& rng = random.rng;
    using Other = std::conditional_t<std::same_as<T, bf16>, fp16, bf16>;
    constexpr std::size_t n = 777;
    std::vector<float> f = random_floats(n, rng, -70000.0f, 70000.0f);
    f[0] = -0.0f;
    f[1] = std::numeric_limits<float>::infinity();
    f[2] = 1e-7f;
    std::vector<T> t(n), same(n);
    cpu::convert(ctx, f.data(), t.data(), n);
    CHECK(rounding_differences("float -> T", t, f) == "");
    std::vector<float> values(n), back(n);
    for (std::size_t i = 0; i < n; ++i) values[i] = core::to_float(t[i]);
    cpu::convert(ctx, t.data(), back.data(), n);
    CHECK(float_differences("T -> float", back, values) == "");
    cpu::convert(ctx, t.data(), same.data(), n);
    CHECK(rounding_differences("T -> T", same, values) == "");
    std::vector<Other> other(n);
    cpu::convert(ctx, t.data(), other.data(), n);
    CHECK(rounding_differences("T -> the other 16-bit format", other, values) == "");
}

// Max and average pooling, forward and backward.
template <class T>
void check_pooling(const Ctx& ctx, Random& random)
{
    auto& rng = random.rng;
    // Overlapping 3x3 windows, stride 2, padding 1: an input gradient element sums up to 4 windows.
    constexpr core::Window g{3, 9, 9, 3, 3, 2, 2, 1, 1, 5, 5};
    constexpr std::size_t n = 4, in = n * g.in_size(), out = n * g.c * g.out_pixels();
    const auto x = rounded<T>(in, rng), dy = rounded<T>(out, rng);

    std::vector<float> yf(out), dxf(in);
    std::vector<core::pool_position_t<g>> argf(out), argt(out);
    std::vector<T> yt(out), dxt(in);
    cpu::max_pool_forward<g>(ctx, x.f.data(), yf.data(), argf.data(), n);
    cpu::max_pool_forward<g>(ctx, x.t.data(), yt.data(), argt.data(), n);
    CHECK(rounding_differences("max_pool_forward", yt, yf) == "");
    CHECK(argt == argf);
    cpu::max_pool_backward<g>(ctx, argf.data(), dy.f.data(), dxf.data(), n);
    cpu::max_pool_backward<g>(ctx, argf.data(), dy.t.data(), dxt.data(), n);
    CHECK(rounding_differences("max_pool_backward", dxt, dxf) == "");

    cpu::avg_pool_forward<g>(ctx, x.f.data(), yf.data(), n);
    cpu::avg_pool_forward<g>(ctx, x.t.data(), yt.data(), n);
    CHECK(rounding_differences("avg_pool_forward", yt, yf) == "");
    cpu::avg_pool_backward<g>(ctx, dy.f.data(), dxf.data(), n);
    cpu::avg_pool_backward<g>(ctx, dy.t.data(), dxt.data(), n);
    CHECK(rounding_differences("avg_pool_backward", dxt, dxf) == "");
}

// conv_forward, conv_backward (with and without dx and bias) and conv_backward_relu on window g with
// cout outputs over n samples, T against float.
template <class T, core::Window g>
void check_conv(int cout, std::size_t n, std::mt19937_64& rng)
{
    const Ctx ctx;
    const std::size_t in = n * g.in_size(), out = n * std::size_t(cout) * g.out_pixels();
    const std::size_t weights = std::size_t(cout) * g.col_rows();
    const auto x = rounded<T>(in, rng), w = rounded<T>(weights, rng, -0.5f, 0.5f), dy = rounded<T>(out, rng);
    const std::vector<float> b = random_floats(std::size_t(cout), rng);
    const std::size_t float_scratch = cpu::conv_scratch_size<g>(ctx, cout, n);
    const std::size_t t_scratch = cpu::conv_scratch_size<g, T>(ctx, cout, n);
    CHECK(cpu::conv_scratch_size<g, float>(ctx, cout, n) == float_scratch);
    CHECK(t_scratch > float_scratch);
    Scratch sf(float_scratch), st(t_scratch);

    for (const bool relu : {false, true})
        for (const bool bias : {true, false}) {
            INFO("relu " << relu << ", bias " << bias);
            std::vector<float> yf(out);
            std::vector<T> yt(out);
            cpu::conv_forward<g>(ctx, cout, w.f.data(), bias ? b.data() : nullptr, x.f.data(), yf.data(), n, sf.data(), relu);
            cpu::conv_forward<g>(ctx, cout, w.t.data(), bias ? b.data() : nullptr, x.t.data(), yt.data(), n, st.data(), relu);
            CHECK(rounding_differences("conv_forward", yt, yf) == "");
        }

    for (const bool with_dx : {true, false}) {
        INFO("dx " << with_dx);
        std::vector<float> dxf(in), dwf(weights), dbf(cout), dwt(weights), dbt(cout);
        std::vector<T> dxt(in);
        cpu::conv_backward<g>(ctx, cout, w.f.data(), x.f.data(), dy.f.data(), with_dx ? dxf.data() : nullptr, dwf.data(),
                              dbf.data(), n, sf.data());
        cpu::conv_backward<g>(ctx, cout, w.t.data(), x.t.data(), dy.t.data(), with_dx ? dxt.data() : nullptr, dwt.data(),
                              dbt.data(), n, st.data());
        if (with_dx) CHECK(rounding_differences("conv_backward dx", dxt, dxf) == "");
        CHECK(float_differences("conv_backward dw", dwt, dwf) == "");
        CHECK(float_differences("conv_backward db", dbt, dbf) == "");
    }

    {   // the input gradient added to dx's values (a Residual's in-place sum): summed in float onto
        // them, rounded once
        const auto dx0 = rounded<T>(in, rng);
        std::vector<float> dxf = dx0.f, dwf(weights), dbf(cout), dwt(weights), dbt(cout);
        std::vector<T> dxt = dx0.t;
        cpu::conv_backward<g>(ctx, cout, w.f.data(), x.f.data(), dy.f.data(), dxf.data(), dwf.data(), dbf.data(), n, sf.data(),
                              true);
        cpu::conv_backward<g>(ctx, cout, w.t.data(), x.t.data(), dy.t.data(), dxt.data(), dwt.data(), dbt.data(), n, st.data(),
                              true);
        CHECK(rounding_differences("conv_backward accumulated dx", dxt, dxf) == "");
        std::vector<float> fresh(in);
        cpu::conv_backward<g>(ctx, cout, w.f.data(), x.f.data(), dy.f.data(), fresh.data(), dwf.data(), dbf.data(), n, sf.data());
        double off = 0.0, scale = 0.0;   // dx0 + the gradient, up to float rounding
        for (std::size_t i = 0; i < in; ++i) {
            off = std::max(off, double(std::abs(dxf[i] - (dx0.f[i] + fresh[i]))));
            scale = std::max(scale, double(std::abs(dx0.f[i]) + std::abs(fresh[i])));
        }
        CHECK(off <= 1e-5 * scale);
    }

    const auto relu_y = rounded<T>(out, rng, -1.0f, 1.0f);
    std::vector<float> dzf(out), dxf(in), dwf(weights), dwt(weights);
    std::vector<T> dzt(out), dxt(in);
    cpu::conv_backward_relu<g>(ctx, cout, w.f.data(), x.f.data(), relu_y.f.data(), dy.f.data(), dzf.data(), dxf.data(),
                               dwf.data(), nullptr, n, sf.data());
    cpu::conv_backward_relu<g>(ctx, cout, w.t.data(), x.t.data(), relu_y.t.data(), dy.t.data(), dzt.data(), dxt.data(),
                               dwt.data(), nullptr, n, st.data());
    CHECK(rounding_differences("conv_backward_relu dz", dzt, dzf) == "");
    CHECK(rounding_differences("conv_backward_relu dx", dxt, dxf) == "");
    CHECK(float_differences("conv_backward_relu dw", dwt, dwf) == "");
    CHECK(sf.guard_intact());
    CHECK(st.guard_intact());
}

// conv_transpose_forward and conv_transpose_backward: x (n, c, g.oh, g.ow) -> y (n, g.c, g.h, g.w).
template <class T, core::Window g>
void check_conv_transpose(int c, std::size_t n, std::mt19937_64& rng)
{
    const Ctx ctx;
    const std::size_t in = n * std::size_t(c) * g.out_pixels(), out = n * g.in_size();
    const std::size_t weights = std::size_t(c) * g.col_rows();
    const auto x = rounded<T>(in, rng), w = rounded<T>(weights, rng, -0.5f, 0.5f), dy = rounded<T>(out, rng);
    const std::vector<float> b = random_floats(std::size_t(g.c), rng);
    const std::size_t t_scratch = cpu::conv_transpose_scratch_size<g, T>(ctx, c, n);
    CHECK(t_scratch > cpu::conv_transpose_scratch_size<g>(ctx, c, n));
    Scratch sf(cpu::conv_transpose_scratch_size<g>(ctx, c, n)), st(t_scratch);

    for (const bool bias : {true, false}) {
        INFO("bias " << bias);
        std::vector<float> yf(out);
        std::vector<T> yt(out);
        cpu::conv_transpose_forward<g>(ctx, c, w.f.data(), bias ? b.data() : nullptr, x.f.data(), yf.data(), n, sf.data());
        cpu::conv_transpose_forward<g>(ctx, c, w.t.data(), bias ? b.data() : nullptr, x.t.data(), yt.data(), n, st.data());
        CHECK(rounding_differences("conv_transpose_forward", yt, yf) == "");
    }
    for (const bool with_dx : {true, false}) {
        INFO("dx " << with_dx);
        std::vector<float> dxf(in), dwf(weights), dbf(g.c), dwt(weights), dbt(g.c);
        std::vector<T> dxt(in);
        cpu::conv_transpose_backward<g>(ctx, c, w.f.data(), x.f.data(), dy.f.data(), with_dx ? dxf.data() : nullptr,
                                        dwf.data(), dbf.data(), n, sf.data());
        cpu::conv_transpose_backward<g>(ctx, c, w.t.data(), x.t.data(), dy.t.data(), with_dx ? dxt.data() : nullptr,
                                        dwt.data(), dbt.data(), n, st.data());
        if (with_dx) CHECK(rounding_differences("conv_transpose_backward dx", dxt, dxf) == "");
        CHECK(float_differences("conv_transpose_backward dw", dwt, dwf) == "");
        CHECK(float_differences("conv_transpose_backward db", dbt, dbf) == "");
    }
    CHECK(sf.guard_intact());
    CHECK(st.guard_intact());
}

// linear_forward (with and without ReLU), linear_backward (with and without dx), linear_backward_relu.
template <class T>
void check_linear(const Ctx& ctx, Random& random)
{
    auto& rng = random.rng;
    constexpr int in = 37, out = 11;
    constexpr std::size_t n = 13;
    const auto x = rounded<T>(n * in, rng), w = rounded<T>(std::size_t(out) * in, rng, -0.5f, 0.5f);
    const auto dy = rounded<T>(n * out, rng), relu_y = rounded<T>(n * out, rng, -1.0f, 1.0f);
    const std::vector<float> b = random_floats(out, rng);
    std::vector<float> b_rounded(b.size());   // the bias a T product adds (backend/kernels/linear.hpp)
    std::transform(b.begin(), b.end(), b_rounded.begin(), [](float v) { return core::round_through<T>(v); });

    for (const bool relu : {false, true}) {
        INFO("relu " << relu);
        std::vector<float> yf(n * out);
        std::vector<T> yt(n * out);
        cpu::linear_forward(ctx, in, out, w.f.data(), b_rounded.data(), x.f.data(), yf.data(), n, relu);
        cpu::linear_forward(ctx, in, out, w.t.data(), b.data(), x.t.data(), yt.data(), n, relu);
        CHECK(rounding_differences("linear_forward", yt, yf) == "");
        // With an addend (a Residual's other branch), added before the one rounding.
        const auto addend = rounded<T>(n * out, rng, -1.0f, 1.0f);
        cpu::linear_forward_add(ctx, in, out, w.f.data(), b_rounded.data(), x.f.data(), addend.f.data(), yf.data(), n, relu);
        cpu::linear_forward_add(ctx, in, out, w.t.data(), b.data(), x.t.data(), addend.t.data(), yt.data(), n, relu);
        CHECK(rounding_differences("linear_forward_add", yt, yf) == "");
    }
    for (const bool with_dx : {true, false}) {
        INFO("dx " << with_dx);
        std::vector<float> dxf(n * in), dwf(out * in), dbf(out), dwt(out * in), dbt(out);
        std::vector<T> dxt(n * in);
        cpu::linear_backward(ctx, in, out, w.f.data(), x.f.data(), dy.f.data(), with_dx ? dxf.data() : nullptr, dwf.data(),
                             dbf.data(), n);
        cpu::linear_backward(ctx, in, out, w.t.data(), x.t.data(), dy.t.data(), with_dx ? dxt.data() : nullptr, dwt.data(),
                             dbt.data(), n);
        if (with_dx) CHECK(rounding_differences("linear_backward dx", dxt, dxf) == "");
        CHECK(float_differences("linear_backward dw", dwt, dwf) == "");
        CHECK(float_differences("linear_backward db", dbt, dbf) == "");
    }
    std::vector<float> dzf(n * out), dxf(n * in), dwf(out * in), dbf(out), dwt(out * in), dbt(out);
    std::vector<T> dzt(n * out), dxt(n * in);
    cpu::linear_backward_relu(ctx, in, out, w.f.data(), x.f.data(), relu_y.f.data(), dy.f.data(), dzf.data(), dxf.data(),
                              dwf.data(), dbf.data(), n);
    cpu::linear_backward_relu(ctx, in, out, w.t.data(), x.t.data(), relu_y.t.data(), dy.t.data(), dzt.data(), dxt.data(),
                              dwt.data(), dbt.data(), n);
    CHECK(rounding_differences("linear_backward_relu dz", dzt, dzf) == "");
    CHECK(rounding_differences("linear_backward_relu dx", dxt, dxf) == "");
    CHECK(float_differences("linear_backward_relu dw", dwt, dwf) == "");
    CHECK(float_differences("linear_backward_relu db", dbt, dbf) == "");
}

// The BatchNorm kernels that read activations: sums, apply (with and without ReLU), backward sums and
// input gradient; the statistics between them come from the float sums.
template <class T>
void check_batch_norm(const Ctx& ctx, Random& random)
{
    auto& rng = random.rng;
    constexpr std::size_t n = 4, c = 3, inner = 25, count = n * c * inner;
    const auto x = rounded<T>(count, rng, -3.0f, 5.0f), dy = rounded<T>(count, rng);
    const std::vector<float> shift = random_floats(c, rng), weight = random_floats(c, rng, 0.5f, 1.5f),
                             bias = random_floats(c, rng);
    CHECK(cpu::batch_norm_scratch<T>(ctx, c) == 0);

    std::vector<float> sumsf(2 * c + 1), sumst(2 * c + 1);
    cpu::batch_norm_sums(ctx, x.f.data(), n, c, inner, shift.data(), sumsf.data(), nullptr);
    cpu::batch_norm_sums(ctx, x.t.data(), n, c, inner, shift.data(), sumst.data(), nullptr);
    CHECK(float_differences("batch_norm_sums", sumst, sumsf) == "");

    std::vector<float> running_mean = shift, running_var(c, 1.0f), mean(c), invstd(c);
    cpu::batch_norm_statistics(ctx, sumsf.data(), running_mean.data(), running_var.data(), 0.0f, 1e-5f, mean.data(),
                               invstd.data(), c);
    for (const bool relu : {false, true}) {
        INFO("relu " << relu);
        std::vector<float> yf(count);
        std::vector<T> yt(count);
        cpu::batch_norm_apply(ctx, x.f.data(), yf.data(), n, c, inner, weight.data(), bias.data(), mean.data(), invstd.data(), relu);
        cpu::batch_norm_apply(ctx, x.t.data(), yt.data(), n, c, inner, weight.data(), bias.data(), mean.data(), invstd.data(), relu);
        CHECK(rounding_differences("batch_norm_apply", yt, yf) == "");
    }

    std::vector<float> dparamsf(2 * c), dparamst(2 * c);
    cpu::batch_norm_backward_sums(ctx, x.f.data(), dy.f.data(), n, c, inner, mean.data(), invstd.data(), dparamsf.data(), nullptr);
    cpu::batch_norm_backward_sums(ctx, x.t.data(), dy.t.data(), n, c, inner, mean.data(), invstd.data(), dparamst.data(), nullptr);
    CHECK(float_differences("batch_norm_backward_sums", dparamst, dparamsf) == "");

    const float elements = float(n * inner);
    std::vector<float> dxf(count);
    std::vector<T> dxt(count);
    cpu::batch_norm_backward_input(ctx, x.f.data(), dy.f.data(), dxf.data(), n, c, inner, weight.data(), mean.data(),
                                   invstd.data(), dparamsf.data(), &elements);
    cpu::batch_norm_backward_input(ctx, x.t.data(), dy.t.data(), dxt.data(), n, c, inner, weight.data(), mean.data(),
                                   invstd.data(), dparamsf.data(), &elements);
    CHECK(rounding_differences("batch_norm_backward_input", dxt, dxf) == "");
}

// softmax_cross_entropy (with and without dlogits) and count_correct.
template <class T>
void check_loss(const Ctx& ctx, Random& random)
{
    auto& rng = random.rng;
    constexpr int classes = 7, pixels = 3;
    constexpr std::size_t n = 6, count = n * classes * pixels;
    const auto logits = rounded<T>(count, rng, -6.0f, 6.0f);
    std::vector<std::int32_t> labels(n * pixels);
    std::uniform_int_distribution<int> label(0, classes - 1);
    for (auto& l : labels) l = label(rng);

    core::LossSlot slotf, slott;
    std::vector<float> df(count);
    std::vector<T> dt(count);
    cpu::softmax_cross_entropy(ctx, classes, pixels, logits.f.data(), labels.data(), n, 0.25f, df.data(), &slotf);
    cpu::softmax_cross_entropy(ctx, classes, pixels, logits.t.data(), labels.data(), n, 0.25f, dt.data(), &slott);
    CHECK(std::bit_cast<std::uint64_t>(slott.sum) == std::bit_cast<std::uint64_t>(slotf.sum));
    CHECK(rounding_differences("softmax_cross_entropy dlogits", dt, df) == "");
    cpu::softmax_cross_entropy(ctx, classes, pixels, logits.t.data(), labels.data(), n, 0.25f, nullptr, &slott);
    CHECK(std::bit_cast<std::uint64_t>(slott.sum) == std::bit_cast<std::uint64_t>(slotf.sum));
    CHECK(cpu::count_correct(ctx, classes, pixels, logits.t.data(), labels.data(), n) ==
          cpu::count_correct(ctx, classes, pixels, logits.f.data(), labels.data(), n));
}

} // namespace

TEMPLATE_TEST_CASE("CPU kernels in bf16 and fp16 store round_through<T> of the float kernel's result on the same inputs",
                   "[cpu][precision]", bf16, fp16)
{
    using T = TestType;
    // The float convolutions of the emulation's own code: where oneDNN runs the float ones, they agree
    // with these within float rounding only (tests/test_layers.cpp).
    const testing::ConvPathScope im2col(backend::cpu::ConvPath::blas);
    const Ctx ctx;
    Random random;
    INFO(random.rerun);
    auto& rng = random.rng;
    SECTION("elementwise, dropout, copies, channel slices") { check_elementwise<T>(ctx, random); }
    SECTION("convert") { check_convert<T>(ctx, random); }
    SECTION("max and average pooling") { check_pooling<T>(ctx, random); }
    SECTION("convolution 3x3, stride 1, padding 1") { check_conv<T, core::Window{3, 9, 8, 3, 3, 1, 1, 1, 1, 9, 8}>(5, 3, rng); }
    SECTION("convolution 3x3, stride 2, padding 1 (overlapping patches)") {
        check_conv<T, core::Window{4, 9, 9, 3, 3, 2, 2, 1, 1, 5, 5}>(6, 2, rng);
    }
    SECTION("convolution 1-D, 5 taps") { check_conv<T, core::Window{7, 1, 30, 1, 5, 1, 1, 0, 2, 1, 30}>(3, 2, rng); }
    SECTION("transposed convolution 3x3, stride 2") {
        check_conv_transpose<T, core::Window{3, 9, 9, 3, 3, 2, 2, 1, 1, 5, 5}>(4, 3, rng);
    }
    SECTION("convolutions over a batch in several chunks") {
        constexpr core::Window g{16, 32, 32, 3, 3, 1, 1, 1, 1, 32, 32};
        constexpr std::size_t n = 60;
        REQUIRE(cpu::detail::chunk(n, cpu::detail::conv_per_sample<g>(16)) * 2 < n);   // three chunks, the last one short
        check_conv<T, g>(16, n, rng);
        check_conv_transpose<T, g>(16, n, rng);
    }
    SECTION("fully connected") { check_linear<T>(ctx, random); }
    SECTION("BatchNorm") { check_batch_norm<T>(ctx, random); }
    SECTION("softmax cross-entropy") { check_loss<T>(ctx, random); }
}

// BatchNorm's backward through the mask of the ReLU after it (backend::ReluAfter, recomputed from x)
// reads dy as relu_backward(y, dy) would have written it, y being what batch_norm_apply wrote: the same
// bits as relu_backward, then the unmasked call on its output; after an addend, read from y. x holds NaNs, and a channel (mean 0,
// bias 1e-9) whose zeros normalise to 1e-9: positive in float and bf16, rounded to 0 in fp16, where
// the mask is then off, as y's zero says. A negative weight flips another channel's mask.
TEMPLATE_TEST_CASE("BatchNorm's backward through a ReLU's mask equals relu_backward, then the unmasked backward, bit for bit",
                   "[cpu][precision][batchnorm]", float, bf16, fp16)
{
    using T = TestType;
    const Ctx ctx;
    Random random;
    INFO(random.rerun);
    auto& rng = random.rng;
    constexpr std::size_t n = 3, c = 4, inner = 10, count = n * c * inner;
    auto x = rounded<T>(count, rng, -3.0f, 5.0f);
    const auto dy = rounded<T>(count, rng);
    for (std::size_t i = 0; i < n; ++i)
        for (std::size_t j = 0; j < inner; j += 3) x.t[i * c * inner + j] = core::from_float<T>(0.0f);   // channel 0
    for (std::size_t i = 5; i < count; i += 17) x.t[i] = core::from_float<T>(std::numeric_limits<float>::quiet_NaN());
    std::vector<float> mean = random_floats(c, rng), invstd = random_floats(c, rng, 0.5f, 2.0f),
                       weight = random_floats(c, rng, 0.5f, 1.5f), bias = random_floats(c, rng);
    mean[0] = 0.0f, bias[0] = 1e-9f, weight[2] = -weight[2];
    const auto bits = [](const std::vector<T>& v) {
        std::vector<std::uint32_t> b(v.size());
        for (std::size_t i = 0; i < v.size(); ++i) b[i] = bits_of(v[i]);
        return b;
    };

    std::vector<T> y(count), dz(count);
    cpu::batch_norm_apply(ctx, x.t.data(), y.data(), n, c, inner, weight.data(), bias.data(), mean.data(), invstd.data(), true);
    std::size_t tiny = 0;   // channel 0's zeros: y 1e-9 (float, bf16) or 0 (fp16)
    for (std::size_t i = 0; i < n; ++i) tiny += core::to_float(y[i * c * inner]) > 0.0f;
    CHECK(tiny == (std::is_same_v<T, fp16> ? 0 : n));
    cpu::relu_backward(ctx, y.data(), dy.t.data(), dz.data(), count);
    const backend::ReluAfter<T> relu{.weight = weight.data(), .bias = bias.data()};
    std::vector<float> want(2 * c), got(2 * c);
    cpu::batch_norm_backward_sums(ctx, x.t.data(), dz.data(), n, c, inner, mean.data(), invstd.data(), want.data(), nullptr);
    cpu::batch_norm_backward_sums(ctx, x.t.data(), dy.t.data(), n, c, inner, mean.data(), invstd.data(), got.data(), nullptr,
                                  relu);
    CHECK(float_differences("batch_norm_backward_sums", got, want) == "");

    const float elements = float(n * inner);
    std::vector<T> dx_want(count), dx_got(count);
    cpu::batch_norm_backward_input(ctx, x.t.data(), dz.data(), dx_want.data(), n, c, inner, weight.data(), mean.data(),
                                   invstd.data(), want.data(), &elements);
    cpu::batch_norm_backward_input(ctx, x.t.data(), dy.t.data(), dx_got.data(), n, c, inner, weight.data(), mean.data(),
                                   invstd.data(), want.data(), &elements, relu);
    CHECK(bits(dx_got) == bits(dx_want));

    // After an addend (a Residual's shortcut) the mask is read from the output y: the sums equal
    // relu_backward(y, dy)'s, then the unmasked sums, bit for bit, and write relu_backward's output to
    // dz as they go; the input gradient refuses that form (it reads the written gradient).
    const auto addend = rounded<T>(count, rng);
    std::vector<T> after(count), after_dz(count), written(count, core::from_float<T>(7.0f));
    cpu::batch_norm_apply(ctx, x.t.data(), after.data(), n, c, inner, weight.data(), bias.data(), mean.data(), invstd.data(),
                          true, addend.t.data());
    cpu::relu_backward(ctx, after.data(), dy.t.data(), after_dz.data(), count);
    cpu::batch_norm_backward_sums(ctx, x.t.data(), after_dz.data(), n, c, inner, mean.data(), invstd.data(), want.data(), nullptr);
    const backend::ReluAfter<T> from_y{.y = after.data(), .dz = written.data()};
    cpu::batch_norm_backward_sums(ctx, x.t.data(), dy.t.data(), n, c, inner, mean.data(), invstd.data(), got.data(), nullptr,
                                  from_y);
    CHECK(float_differences("batch_norm_backward_sums after an addend", got, want) == "");
    CHECK(bits(written) == bits(after_dz));
    CHECK_THROWS_WITH(cpu::batch_norm_backward_input(ctx, x.t.data(), dy.t.data(), dx_got.data(), n, c, inner, weight.data(),
                                                     mean.data(), invstd.data(), want.data(), &elements, from_y),
                      Catch::Contains("pass the masked gradient they wrote as dy"));
}


#if defined(REPLICA_ONEDNN)
namespace {
// How many bf16 values of got are not from_float(want[i]); throws nothing, but marks any more than one
// bf16 step apart in `far`.
std::size_t bf16_steps_off(const std::vector<bf16>& got, const std::vector<float>& want, std::size_t& far)
{
    std::size_t off = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        const auto a = std::int32_t(bits_of(got[i])), b = std::int32_t(bits_of(core::from_float<bf16>(want[i])));
        if (a == b) continue;
        ++off;
        if (std::abs(a - b) > 1 || ((a ^ b) & 0x8000) != 0) ++far;   // more than one step, or signs differ
    }
    return off;
}

// oneDNN's bf16 convolution of window g against its float one on the same (bf16-valued) inputs: the
// same float sums in another order, so each output is the float result rounded once, up to one step
// where the float sums straddle a rounding boundary (rarely: 1% of values at most here).
template <core::Window g>
void check_onednn_bf16(int cout, std::size_t n, std::mt19937_64& rng)
{
    const Ctx ctx;
    const std::size_t in = n * g.in_size(), out = n * std::size_t(cout) * g.out_pixels();
    const std::size_t weights = std::size_t(cout) * g.col_rows();
    const auto x = rounded<bf16>(in, rng), w = rounded<bf16>(weights, rng, -0.5f, 0.5f), dy = rounded<bf16>(out, rng);
    const std::vector<float> b = random_floats(std::size_t(cout), rng);
    Scratch sf(cpu::conv_scratch_size<g>(ctx, cout, n)), st(cpu::conv_scratch_size<g, bf16>(ctx, cout, n));
    const std::size_t plans_before = ctx.onednn().plans_made();
    auto close = [&](const char* what, const std::vector<bf16>& got, const std::vector<float>& want) {
        std::size_t far = 0;
        const std::size_t off = bf16_steps_off(got, want, far);
        INFO(what << ": " << off << " of " << got.size() << " a step off, " << far << " further");
        CHECK(far == 0);
        CHECK(off * 100 <= got.size());
    };
    for (const bool relu : {false, true}) {
        INFO("relu " << relu);
        std::vector<float> yf(out);
        std::vector<bf16> yt(out);
        cpu::conv_forward<g>(ctx, cout, w.f.data(), b.data(), x.f.data(), yf.data(), n, sf.data(), relu);
        cpu::conv_forward<g>(ctx, cout, w.t.data(), b.data(), x.t.data(), yt.data(), n, st.data(), relu);
        close("conv_forward", yt, yf);
    }
    std::vector<float> dxf(in), dwf(weights), dbf(cout), dwt(weights), dbt(cout);
    std::vector<bf16> dxt(in);
    cpu::conv_backward<g>(ctx, cout, w.f.data(), x.f.data(), dy.f.data(), dxf.data(), dwf.data(), dbf.data(), n, sf.data());
    cpu::conv_backward<g>(ctx, cout, w.t.data(), x.t.data(), dy.t.data(), dxt.data(), dwt.data(), dbt.data(), n, st.data());
    close("conv_backward dx", dxt, dxf);
    CHECK(testing::norm_relative(dwt, dwf) < 1e-6);   // float sums of the same exact products
    CHECK(testing::norm_relative(dbt, dbf) < 1e-6);
    // Added to dx's values: summed in float, rounded once (not the gradient rounded, then the sum).
    const auto dx0 = rounded<bf16>(in, rng);
    std::vector<bf16> acc = dx0.t;
    cpu::conv_backward<g>(ctx, cout, w.t.data(), x.t.data(), dy.t.data(), acc.data(), dwt.data(), dbt.data(), n, st.data(),
                          true);
    std::vector<float> sum(in);
    for (std::size_t i = 0; i < in; ++i) sum[i] = dx0.f[i] + dxf[i];
    close("conv_backward accumulated dx", acc, sum);
    CHECK(ctx.onednn().plans_made() > plans_before);   // oneDNN ran them (a plan for each pass made)
    CHECK(sf.guard_intact());
    CHECK(st.guard_intact());
}
} // namespace

TEST_CASE("oneDNN's bf16 convolutions, on a CPU with bf16 products: the float sums rounded once", "[cpu][precision]")
{
    if (!cpu::onednn::native_bf16()) {
        WARN("this CPU has no bf16 products (AVX-512 BF16, AMX): bf16 convolutions keep the library's path");
        return;
    }
    const testing::ConvPathScope onednn(backend::cpu::ConvPath::onednn);
    Random random;
    INFO(random.rerun);
    auto& rng = random.rng;
    SECTION("3x3, stride 1, padding 1 (ResNet's)") { check_onednn_bf16<core::Window{16, 8, 8, 3, 3, 1, 1, 1, 1, 8, 8}>(16, 6, rng); }
    SECTION("3x3, stride 2, padding 1") { check_onednn_bf16<core::Window{16, 9, 9, 3, 3, 2, 2, 1, 1, 5, 5}>(32, 4, rng); }
    SECTION("1x1, stride 2 (a projection shortcut)") { check_onednn_bf16<core::Window{16, 8, 8, 1, 1, 2, 2, 0, 0, 4, 4}>(32, 4, rng); }
    SECTION("5x5 over one channel (LeNet's first)") { check_onednn_bf16<core::Window{1, 12, 12, 5, 5, 1, 1, 0, 0, 8, 8}>(6, 5, rng); }
}
#endif

} // namespace test_precision
