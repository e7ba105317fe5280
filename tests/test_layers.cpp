// Layers on the CPU backend: numerical gradient checks, forward values against a float64 reference
// written from each layer's definition, dropout masks, parameter initialisation, and shapes (at
// compile time).
//
// Random tests draw from a fixed seed a test case (tests/seeds.hpp) and print it on failure with the
// command that reruns it; REPLICA_TEST_SEED=<seed> runs them on another, scripts/soak on many.

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <random>
#include <source_location>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "replica/replica.hpp"

#include "catch.hpp"
#include "reference.hpp"
#include "seeds.hpp"
#include "support.hpp"

// The runner compiles the test files in groups (tests/meson.build): this file's names stay in its own
// namespace.
namespace test_layers {

namespace {

using namespace replica;
using Ctx = backend::cpu::Context;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// What an op is built with here: layer id `id` on the one CPU device.
const Device kCpu[] = {Device::cpu()};
model::Build build(std::uint32_t id) { return model::Build{.layer_id = id, .devices = kCpu}; }

// ---------------------------------------------------------------------------------------------
// Compile-time facts: output shapes, parameter counts, concepts.

template <class L, class In>
using op_of = typename L::template op<In>;
template <class L, class In>
using out_of = typename op_of<L, In>::output_shape;

static_assert(model::Layer<ReLU>);
static_assert(!model::Layer<int>);
static_assert(model::Layer<Conv2d<8, 3>> && model::Layer<Linear<10>> && model::Layer<GlobalAvgPool>);
static_assert(model::Layer<Sequential<Conv2d<4, 3>, ReLU>>);
static_assert(model::Layer<Concat<Conv2d<4, 1>, MaxPool2d<3, 1, 1>>>);
static_assert(model::Op<op_of<Conv2d<4, 3>, Shape<2, 7, 7>>>);
static_assert(model::Op<op_of<Concat<Conv2d<4, 1>, ReLU>, Shape<2, 7, 7>>>);

// Convolutions: (h + 2 pad - k) / stride + 1; transposed: (h - 1) stride - 2 pad + k.
static_assert(std::is_same_v<out_of<Conv2d<64, 11, 4, 2>, Shape<3, 224, 224>>, Shape<64, 55, 55>>);
static_assert(op_of<Conv2d<64, 11, 4, 2>, Shape<3, 224, 224>>::param_count == 64 * 3 * 11 * 11 + 64);
static_assert(std::is_same_v<out_of<Conv2d<20, 5>, Shape<1, 28, 28>>, Shape<20, 24, 24>>);
static_assert(std::is_same_v<out_of<Conv2d<4, 3, 2, 1>, Shape<2, 7, 6>>, Shape<4, 4, 3>>);
static_assert(std::is_same_v<out_of<Conv2d<3, 2, 2>, Shape<2, 7, 7>>, Shape<3, 3, 3>>);
static_assert(std::is_same_v<out_of<Conv1d<256, 7>, Shape<69, 1014>>, Shape<256, 1008>>);
static_assert(op_of<Conv1d<256, 7>, Shape<69, 1014>>::param_count == 256 * 69 * 7 + 256);
static_assert(std::is_same_v<out_of<Conv1d<3, 5, 2, 2>, Shape<3, 13>>, Shape<3, 7>>);
static_assert(std::is_same_v<out_of<ConvTranspose2d<21, 4, 2, 1>, Shape<64, 128, 128>>, Shape<21, 256, 256>>);
static_assert(op_of<ConvTranspose2d<21, 4, 2, 1>, Shape<64, 128, 128>>::param_count == 64 * 21 * 4 * 4 + 21);
static_assert(std::is_same_v<out_of<ConvTranspose2d<2, 3>, Shape<3, 5, 4>>, Shape<2, 7, 6>>);
static_assert(std::is_same_v<out_of<Linear<10>, Shape<500>>, Shape<10>>);
static_assert(op_of<Linear<10>, Shape<500>>::param_count == 5010);

// Pooling: floor drops a partial last window; ceil keeps it when it starts inside the (left-padded) input.
static_assert(std::is_same_v<out_of<MaxPool2dCeil<3, 2>, Shape<64, 112, 112>>, Shape<64, 56, 56>>);
static_assert(std::is_same_v<out_of<MaxPool2d<3, 2>, Shape<64, 112, 112>>, Shape<64, 55, 55>>);
static_assert(std::is_same_v<out_of<MaxPool2dCeil<3, 2>, Shape<2, 8, 7>>, Shape<2, 4, 3>>);
static_assert(std::is_same_v<out_of<MaxPool2dCeil<2, 2, 1>, Shape<1, 5, 5>>, Shape<1, 3, 3>>);   // 4th window would start in the padding
static_assert(std::is_same_v<out_of<MaxPool2d<2>, Shape<3, 6, 5>>, Shape<3, 3, 2>>);
static_assert(std::is_same_v<out_of<MaxPool2d<3, 2, 1>, Shape<2, 7, 6>>, Shape<2, 4, 3>>);
static_assert(std::is_same_v<out_of<MaxPool1d<3>, Shape<256, 1008>>, Shape<256, 336>>);
static_assert(std::is_same_v<out_of<MaxPool1d<3, 2>, Shape<3, 11>>, Shape<3, 5>>);
static_assert(std::is_same_v<out_of<AvgPool2d<3, 2, 1>, Shape<2, 7, 6>>, Shape<2, 4, 3>>);
static_assert(std::is_same_v<out_of<GlobalAvgPool, Shape<512, 7, 7>>, Shape<512>>);
static_assert(op_of<MaxPool2d<2>, Shape<3, 6, 5>>::param_count == 0);

// Elementwise and reshaping layers.
static_assert(std::is_same_v<out_of<ReLU, Shape<3, 4, 5>>, Shape<3, 4, 5>>);
static_assert(std::is_same_v<out_of<Dropout<0.5>, Shape<4096>>, Shape<4096>>);
static_assert(std::is_same_v<out_of<Flatten, Shape<50, 4, 4>>, Shape<800>>);

// Composites: channels add up in Concat; a nested Sequential sums parameters and layer ids and keeps
// the inner activations as saved state.
using Inception = Concat<Conv2d<64, 1>, Sequential<MaxPool2d<3, 1, 1>, Conv2d<32, 1>>>;
static_assert(std::is_same_v<out_of<Inception, Shape<192, 28, 28>>, Shape<96, 28, 28>>);
static_assert(op_of<Inception, Shape<192, 28, 28>>::param_count == (64 * 192 + 64) + (32 * 192 + 32));
static_assert(op_of<Inception, Shape<192, 28, 28>>::layer_count == 3);
using LeNetBody = Sequential<Conv2d<20, 5>, MaxPool2d<2>, Conv2d<50, 5>, MaxPool2d<2>, Flatten, Linear<500>, ReLU,
                             Linear<10>>;
static_assert(std::is_same_v<out_of<LeNetBody, Shape<1, 28, 28>>, Shape<10>>);
static_assert(op_of<LeNetBody, Shape<1, 28, 28>>::param_count == 431080);
static_assert(op_of<LeNetBody, Shape<1, 28, 28>>::layer_count == 8);
static_assert(op_of<Sequential<Conv2d<2, 3>, ReLU>, Shape<1, 5, 5>>::kept_size == 2 * 3 * 3);
static_assert(op_of<Sequential<Conv2d<2, 3>, ReLU>, Shape<1, 5, 5>>::saved_size == 0);
// Max pooling's positions of the maxima are saved state, one byte an output for windows of up to 255
// elements, two above, rounded up to whole floats a sample; the outputs a chain keeps are activations.
static_assert(op_of<Sequential<Conv2d<2, 3>, MaxPool2d<3>>, Shape<1, 5, 5>>::saved_size == 1);   // 2 bytes
static_assert(std::is_same_v<core::pool_position_t<core::Window{1, 15, 17, 15, 17, 1, 1, 0, 0, 1, 1}>, std::uint8_t>);
static_assert(std::is_same_v<core::pool_position_t<core::Window{1, 16, 16, 16, 16, 1, 1, 0, 0, 1, 1}>, std::uint16_t>);
// 3x3, stride 2, padding 1: (3, 9, 9) -> (3, 5, 5), 75 bytes in 19 floats.
static_assert(op_of<MaxPool2d<3, 2, 1>, Shape<3, 9, 9>>::saved_size == (3 * 5 * 5 * 1 + 3) / 4);
// 17x17: (3, 17, 34) -> (3, 1, 2), 6 two-byte positions in 3 floats.
static_assert(op_of<MaxPool2d<17>, Shape<3, 17, 34>>::saved_size == (3 * 1 * 2 * 2 + 3) / 4);
static_assert(op_of<AvgPool2d<17>, Shape<3, 17, 34>>::saved_size == 0);
static_assert(op_of<Sequential<Conv2d<2, 3>, MaxPool2d<3>>, Shape<1, 5, 5>>::kept_size == 2 * 3 * 3);

// ---------------------------------------------------------------------------------------------
// Helpers.

// "Conv2d<4, 3, 2, 1>" from the compiler's name of T.
template <class T>
std::string type_name()
{
    const std::string_view f = std::source_location::current().function_name();
    const auto b = f.find("T = ");
    if (b == std::string_view::npos) return std::string(f);
    auto e = f.find(';', b);
    if (e == std::string_view::npos) e = f.rfind(']');
    std::string s(f.substr(b + 4, e - b - 4));
    for (std::string_view prefix : {"host_only::", "with_cuda::", "replica::layers::", "replica::model::", "replica::"})
        for (auto p = s.find(prefix); p != std::string::npos; p = s.find(prefix)) s.erase(p, prefix.size());
    return s;
}

std::vector<float> uniform(std::size_t count, float lo, float hi, std::mt19937_64& rng)
{
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(count);
    for (auto& x : v) x = d(rng);
    return v;
}

// Distinct values 0.005 + 0.01 k, centred on zero and shuffled: no ReLU kink (|x| >= 0.005) and no
// max-pool tie (gaps of 0.01) lies within a finite-difference step of 1e-3.
std::vector<float> grid_input(std::size_t count, std::mt19937_64& rng)
{
    std::vector<float> v(count);
    for (std::size_t k = 0; k < count; ++k) v[k] = float(0.005 + 0.01 * (double(k) - double(count / 2)));
    std::shuffle(v.begin(), v.end(), rng);
    return v;
}

// 0 .. count-1 in random order.
std::vector<std::size_t> shuffled_indices(std::size_t count, std::mt19937_64& rng)
{
    std::vector<std::size_t> idx(count);
    std::iota(idx.begin(), idx.end(), std::size_t{0});
    std::shuffle(idx.begin(), idx.end(), rng);
    return idx;
}

// One op bound to its buffers: parameters, output, saved state, scratch. Output, saved state and
// scratch are poisoned with NaN before each call, so a kernel that leaves part of its output
// unwritten, or reads scratch it did not write, shows up as NaN.
template <class L, class In>
struct Bound {
    using O = op_of<L, In>;
    using Out = typename O::output_shape;
    Ctx ctx{Device::cpu()};
    O op;
    std::size_t n;
    std::vector<float> params, y, saved, kept, scratch, statistics;

    explicit Bound(std::size_t n_, std::uint32_t layer_id = 3)
        : op(build(layer_id)), n(n_), params(O::param_count), y(n_ * Out::size),
          saved(n_ * O::saved_size), kept(n_ * O::kept_size), scratch(op.scratch_size(ctx, n_)),
          statistics(model::statistics_count_of<O>)
    {
        model::init_statistics_of(op, statistics.data());
    }

    void forward(const model::Pass& pass, const float* x)
    {
        std::fill(y.begin(), y.end(), kNaN);
        std::fill(saved.begin(), saved.end(), kNaN);
        std::fill(kept.begin(), kept.end(), kNaN);
        std::fill(scratch.begin(), scratch.end(), kNaN);
        // From the initial statistics each time: a training forward moves BatchNorm's running
        // estimates, which shift its sums (to rounding); the loss is then a function of x and the
        // parameters alone.
        model::init_statistics_of(op, statistics.data());
        op.forward(ctx, pass, model::ForwardArgs<>{.params = params.data(), .weights = params.data(), .x = x, .y = y.data(),
                                                 .n = n, .saved = saved.data(), .kept = kept.data(),
                                                 .scratch = scratch.data(), .statistics = statistics.data()});
    }

    // dx (may be null) and dparams are poisoned first: backward must assign them.
    void backward(const model::Pass& pass, const float* x, const float* dy, float* dx, float* dparams)
    {
        if (dx) std::fill(dx, dx + n * In::size, kNaN);
        std::fill(dparams, dparams + O::param_count, kNaN);
        std::fill(scratch.begin(), scratch.end(), kNaN);
        op.backward(ctx, pass, model::BackwardArgs<>{.params = params.data(), .weights = params.data(), .x = x,
                                                   .y = y.data(), .dy = dy, .dx = dx, .dparams = dparams, .n = n,
                                                   .saved = saved.data(), .kept = kept.data(), .scratch = scratch.data()});
    }
};

// |got - want| <= rel * max(|want|, 1) + allowance[i] (none when empty): relative, with an absolute
// floor of `rel`.
void check_close(const std::vector<float>& got, const std::vector<double>& want, double rel, const char* what,
                 const std::vector<double>& allowance = {})
{
    REQUIRE(got.size() == want.size());
    std::size_t bad = 0, first = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        const double err = std::abs(double(got[i]) - want[i]);
        if (!(err <= rel * std::max(std::abs(want[i]), 1.0) + (allowance.empty() ? 0.0 : allowance[i]))) {
            if (bad++ == 0) first = i;
        }
    }
    INFO(what << ": " << bad << " of " << got.size() << " values off"
              << (bad ? "; first at " + std::to_string(first) + ": got " + std::to_string(got[first]) +
                            ", want " + std::to_string(want[first])
                      : std::string()));
    CHECK(bad == 0);
}

// ---------------------------------------------------------------------------------------------
// Numerical gradient check.
//
// L = sum_i y_i r_i with random r (so dy = r). The analytic gradients are the layer's backward on the
// CPU backend, in float. The numerical ones are central differences of L with step h = 1e-6 on the
// layer's float64 reference (tests/reference.hpp) at the same point, on up to 40 random input elements
// and 40 random parameters (all when fewer). In double, L's rounding moves a difference by about 1e-9
// and the step's truncation (h^2 / 6 times L's third derivative) by less, even for BatchNorm over four
// values: the numerical side is exact to far within the tolerance.
//
// The float side has rounding of its own, which an ill-conditioned point amplifies: BatchNorm over
// values whose variance is far below eps scales its input's rounding by up to 1 / sqrt(eps) ~ 316 (a
// bias before it, whose gradient is 0, then gets one of 1e-3), and a ReLU whose input lies within
// rounding of 0 may take the other branch than the reference. It is measured at each value: the
// largest change of the output and of the gradients over three runs on x and parameters each scaled
// by a random factor within 1 +- 2^-19. A correct result moves about as much as its rounding error
// there, provided each run rounds anew: with its inputs moved by one ulp, a BatchNorm's mean over tens
// of values moves by a fraction of its own ulp and keeps its rounding error; moved by 16 ulps or more,
// it moves by one or more.
//
// Tolerance: |num - ana| <= 1e-3 * max(|num|, |ana|) + 1e-4 + 4 * (ana's measured rounding). First the
// backend's output must be the reference's within 1e-4 * max(|y|, 1) + 4 * (y's measured rounding): a
// reference that computes another function fails there, not in the comparison. (What the check
// catches, and how often it fails on correct gradients: docs/design.md, "Tests: fixed seeds, a soak,
// float64 references".)
//
// `kinks`: set for composites where a ReLU or max pool acts on computed values (which no input grid
// keeps away from a kink). A kink within the step shifts the central difference by up to half its
// change of slope, and the slopes over the four half-steps in [-h, h] then disagree by up to that
// change: an element whose slopes do not all equal the central difference within a tenth of the
// tolerance is skipped and another drawn, up to 120 skipped.

constexpr double kStep = 1e-6;
constexpr int kRoundingRuns = 3;
constexpr double kRoundingFactor = 4.0;
constexpr float kNudge = 0x1p-19f;   // relative: 16 to 32 ulps

// Within the comparison's tolerance (allowing `rounding` more), or `fraction` of it.
bool gradient_close(double num, double ana, double rounding = 0.0, double fraction = 1.0)
{
    return std::abs(num - ana) <= fraction * (1e-3 * std::max(std::abs(num), std::abs(ana)) + 1e-4) + rounding;
}

struct GradOptions {
    bool kinks = false;
};

template <class L, class In>
void check_gradients(std::size_t n, model::Pass pass = {}, GradOptions options = {})
{
    using B = Bound<L, In>;
    using Out = typename B::Out;
    static_assert(testing::HasReference<L, In>,
                  "check_gradients takes its differences on the layer's float64 reference: add a Reference "
                  "specialisation for this layer kind to tests/reference.hpp");
    using Ref = testing::Reference<L, In>;
    constexpr std::size_t P = B::O::param_count;
    constexpr std::uint32_t layer_id = 3;

    const std::uint64_t seed = testing::test_seed();
    INFO(type_name<L>() << " on " << type_name<In>() << ", n = " << n << "; " << testing::rerun(seed));
    std::mt19937_64 rng(seed);

    B b(n, layer_id);
    const std::vector<float> x = grid_input(n * In::size, rng);
    const std::vector<float> r = uniform(n * Out::size, -1.0f, 1.0f, rng);
    b.op.init(b.params.data(), seed);
    for (float& p : b.params) p += std::uniform_real_distribution<float>(-0.05f, 0.05f)(rng);
    const std::vector<float> params = b.params;

    // The backend's output and analytic gradients at (xs, ps).
    struct Run {
        std::vector<float> y, dx, dparams;
    };
    auto run = [&](const std::vector<float>& xs, const std::vector<float>& ps) {
        Run out{{}, std::vector<float>(n * In::size), std::vector<float>(P)};
        b.params = ps;
        b.forward(pass, xs.data());
        out.y = b.y;
        b.backward(pass, xs.data(), r.data(), out.dx.data(), out.dparams.data());
        b.params = params;
        return out;
    };
    const Run analytic = run(x, params);
    REQUIRE(std::all_of(analytic.y.begin(), analytic.y.end(), [](float v) { return std::isfinite(v); }));
    CHECK(std::all_of(analytic.dx.begin(), analytic.dx.end(), [](float v) { return std::isfinite(v); }));
    CHECK(std::all_of(analytic.dparams.begin(), analytic.dparams.end(), [](float v) { return std::isfinite(v); }));

    // Their rounding, measured: kRoundingFactor times the largest change over runs on x and the
    // parameters each scaled by a random factor in [1 - kNudge, 1 + kNudge].
    Run rounding{std::vector<float>(analytic.y.size()), std::vector<float>(n * In::size), std::vector<float>(P)};
    std::mt19937_64 nudges(seed + 1);
    auto nudged = [&](std::vector<float> v) {
        std::uniform_real_distribution<float> factor(1.0f - kNudge, 1.0f + kNudge);
        for (float& e : v) e *= factor(nudges);
        return v;
    };
    auto widen = [](std::vector<float>& allowed, const std::vector<float>& moved, const std::vector<float>& at) {
        for (std::size_t i = 0; i < allowed.size(); ++i)
            allowed[i] = std::max(allowed[i], float(kRoundingFactor) * std::abs(moved[i] - at[i]));
    };
    for (int k = 0; k < kRoundingRuns; ++k) {
        const Run moved = run(nudged(x), nudged(params));
        widen(rounding.y, moved.y, analytic.y);
        widen(rounding.dx, moved.dx, analytic.dx);
        widen(rounding.dparams, moved.dparams, analytic.dparams);
    }

    // The same loss on the float64 reference, at the same point.
    std::vector<double> xd(x.begin(), x.end()), pd(params.begin(), params.end());
    const testing::At at{pass, layer_id};
    check_close(analytic.y, Ref::forward(xd.data(), pd.data(), n, at), 1e-4, "the output against the float64 reference",
                std::vector<double>(rounding.y.begin(), rounding.y.end()));
    auto loss = [&] {
        const std::vector<double> y = Ref::forward(xd.data(), pd.data(), n, at);
        double l = 0.0;
        for (std::size_t i = 0; i < y.size(); ++i) l += y[i] * double(r[i]);
        return l;
    };
    const double l0 = loss();

    // Numerical gradients at v[i] (an element of xd or pd).
    auto compare = [&](std::vector<double>& v, const std::vector<float>& ana, const std::vector<float>& allowed,
                       const char* what) {
        std::size_t checked = 0, skipped = 0, bad = 0;
        std::ostringstream failures;
        for (std::size_t i : shuffled_indices(v.size(), rng)) {
            if (checked == 40 || skipped == 120) break;
            const double v0 = v[i];
            auto loss_at = [&](double step) {
                v[i] = v0 + step;
                const std::pair at_step{v[i], loss()};
                v[i] = v0;
                return at_step;
            };
            const auto [vm, lm] = loss_at(-kStep);
            const auto [vp, lp] = loss_at(kStep);
            const double num = (lp - lm) / (vp - vm);
            if (options.kinks) {
                // The slopes over each half of each side all equal the central difference unless a kink
                // lies within the step.
                const auto [vmh, lmh] = loss_at(-kStep / 2);
                const auto [vph, lph] = loss_at(kStep / 2);
                const double slopes[] = {(lmh - lm) / (vmh - vm), (l0 - lmh) / (v0 - vmh), (lph - l0) / (vph - v0),
                                         (lp - lph) / (vp - vph)};
                if (!std::all_of(std::begin(slopes), std::end(slopes), [&](double s) { return gradient_close(s, num, 0.0, 0.1); })) {
                    ++skipped;
                    continue;
                }
            }
            ++checked;
            if (!gradient_close(num, ana[i], allowed[i]) && bad++ < 8)
                failures << "\n  " << what << "[" << i << "]: numerical " << num << ", analytic " << ana[i]
                         << " (rounding allows " << allowed[i] << ")";
        }
        INFO(what << ": " << bad << " of " << checked << " elements off (" << skipped << " skipped at kinks)"
                  << failures.str());
        CHECK(bad == 0);
        CHECK(skipped < 120);   // else most elements sit at kinks and the check means little
    };
    compare(xd, analytic.dx, rounding.dx, "dx");
    if constexpr (P > 0) compare(pd, analytic.dparams, rounding.dparams, "dparams");

    // dx == nullptr: the same parameter gradients (to float rounding).
    std::vector<float> dparams_alone(P);
    b.forward(pass, x.data());
    b.backward(pass, x.data(), r.data(), nullptr, dparams_alone.data());
    std::size_t differ = 0;
    for (std::size_t i = 0; i < P; ++i)
        if (!(std::abs(dparams_alone[i] - analytic.dparams[i]) <= 1e-6f * std::max(std::abs(analytic.dparams[i]), 1.0f)))
            ++differ;
    INFO("backward without dx: " << differ << " of " << P << " parameter gradients differ");
    CHECK(differ == 0);
}

// ---------------------------------------------------------------------------------------------
// Float64 references, straight from the definitions (tests/reference.hpp).

using testing::ConvGeometry;
using testing::PoolGeometry;
using testing::Pooling;
using testing::ref_conv1d;
using testing::ref_conv2d;
using testing::ref_conv_transpose2d;
using testing::ref_pool;

// Runs one forward of layer L on n random samples with perturbed initial parameters.
template <class L, class In>
struct ForwardCase {
    Bound<L, In> b;
    std::vector<float> x;
    explicit ForwardCase(std::size_t n, std::mt19937_64& rng) : b(n), x(uniform(n * In::size, -1.0f, 1.0f, rng))
    {
        b.op.init(b.params.data(), rng());
        for (float& p : b.params) p += std::uniform_real_distribution<float>(-0.1f, 0.1f)(rng);
        b.forward(model::Pass{}, x.data());
    }
    const float* weights() const { return b.params.data(); }
    const float* biases() const { return b.params.data() + Bound<L, In>::O::weight_count; }
};

constexpr double kForwardTolerance = 1e-5;   // relative, floored at 1e-5 absolute

} // namespace

// =============================================================================================
// 1. Numerical gradient checks.

TEST_CASE("Conv2d gradients match finite differences", "[cpu][layers][gradient]")
{
    for (const auto path : testing::conv_paths()) {   // im2col, and oneDNN where built
        const testing::ConvPathScope scope(path);
        INFO(testing::conv_path_name(path));
        check_gradients<Conv2d<4, 3, 2, 1>, Shape<2, 7, 6>>(3);   // stride 2 + padding, non-square, batch 3
        check_gradients<Conv2d<3, 1>, Shape<4, 5, 5>>(2);
        check_gradients<Conv2d<5, 3>, Shape<3, 6, 8>>(1);
        check_gradients<Conv2d<2, 5, 3, 2>, Shape<2, 9, 7>>(2);
        check_gradients<Conv2d<3, 2, 2>, Shape<2, 7, 7>>(3);      // the last row and column are never read
    }
}

TEST_CASE("Conv1d gradients match finite differences", "[cpu][layers][gradient]")
{
    for (const auto path : testing::conv_paths()) {   // im2col, and oneDNN where built
        const testing::ConvPathScope scope(path);
        INFO(testing::conv_path_name(path));
        check_gradients<Conv1d<4, 3>, Shape<2, 11>>(2);
        check_gradients<Conv1d<3, 5, 2, 2>, Shape<3, 13>>(3);
        check_gradients<Conv1d<2, 4, 3, 1>, Shape<2, 12>>(2);
    }
}

TEST_CASE("ConvTranspose2d gradients match finite differences", "[cpu][layers][gradient]")
{
    for (const auto path : testing::conv_paths()) {   // im2col, and oneDNN's deconvolution where built
        const testing::ConvPathScope scope(path);
        INFO(testing::conv_path_name(path));
        check_gradients<ConvTranspose2d<3, 4, 2, 1>, Shape<2, 4, 5>>(2);
        check_gradients<ConvTranspose2d<2, 3, 1, 0>, Shape<3, 5, 4>>(3);
        check_gradients<ConvTranspose2d<2, 3, 2, 1>, Shape<2, 3, 3>>(2);
    }
}

TEST_CASE("Linear gradients match finite differences", "[cpu][layers][gradient]")
{
    check_gradients<Linear<5>, Shape<12>>(3);
    check_gradients<Linear<1>, Shape<7>>(4);
    check_gradients<Linear<9>, Shape<30>>(1);
}

TEST_CASE("ReLU, Flatten and Dropout gradients match finite differences", "[cpu][layers][gradient]")
{
    check_gradients<ReLU, Shape<3, 4, 5>>(2);
    check_gradients<ReLU, Shape<17>>(3);
    check_gradients<Flatten, Shape<2, 3, 4>>(2);
    // Training mode; the same pass for every evaluation, so the mask is fixed.
    const model::Pass pass{.seed = testing::test_seed(), .first_sample = 11, .training = true};
    check_gradients<Dropout<0.3>, Shape<4, 5, 6>>(3, pass);
}

TEST_CASE("Identity, Sigmoid, Tanh and GELU gradients match finite differences", "[cpu][layers][gradient]")
{
    check_gradients<Identity, Shape<3, 4, 5>>(2);
    check_gradients<Sigmoid, Shape<3, 4, 5>>(2);
    check_gradients<Tanh, Shape<17>>(3);
    check_gradients<GELU, Shape<3, 4, 5>>(2);
    // Inside a model: the activations read what the layer before wrote, and Identity, a view, is
    // skipped between two ops.
    static_assert(model::Chain<Shape<6>, float, Linear<5>, Identity, GELU, Linear<3>>::skipped_view<1>);
    check_gradients<Sequential<Linear<5>, Identity, GELU, Linear<4>, Sigmoid, Linear<3>, Tanh>, Shape<6>>(3);
}

TEST_CASE("LayerNorm, GELU's tanh form, Linear over a sequence and CausalSelfAttention: gradients match finite differences",
          "[cpu][layers][gradient][transformer]")
{
    check_gradients<LayerNorm<>, Shape<5, 8>>(3);
    check_gradients<LayerNorm<>, Shape<12>>(2);
    check_gradients<LayerNorm<LayerNormOptions{.eps = 1e-3f}>, Shape<4, 6>>(2);
    check_gradients<LayerNorm<LayerNormOptions{.affine = false}>, Shape<4, 6>>(3);
    check_gradients<GELUWith<GeluApprox::tanh>, Shape<3, 4, 5>>(2);
    check_gradients<Linear<6>, Shape<5, 8>>(3);
    check_gradients<Linear<1>, Shape<3, 7>>(2);
    check_gradients<CausalSelfAttention<2>, Shape<5, 8>>(2);
    check_gradients<CausalSelfAttention<4>, Shape<6, 8>>(3);
    check_gradients<CausalSelfAttention<1>, Shape<3, 4>>(2);
    // In a model: each op reads what the one before wrote.
    check_gradients<Sequential<Linear<8>, LayerNorm<>, CausalSelfAttention<2>, GELUWith<GeluApprox::tanh>, Linear<4>>,
                    Shape<5, 6>>(2);
}

TEST_CASE("Max pooling: the first maximum in scan order wins, NaN never, a window of NaN and -inf gives -inf",
          "[cpu][layers][pool]")
{
    // 3x3 windows, stride 2, padding 1 over a 4x4 plane: rows and columns [-1, 2) and [1, 4).
    constexpr core::Window g{1, 4, 4, 3, 3, 2, 2, 1, 1, 2, 2};
    constexpr float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    const std::vector<float> plane = {nan,  nan,  2, 2,
                                      nan,  nan,  2, 1,
                                      -inf, -inf, 5, 5,
                                      -inf, -inf, 5, 0};
    std::vector<float> x = plane;
    x.insert(x.end(), plane.begin(), plane.end());   // two samples
    const std::vector<float> dy = {1, 2, 4, 8, 16, 32, 64, 128};
    std::vector<float> y(8), dx(32);
    std::vector<core::pool_position_t<g>> arg(8);
    Ctx ctx{Device::cpu()};
    backend::cpu::max_pool_forward<g>(ctx, x.data(), y.data(), arg.data(), 2);
    CHECK(y == std::vector<float>{-inf, 2, -inf, 5, -inf, 2, -inf, 5});
    backend::cpu::max_pool_backward<g>(ctx, arg.data(), dy.data(), dx.data(), 2);
    // A window without a maximum routes its gradient to its first element inside the plane.
    std::vector<float> want(32, 0.0f);
    for (std::size_t s = 0; s < 2; ++s) {
        want[s * 16 + 0] = dy[s * 4 + 0];    // all NaN
        want[s * 16 + 2] = dy[s * 4 + 1];    // NaN, then ties at 2
        want[s * 16 + 4] = dy[s * 4 + 2];    // NaN and -inf
        want[s * 16 + 10] = dy[s * 4 + 3];   // ties at 5
    }
    CHECK(dx == want);
}

// Max pooling takes the windows wholly inside the input a row at a time, tap by tap: on planes full of
// ties, NaN and -inf, every window's maximum and position equal a plain scan's (windows clipped by
// padding and by the last partial row or column included).
template <core::Window g>
void max_pool_as_scan(std::mt19937_64& rng)
{
    constexpr float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    constexpr std::size_t n = 3;
    std::vector<float> x(n * g.in_size());
    std::uniform_int_distribution<int> pick(0, 9);
    for (auto& v : x) {
        const int k = pick(rng);
        v = k == 0 ? nan : k == 1 ? -inf : float(k % 4);
    }
    std::vector<float> y(n * g.c * g.out_pixels());
    std::vector<core::pool_position_t<g>> arg(y.size());
    Ctx ctx{Device::cpu()};
    backend::cpu::max_pool_forward<g>(ctx, x.data(), y.data(), arg.data(), n);
    std::size_t wrong = 0;
    for (std::size_t plane = 0; plane < n * g.c; ++plane)
        for (int oy = 0; oy < g.oh; ++oy)
            for (int ox = 0; ox < g.ow; ++ox) {
                const int y0 = oy * g.sh - g.ph, x0 = ox * g.sw - g.pw;
                float best = -inf;
                int at = (std::max(y0, 0) - y0) * g.kw + std::max(x0, 0) - x0;
                for (int ky = 0; ky < g.kh; ++ky)
                    for (int kx = 0; kx < g.kw; ++kx) {
                        const int iy = y0 + ky, ix = x0 + kx;
                        if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) continue;
                        const float v = x[plane * g.h * g.w + std::size_t(iy * g.w + ix)];
                        if (v > best) best = v, at = ky * g.kw + kx;
                    }
                const std::size_t o = plane * g.out_pixels() + std::size_t(oy * g.ow + ox);
                wrong += y[o] != best || int(arg[o]) != at;
            }
    CHECK(wrong == 0);
}

TEST_CASE("Max pooling's rows of inner windows equal a plain scan", "[cpu][layers][pool]")
{
    std::mt19937_64 rng(11);
    using core::Window;
    max_pool_as_scan<Window{2, 24, 24, 2, 2, 2, 2, 0, 0, 12, 12}>(rng);   // LeNet's
    max_pool_as_scan<Window{3, 13, 13, 3, 3, 2, 2, 0, 0, 6, 6}>(rng);     // AlexNet's
    max_pool_as_scan<Window{4, 9, 9, 3, 3, 1, 1, 1, 1, 9, 9}>(rng);       // GoogLeNet's, padding 1
    max_pool_as_scan<Window{2, 13, 11, 5, 5, 4, 4, 2, 2, 4, 3}>(rng);     // stride 4, padding 2
    max_pool_as_scan<Window{2, 7, 5, 2, 2, 2, 2, 0, 0, 4, 3}>(rng);       // the last row and column partial
}

// The backend's threads (backend/cpu/threads.hpp) split BatchNorm's sums by channel, its other passes,
// pooling and dropout by rows, im2col, col2im and their layout changes by samples, the elementwise maps
// and the optimizers by blocks of values: each value is computed as on one thread, so 2 and 3 threads
// give one thread's bits. The tensors are large enough that every loop is split three ways
// (backend::cpu::parallel_min_values).
namespace {
class ThreadsScope {
public:
    explicit ThreadsScope(int n) : before_(backend::cpu::blas_threads()) { backend::cpu::set_blas_threads(n); }
    ~ThreadsScope() { backend::cpu::set_blas_threads(before_); }
    ThreadsScope(const ThreadsScope&) = delete;
    ThreadsScope& operator=(const ThreadsScope&) = delete;

private:
    int before_;
};

// Every threaded loop's outputs, one after another, on `threads` threads.
std::vector<float> threaded_loops(int threads, std::uint64_t seed)
{
    const ThreadsScope scope(threads);
    constexpr std::size_t n = 8, c = 16, inner = 28 * 28, count = n * c * inner;
    static_assert(count >= 3 * backend::cpu::parallel_min_values, "every loop split three ways");
    std::mt19937_64 rng(seed);
    const std::vector<float> x = uniform(count, -2.0f, 2.0f, rng), dy = uniform(count, -1.0f, 1.0f, rng),
                             addend = uniform(count, -1.0f, 1.0f, rng), weight = uniform(c, 0.5f, 1.5f, rng),
                             bias = uniform(c, -0.5f, 0.5f, rng), shift = uniform(c, -0.1f, 0.1f, rng);
    const Ctx ctx{Device::cpu()};
    std::vector<float> out;
    const auto keep = [&out](const std::vector<float>& v) { out.insert(out.end(), v.begin(), v.end()); };

    std::vector<float> sums(2 * c + 1), mean(c), invstd(c), y(count), dparams(2 * c), dx(count);
    backend::cpu::batch_norm_sums(ctx, x.data(), n, c, inner, shift.data(), sums.data(), nullptr);
    for (std::size_t ch = 0; ch < c; ++ch) {
        const double m = sums[ch] / double(n * inner);
        mean[ch] = float(shift[ch] + m);
        invstd[ch] = float(1.0 / std::sqrt(std::max(sums[c + ch] / double(n * inner) - m * m, 0.0) + 1e-5));
    }
    backend::cpu::batch_norm_apply(ctx, x.data(), y.data(), n, c, inner, weight.data(), bias.data(), mean.data(),
                                   invstd.data(), true, addend.data());
    const backend::ReluAfter<float> relu{weight.data(), bias.data()};
    backend::cpu::batch_norm_backward_sums(ctx, x.data(), dy.data(), n, c, inner, mean.data(), invstd.data(),
                                           dparams.data(), nullptr, relu);
    const float values = float(n * inner);
    backend::cpu::batch_norm_backward_input(ctx, x.data(), dy.data(), dx.data(), n, c, inner, weight.data(), mean.data(),
                                            invstd.data(), dparams.data(), &values, relu);
    keep(sums), keep(y), keep(dparams), keep(dx);

    constexpr core::Window maxw{c, 28, 28, 3, 3, 2, 2, 1, 1, 14, 14}, avgw{c, 28, 28, 2, 2, 2, 2, 0, 0, 14, 14};
    std::vector<float> pooled(n * maxw.c * std::size_t(maxw.out_pixels()));
    std::vector<core::pool_position_t<maxw>> arg(pooled.size());
    backend::cpu::max_pool_forward<maxw>(ctx, x.data(), pooled.data(), arg.data(), n);
    backend::cpu::max_pool_backward<maxw>(ctx, arg.data(), dy.data(), dx.data(), n);
    keep(pooled), keep(dx);
    out.insert(out.end(), arg.begin(), arg.end());
    backend::cpu::avg_pool_forward<avgw>(ctx, x.data(), pooled.data(), n);
    backend::cpu::avg_pool_backward<avgw>(ctx, dy.data(), dx.data(), n);
    keep(pooled), keep(dx);

    // im2col's layout changes and col2im, split by samples (3x3 windows, stride 2, padding 1).
    std::vector<float> col(std::size_t(maxw.col_rows()) * n * maxw.out_pixels()), back(count, 0.0f),
        major(count), sample_major(count);
    backend::cpu::im2col<maxw>(x.data(), int(n), col.data());
    backend::cpu::col2im<maxw>(col.data(), int(n), back.data());
    backend::cpu::to_channel_major(dy.data(), int(n), int(c), int(inner), major.data());
    backend::cpu::to_sample_major(major.data(), int(n), int(c), int(inner), bias.data(), sample_major.data(), true);
    keep(col), keep(back), keep(major), keep(sample_major);

    backend::cpu::gelu_forward(ctx, x.data(), y.data(), count);
    backend::cpu::gelu_backward(ctx, x.data(), dy.data(), dx.data(), count);
    keep(y), keep(dx);
    backend::cpu::add_into(ctx, x.data(), addend.data(), y.data(), count, true);
    backend::cpu::add(ctx, dy.data(), y.data(), count);
    backend::cpu::dropout_apply(ctx, 0.3f, 5, 2, 40, x.data(), dx.data(), n, c * inner, c);
    keep(y), keep(dx);

    // The optimizers: parameters x then dy, gradients dy then x, two segments (the second undecayed, at
    // half the rate) of `count` each.
    const core::ParamSegment segments[] = {{0, count, 0, 1.0f, 1.0f}, {count, count, count, 0.0f, 0.5f}};
    std::vector<float> w = x, g = dy, velocity(2 * count, 0.0f), state(4 * count, 0.0f), sum(2 * count, 0.0f);
    w.insert(w.end(), dy.begin(), dy.end());
    g.insert(g.end(), x.begin(), x.end());
    for (int step = 0; step < 2; ++step) {
        backend::cpu::sgd_update(ctx, w.data(), g.data(), velocity.data(), segments, core::GradientAt::params, 0.1f, 0.9f,
                                 1e-3f, step == 1);
        backend::cpu::adam_update(ctx, w.data(), g.data(), state.data(), segments, core::GradientAt::params, 1e-2f, 0.9f,
                                  0.999f, 1e-8f, 1e-2f, true, 0.1f, 0.05f);
        backend::cpu::accumulate_gradient(ctx, g.data(), sum.data(), segments, step == 1, 0.5f);
    }
    keep(w), keep(velocity), keep(state), keep(sum);
    return out;
}
} // namespace

TEST_CASE("The CPU's threaded loops give one thread's bits", "[cpu][layers]")
{
    if (!backend::cpu::has_onednn) {
        WARN("a build without oneDNN runs the backend's own loops on one thread: nothing to compare");
        return;
    }
    const std::uint64_t seed = testing::test_seed();
    INFO(testing::rerun(seed));
    const std::vector<float> one = threaded_loops(1, seed);
    for (int threads : {2, 3}) {
        const std::vector<float> many = threaded_loops(threads, seed);
        REQUIRE(many.size() == one.size());
        std::size_t differ = 0;
        for (std::size_t i = 0; i < one.size(); ++i)
            differ += std::bit_cast<std::uint32_t>(one[i]) != std::bit_cast<std::uint32_t>(many[i]);
        CAPTURE(threads, one.size());
        CHECK(differ == 0);
    }
}

TEST_CASE("Pooling gradients match finite differences", "[cpu][layers][gradient]")
{
    check_gradients<MaxPool2d<2>, Shape<3, 6, 5>>(2);                 // floor: last column dropped
    check_gradients<MaxPool2d<3, 2, 1>, Shape<2, 7, 6>>(2);           // padding
    check_gradients<MaxPool2dCeil<3, 2>, Shape<2, 8, 7>>(2);          // partial last window
    check_gradients<MaxPool2dCeil<3, 2, 1>, Shape<2, 6, 7>>(2);       // ceil and padding
    check_gradients<MaxPool2dCeil<2, 2, 1>, Shape<1, 5, 5>>(3);       // a window in the padding is dropped
    check_gradients<MaxPool1d<3>, Shape<2, 10>>(2);
    check_gradients<MaxPool1d<3, 2>, Shape<3, 11>>(2);
    check_gradients<AvgPool2d<2>, Shape<3, 5, 4>>(2);
    check_gradients<AvgPool2d<3, 2, 1>, Shape<2, 7, 6>>(2);
    check_gradients<AvgPool2d<3, 1, 1>, Shape<2, 5, 5>>(2);
    check_gradients<GlobalAvgPool, Shape<3, 5, 4>>(3);
}

TEST_CASE("Concat gradients match finite differences", "[cpu][layers][gradient]")
{
    check_gradients<Concat<Conv2d<3, 1>, Conv2d<2, 3, 1, 1>>, Shape<2, 6, 5>>(2);
    check_gradients<Concat<ReLU, MaxPool2d<3, 1, 1>, Conv2d<2, 3, 1, 1>>, Shape<3, 5, 5>>(2);
    // Inception-like: 1x1; 1x1 then 3x3; 3x3 max pool then 1x1.
    using Block = Concat<Sequential<Conv2d<4, 1>, ReLU>,
                         Sequential<Conv2d<3, 1>, ReLU, Conv2d<4, 3, 1, 1>, ReLU>,
                         Sequential<MaxPool2d<3, 1, 1>, Conv2d<2, 1>, ReLU>>;
    static_assert(std::is_same_v<out_of<Block, Shape<3, 4, 4>>, Shape<10, 4, 4>>);
    check_gradients<Block, Shape<3, 4, 4>>(2, {}, {.kinks = true});
}

TEST_CASE("A nested Sequential's gradients match finite differences", "[cpu][layers][gradient]")
{
    using Net = Sequential<Conv2d<4, 3, 1, 1>, ReLU, MaxPool2d<2>, Flatten, Linear<5>>;
    static_assert(std::is_same_v<out_of<Net, Shape<2, 6, 6>>, Shape<5>>);
    check_gradients<Net, Shape<2, 6, 6>>(2, {}, {.kinks = true});
    // Nested twice, with an Input that matches the shape reaching it.
    check_gradients<Sequential<Input<2, 5, 5>, Sequential<Conv2d<3, 3>, ReLU>, Flatten, Linear<4>>, Shape<2, 5, 5>>(
        3, {}, {.kinks = true});
    // Flatten is a view: skipped between two ops (Net above; twice in a row here), run where it starts
    // a chain (its backward then copies the gradient into dx) or ends one (it writes the caller's y).
    using NetChain = model::Chain<Shape<2, 6, 6>, float, Conv2d<4, 3, 1, 1>, ReLU, MaxPool2d<2>, Flatten, Linear<5>>;
    static_assert(NetChain::skipped_view<3>);
    static_assert(model::Chain<Shape<2, 5, 5>, float, Conv2d<3, 3>, Flatten, Flatten, Linear<4>>::skipped_view<2>);
    check_gradients<Sequential<Conv2d<3, 3>, Flatten, Flatten, Linear<4>>, Shape<2, 5, 5>>(2);
    static_assert(model::Chain<Shape<2, 3, 3>, float, Flatten, Linear<4>>::skipped_view<0>);
    check_gradients<Sequential<Flatten, Linear<4>>, Shape<2, 3, 3>>(3);
    static_assert(!model::Chain<Shape<2, 5, 5>, float, Conv2d<3, 3>, ReLU, Flatten>::skipped_view<2>);
    check_gradients<Sequential<Conv2d<3, 3>, ReLU, Flatten>, Shape<2, 5, 5>>(2, {}, {.kinks = true});
}

TEST_CASE("BatchNorm gradients in training match finite differences", "[cpu][layers][gradient][batchnorm]")
{
    check_gradients<BatchNorm2d, Shape<3, 4, 5>>(3);
    // One value a sample and channel: over 4 samples the variance can be small, and the loss then
    // curves steeply (its float rounding is jagged; the float64 reference is smooth).
    check_gradients<BatchNorm2d, Shape<2, 1, 1>>(4);
    check_gradients<BatchNorm1d, Shape<7>>(5);
    check_gradients<BatchNorm1d, Shape<3, 6>>(2);
    // Fused with the ReLU after it (a Chain applies it in the same pass).
    using Fused = Sequential<BatchNorm2d, ReLU>;
    static_assert(model::Chain<Shape<3, 4, 5>, float, BatchNorm2d, ReLU>::fuses_next_relu<0>);
    check_gradients<Fused, Shape<3, 4, 5>>(3, {}, {.kinks = true});
    check_gradients<Sequential<Conv2d<4, 3, 1, 1>, BatchNorm2d, ReLU, Conv2d<2, 1>>, Shape<2, 5, 5>>(3, {}, {.kinks = true});
}

TEST_CASE("BatchNorm with options: gradients in training match finite differences", "[cpu][layers][gradient][batchnorm]")
{
    // Without affine: no parameters, the input gradient alone; alone, fused with a ReLU, and between
    // convolutions (whose parameter gradients then pass through it).
    using NonAffine = BatchNorm2dWith<BatchNormOptions{.eps = 1e-3f, .momentum = 0.01f, .affine = false}>;
    static_assert(NonAffine::op<Shape<3, 4, 5>>::param_count == 0);
    check_gradients<NonAffine, Shape<3, 4, 5>>(3);
    check_gradients<BatchNorm1dWith<BatchNormOptions{.affine = false}>, Shape<3, 6>>(2);
    check_gradients<Sequential<NonAffine, ReLU>, Shape<3, 4, 5>>(3, {}, {.kinks = true});
    check_gradients<Sequential<Conv2d<4, 3, 1, 1>, NonAffine, ReLU, Conv2d<2, 1>>, Shape<2, 5, 5>>(3, {}, {.kinks = true});
    // Cumulative averaging and no running statistics change what training normalises with in nothing.
    check_gradients<BatchNorm2dWith<BatchNormOptions{.cumulative = true}>, Shape<3, 4, 5>>(3);
    check_gradients<BatchNorm2dWith<BatchNormOptions{.affine = false, .track_running_stats = false}>, Shape<3, 4, 5>>(3);
}

TEST_CASE("Residual gradients match finite differences", "[cpu][layers][gradient][residual]")
{
    // Identity shortcut: x + Body(x).
    using Body = Sequential<Conv2d<3, 3, 1, 1>, BatchNorm2d, ReLU, Conv2d<3, 3, 1, 1>, BatchNorm2d>;
    check_gradients<Residual<Body>, Shape<3, 5, 4>>(2, {}, {.kinks = true});
    check_gradients<Residual<Sequential<Linear<6>, ReLU, Linear<6>>>, Shape<6>>(3, {}, {.kinks = true});
    // Projection shortcut with a stride, and the ReLU after the sum fused into it.
    using Down = Sequential<Conv2d<4, 3, 2, 1>, BatchNorm2d, ReLU, Conv2d<4, 3, 1, 1>, BatchNorm2d>;
    using Projection = Sequential<Conv2d<4, 1, 2, 0>, BatchNorm2d>;
    static_assert(std::is_same_v<out_of<Residual<Down, Projection>, Shape<2, 6, 6>>, Shape<4, 3, 3>>);
    check_gradients<Residual<Down, Projection>, Shape<2, 6, 6>>(2, {}, {.kinks = true});
    static_assert(model::Chain<Shape<2, 6, 6>, float, Residual<Down, Projection>, ReLU>::fuses_next_relu<0>);
    check_gradients<Sequential<Residual<Down, Projection>, ReLU, Residual<Sequential<Conv2d<4, 3, 1, 1>>>, ReLU>,
                    Shape<2, 6, 6>>(2, {}, {.kinks = true});
}

// =============================================================================================
// 2. Forward values against the float64 reference.

TEST_CASE("Conv2d forward matches the definition", "[cpu][layers][forward]")
{
    const std::uint64_t seed = testing::test_seed();
    INFO(testing::rerun(seed));
    std::mt19937_64 rng(seed);
    {
        ForwardCase<Conv2d<5, 3, 2, 1>, Shape<3, 9, 8>> f(2, rng);
        const ConvGeometry g{2, 3, 9, 8, 5, 3, 2, 1, 5, 4};
        static_assert(std::is_same_v<decltype(f.b)::Out, Shape<5, 5, 4>>);
        check_close(f.b.y, ref_conv2d(g, f.x.data(), f.weights(), f.biases()), kForwardTolerance, "Conv2d<5,3,2,1>");
    }
    {
        ForwardCase<Conv2d<4, 4, 3, 2>, Shape<2, 10, 11>> f(3, rng);
        const ConvGeometry g{3, 2, 10, 11, 4, 4, 3, 2, 4, 4};
        static_assert(std::is_same_v<decltype(f.b)::Out, Shape<4, 4, 4>>);
        check_close(f.b.y, ref_conv2d(g, f.x.data(), f.weights(), f.biases()), kForwardTolerance, "Conv2d<4,4,3,2>");
    }
}

TEST_CASE("Conv1d forward matches the definition", "[cpu][layers][forward]")
{
    const std::uint64_t seed = testing::test_seed();
    INFO(testing::rerun(seed));
    std::mt19937_64 rng(seed);
    ForwardCase<Conv1d<4, 5, 2, 2>, Shape<3, 17>> f(2, rng);
    const ConvGeometry g{2, 3, 1, 17, 4, 5, 2, 2, 1, 9};
    static_assert(std::is_same_v<decltype(f.b)::Out, Shape<4, 9>>);
    check_close(f.b.y, ref_conv1d(g, f.x.data(), f.weights(), f.biases()), kForwardTolerance, "Conv1d<4,5,2,2>");
}

TEST_CASE("ConvTranspose2d forward matches the scatter definition", "[cpu][layers][forward]")
{
    const std::uint64_t seed = testing::test_seed();
    INFO(testing::rerun(seed));
    std::mt19937_64 rng(seed);
    {
        ForwardCase<ConvTranspose2d<3, 4, 2, 1>, Shape<2, 5, 4>> f(2, rng);
        const ConvGeometry g{2, 2, 5, 4, 3, 4, 2, 1, 10, 8};
        static_assert(std::is_same_v<decltype(f.b)::Out, Shape<3, 10, 8>>);
        check_close(f.b.y, ref_conv_transpose2d(g, f.x.data(), f.weights(), f.biases()), kForwardTolerance,
                    "ConvTranspose2d<3,4,2,1>");
    }
    {
        ForwardCase<ConvTranspose2d<3, 3, 1, 0>, Shape<4, 5, 6>> f(3, rng);
        const ConvGeometry g{3, 4, 5, 6, 3, 3, 1, 0, 7, 8};
        static_assert(std::is_same_v<decltype(f.b)::Out, Shape<3, 7, 8>>);
        check_close(f.b.y, ref_conv_transpose2d(g, f.x.data(), f.weights(), f.biases()), kForwardTolerance,
                    "ConvTranspose2d<3,3,1,0>");
    }
}

TEST_CASE("Linear forward matches the definition", "[cpu][layers][forward]")
{
    const std::uint64_t seed = testing::test_seed();
    INFO(testing::rerun(seed));
    std::mt19937_64 rng(seed);
    constexpr std::size_t n = 3, in = 13, out = 6;
    ForwardCase<Linear<out>, Shape<in>> f(n, rng);
    std::vector<double> want(n * out);
    for (std::size_t s = 0; s < n; ++s)
        for (std::size_t o = 0; o < out; ++o) {
            double acc = f.biases()[o];
            for (std::size_t i = 0; i < in; ++i) acc += double(f.weights()[o * in + i]) * double(f.x[s * in + i]);
            want[s * out + o] = acc;
        }
    check_close(f.b.y, want, kForwardTolerance, "Linear<6>");
}

TEST_CASE("Pooling forward matches the definition", "[cpu][layers][forward]")
{
    const std::uint64_t seed = testing::test_seed();
    INFO(testing::rerun(seed));
    std::mt19937_64 rng(seed);
    {
        ForwardCase<MaxPool2dCeil<3, 2>, Shape<2, 8, 7>> f(2, rng);   // last window of each row/column partial
        static_assert(std::is_same_v<decltype(f.b)::Out, Shape<2, 4, 3>>);
        check_close(f.b.y, ref_pool(Pooling::max, {2, 2, 8, 7, 3, 3, 2, 2, 0, 0, 4, 3}, f.x.data()),
                    kForwardTolerance, "MaxPool2dCeil<3,2>");
    }
    {
        ForwardCase<MaxPool2dCeil<3, 2, 1>, Shape<2, 6, 7>> f(2, rng);
        static_assert(std::is_same_v<decltype(f.b)::Out, Shape<2, 4, 4>>);
        check_close(f.b.y, ref_pool(Pooling::max, {2, 2, 6, 7, 3, 3, 2, 2, 1, 1, 4, 4}, f.x.data()),
                    kForwardTolerance, "MaxPool2dCeil<3,2,1>");
    }
    {
        ForwardCase<MaxPool1d<3, 2>, Shape<3, 11>> f(2, rng);
        static_assert(std::is_same_v<decltype(f.b)::Out, Shape<3, 5>>);
        check_close(f.b.y, ref_pool(Pooling::max, {2, 3, 1, 11, 1, 3, 1, 2, 0, 0, 1, 5}, f.x.data()),
                    kForwardTolerance, "MaxPool1d<3,2>");
    }
    {
        ForwardCase<AvgPool2d<3, 2, 1>, Shape<2, 7, 6>> f(2, rng);   // padding counted in the divisor 9
        static_assert(std::is_same_v<decltype(f.b)::Out, Shape<2, 4, 3>>);
        check_close(f.b.y, ref_pool(Pooling::mean, {2, 2, 7, 6, 3, 3, 2, 2, 1, 1, 4, 3}, f.x.data()),
                    kForwardTolerance, "AvgPool2d<3,2,1>");
    }
    {
        ForwardCase<GlobalAvgPool, Shape<3, 5, 4>> f(3, rng);
        check_close(f.b.y, ref_pool(Pooling::mean, {3, 3, 5, 4, 5, 4, 1, 1, 0, 0, 1, 1}, f.x.data()),
                    kForwardTolerance, "GlobalAvgPool");
    }
}

TEST_CASE("Small layers computed by hand", "[cpu][layers][forward]")
{
    const model::Pass pass{};
    SECTION("2x2 convolution of a 1x3x3 input")
    {
        Bound<Conv2d<1, 2>, Shape<1, 3, 3>> b(1);
        b.params = {1, 2, 3, 4, 0.5f};   // w (1, 1, 2, 2), then b
        const std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8, 9};
        b.forward(pass, x.data());
        CHECK(b.y == std::vector<float>{37.5f, 47.5f, 67.5f, 77.5f});
        // dy picks the top-left output: dx is the kernel in the top-left corner, dw the top-left patch.
        const std::vector<float> dy = {1, 0, 0, 0};
        std::vector<float> dx(9), dparams(5);
        b.backward(pass, x.data(), dy.data(), dx.data(), dparams.data());
        CHECK(dx == std::vector<float>{1, 2, 0, 3, 4, 0, 0, 0, 0});
        CHECK(dparams == std::vector<float>{1, 2, 4, 5, 1});
    }
    SECTION("2x2 max pool of a 4x4 input")
    {
        Bound<MaxPool2d<2>, Shape<1, 4, 4>> b(1);
        const std::vector<float> x = {1, 5, 2, 0,     //
                                      3, 4, 8, 7,     //
                                      9, -1, 6, 6.5f, //
                                      2, 2, 3, 1};
        b.forward(pass, x.data());
        CHECK(b.y == std::vector<float>{5, 8, 9, 6.5f});
        const std::vector<float> dy = {1, 2, 3, 4};
        std::vector<float> dx(16);
        b.backward(pass, x.data(), dy.data(), dx.data(), nullptr);
        CHECK(dx == std::vector<float>{0, 1, 0, 0, 0, 0, 2, 0, 3, 0, 0, 4, 0, 0, 0, 0});
    }
    SECTION("2x2 stride-2 transposed convolution of a 1x2x2 input")
    {
        Bound<ConvTranspose2d<1, 2, 2>, Shape<1, 2, 2>> b(1);
        b.params = {1, 2, 3, 4, 1};   // w (1, 1, 2, 2), then b
        const std::vector<float> x = {1, 2, 3, 4};
        b.forward(pass, x.data());
        // Each input pixel stamps x * w into its own 2x2 block, plus the bias.
        CHECK(b.y == std::vector<float>{2, 3, 3, 5, 4, 5, 7, 9, 4, 7, 5, 9, 10, 13, 13, 17});
    }
    SECTION("2x2 average pool with padding 1 counts the padding")
    {
        Bound<AvgPool2d<2, 2, 1>, Shape<1, 2, 2>> b(1);
        const std::vector<float> x = {1, 2, 3, 4};
        b.forward(pass, x.data());
        CHECK(b.y == std::vector<float>{0.25f, 0.5f, 0.75f, 1.0f});   // each window holds one pixel of four taps
    }
    SECTION("Linear")
    {
        Bound<Linear<3>, Shape<2>> b(1);
        b.params = {1, 2, 3, 4, 5, 6, 0.5f, 0.25f, -0.5f};   // W (3, 2), then b
        const std::vector<float> x = {1, -1};
        b.forward(pass, x.data());
        CHECK(b.y == std::vector<float>{-0.5f, -0.75f, -1.5f});
    }
}

// =============================================================================================
// 3. Dropout.

TEST_CASE("Dropout zeroes about P of the elements and scales the survivors", "[cpu][layers][dropout]")
{
    const std::uint64_t seed = testing::test_seed();
    INFO(testing::rerun(seed));
    std::mt19937_64 rng(seed);
    constexpr std::size_t n = 8, size = 5000;
    constexpr float p = 0.3f, scale = 1.0f / (1.0f - p);
    Bound<Dropout<0.3>, Shape<size>> b(n);
    const std::vector<float> x = uniform(n * size, 0.5f, 1.5f, rng);   // never zero
    const model::Pass pass{.seed = seed, .first_sample = 0, .training = true};
    b.forward(pass, x.data());

    std::size_t zeros = 0, misscaled = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
        if (b.y[i] == 0.0f) ++zeros;
        else if (!(std::abs(b.y[i] - x[i] * scale) <= 1e-6f * x[i] * scale)) ++misscaled;
    }
    const double dropped = double(zeros) / double(x.size());
    CAPTURE(dropped);
    CHECK(std::abs(dropped - 0.3) <= 0.02);
    CHECK(misscaled == 0);

    // Backward applies the same mask and scale to dy.
    const std::vector<float> dy = uniform(n * size, -1.0f, 1.0f, rng);
    std::vector<float> dx(n * size);
    b.backward(pass, x.data(), dy.data(), dx.data(), nullptr);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
        const float want = b.y[i] == 0.0f ? 0.0f : dy[i] * scale;
        if (!(std::abs(dx[i] - want) <= 1e-6f * std::abs(want))) ++wrong;
    }
    CHECK(wrong == 0);
}

TEST_CASE("Dropout is the identity in evaluation", "[cpu][layers][dropout]")
{
    const std::uint64_t seed = testing::test_seed();
    INFO(testing::rerun(seed));
    std::mt19937_64 rng(seed);
    constexpr std::size_t n = 4;
    Bound<Dropout<0.3>, Shape<3, 50>> b(n);
    const std::vector<float> x = uniform(n * 150, -1.0f, 1.0f, rng);
    const model::Pass eval{.seed = 7, .first_sample = 0, .training = false};
    b.forward(eval, x.data());
    CHECK(b.y == x);
    const std::vector<float> dy = uniform(n * 150, -1.0f, 1.0f, rng);
    std::vector<float> dx(n * 150);
    b.backward(eval, x.data(), dy.data(), dx.data(), nullptr);
    CHECK(dx == dy);
}

TEST_CASE("Dropout's mask depends on (seed, layer id, global sample) only", "[cpu][layers][dropout]")
{
    const std::uint64_t seed = testing::test_seed();
    INFO(testing::rerun(seed));
    std::mt19937_64 rng(seed);
    using D = Dropout<0.3>;
    using In = Shape<4, 16>;
    const std::vector<float> x = uniform(8 * In::size, 0.5f, 1.5f, rng);
    auto run = [&](std::size_t n, std::uint32_t layer_id, model::Pass pass, const float* xs) {
        Bound<D, In> b(n, layer_id);
        b.forward(pass, xs);
        return b.y;
    };
    const model::Pass pass{.seed = seed, .first_sample = 0, .training = true};
    const auto whole = run(8, 3, pass, x.data());

    // Samples [0, 3) and [3, 8) in two calls, as two replicas would run them.
    auto split = run(3, 3, pass, x.data());
    const auto rest = run(5, 3, model::Pass{.seed = seed, .first_sample = 3, .training = true}, x.data() + 3 * In::size);
    split.insert(split.end(), rest.begin(), rest.end());
    CHECK(split == whole);

    auto mask_differs = [&](const std::vector<float>& a) {
        std::size_t d = 0;
        for (std::size_t i = 0; i < a.size(); ++i) d += (a[i] == 0.0f) != (whole[i] == 0.0f);
        return d;
    };
    CHECK(mask_differs(run(8, 3, model::Pass{.seed = seed + 1, .first_sample = 0, .training = true}, x.data())) > 0);
    CHECK(mask_differs(run(8, 4, pass, x.data())) > 0);
    CHECK(mask_differs(run(8, 3, model::Pass{.seed = seed, .first_sample = 8, .training = true}, x.data())) > 0);
}

// =============================================================================================
// 4. Parameter initialisation.

namespace {
// Deterministic in (seed, layer id), different when either changes, inside +-1/sqrt(fan_in) and
// spread over that range.
template <class L, class In>
void check_init(std::size_t fan_in)
{
    using O = op_of<L, In>;
    static constexpr std::size_t P = O::param_count;   // static: a lambda below binds it to a reference uncaptured
    const std::uint64_t seed = testing::test_seed();
    INFO(type_name<L>() << " on " << type_name<In>() << "; " << testing::rerun(seed));
    auto init = [](std::uint32_t layer_id, std::uint64_t s) {
        std::vector<float> p(P, kNaN);
        O{build(layer_id)}.init(p.data(), s);
        return p;
    };
    auto differing = [](const std::vector<float>& a, const std::vector<float>& b) {
        std::size_t d = 0;
        for (std::size_t i = 0; i < a.size(); ++i) d += a[i] != b[i];
        return d;
    };
    const auto a = init(5, seed);
    CHECK(a == init(5, seed));
    CHECK(differing(a, init(6, seed)) >= P * 99 / 100);
    CHECK(differing(a, init(5, seed + 1)) >= P * 99 / 100);

    const float bound = 1.0f / std::sqrt(float(fan_in));
    float largest = 0.0f;
    bool inside = true;
    for (float v : a) {
        inside = inside && std::abs(v) <= bound;   // false for NaN: every parameter written
        largest = std::max(largest, std::abs(v));
    }
    CAPTURE(bound, largest);
    CHECK(inside);
    CHECK(largest >= 0.8f * bound);
}
} // namespace

TEST_CASE("Parameter init is deterministic and bounded by 1/sqrt(fan_in)", "[cpu][layers][init]")
{
    check_init<Conv2d<8, 3>, Shape<4, 9, 9>>(4 * 3 * 3);
    check_init<Conv2d<16, 5, 2, 2>, Shape<3, 12, 12>>(3 * 5 * 5);
    check_init<Conv1d<6, 5>, Shape<3, 20>>(3 * 5);
    check_init<ConvTranspose2d<5, 4, 2, 1>, Shape<3, 4, 4>>(5 * 4 * 4);   // PyTorch: weight.size(1) * k * k
    check_init<Linear<7>, Shape<50>>(50);
}

TEST_CASE("A nested Sequential initialises each layer under its own id", "[cpu][layers][init]")
{
    using Net = Sequential<Conv2d<3, 3>, ReLU, Flatten, Linear<4>>;
    using In = Shape<2, 5, 5>;
    using NetOp = op_of<Net, In>;
    using ConvOp = op_of<Conv2d<3, 3>, In>;
    using LinearOp = op_of<Linear<4>, Shape<27>>;
    static_assert(NetOp::param_count == ConvOp::param_count + LinearOp::param_count);
    static_assert(NetOp::layer_count == 4);

    const std::uint64_t seed = testing::test_seed();
    INFO(testing::rerun(seed));
    std::vector<float> net(NetOp::param_count), conv(ConvOp::param_count), linear(LinearOp::param_count);
    NetOp{build(3)}.init(net.data(), seed);
    ConvOp{build(3)}.init(conv.data(), seed);
    LinearOp{build(6)}.init(linear.data(), seed);
    CHECK(std::equal(conv.begin(), conv.end(), net.begin()));
    CHECK(std::equal(linear.begin(), linear.end(), net.begin() + ConvOp::param_count));
}

// =============================================================================================
// 5. Convolutions without bias (Bias::none; issue 22).

namespace {
// The weights alone: torchvision's ResNet stem, Conv2d(3, 64, 7, 2, 3, bias=False), has 9408.
static_assert(op_of<Conv2d<64, 7, 2, 3, Bias::none>, Shape<3, 224, 224>>::param_count == 64 * 3 * 7 * 7);
static_assert(op_of<Conv2d<64, 7, 2, 3, Bias::none>, Shape<3, 224, 224>>::param_count == 9408);
static_assert(std::is_same_v<out_of<Conv2d<64, 7, 2, 3, Bias::none>, Shape<3, 224, 224>>, Shape<64, 112, 112>>);
static_assert(op_of<Conv1d<8, 5, 1, 2, Bias::none>, Shape<3, 20>>::param_count == 8 * 3 * 5);
static_assert(op_of<ConvTranspose2d<4, 2, 2, 0, Bias::none>, Shape<3, 5, 5>>::param_count == 3 * 4 * 2 * 2);
static_assert(op_of<Sequential<Conv2d<4, 3, 1, 1, Bias::none>, ReLU>, Shape<2, 6, 6>>::param_count == 4 * 2 * 3 * 3);
// The default is unchanged: a bias per output channel.
static_assert(std::is_same_v<Conv2d<4, 3>, Conv2d<4, 3, 1, 0, Bias::yes>>);
// A ReLU after a convolution without bias is still fused into it.
static_assert(model::Chain<Shape<2, 6, 6>, float, Conv2d<4, 3, 1, 1, Bias::none>, ReLU>::fuses_next_relu<0>);

// Layer Without (a convolution without bias, alone or followed by a ReLU) against With (the same
// with a bias), both from the same initialisation (same seed and layer id) and the same perturbed
// weights, With's biases zero: the same initial weights, the same output and the same gradients, bit
// for bit (the CPU backend runs one code path with and without a bias). Without's parameters are
// followed by NaN and its parameter gradient by a sentinel: it reads and writes its weights only.
template <class With, class Without, class In>
void same_as_zero_bias(std::size_t n)
{
    using A = Bound<With, In>;
    using B = Bound<Without, In>;
    constexpr std::size_t P = B::O::param_count, extra = A::O::param_count - P;
    static_assert(extra > 0 && std::is_same_v<typename A::Out, typename B::Out>);
    const std::uint64_t seed = testing::test_seed();
    INFO(type_name<Without>() << " on " << type_name<In>() << ", n = " << n << "; " << testing::rerun(seed));
    std::mt19937_64 rng(seed);

    A a(n);
    B b(n);
    a.op.init(a.params.data(), seed);
    b.op.init(b.params.data(), seed);
    CHECK(std::equal(b.params.begin(), b.params.end(), a.params.begin()));   // PyTorch's bound, the weights alone
    for (std::size_t i = 0; i < P; ++i) a.params[i] += std::uniform_real_distribution<float>(-0.1f, 0.1f)(rng);
    std::fill(a.params.begin() + P, a.params.end(), 0.0f);
    b.params.assign(a.params.begin(), a.params.begin() + P);
    b.params.resize(P + extra, kNaN);

    const std::vector<float> x = uniform(n * In::size, -1.0f, 1.0f, rng);
    const std::vector<float> dy = uniform(a.y.size(), -1.0f, 1.0f, rng);
    const model::Pass pass{};
    a.forward(pass, x.data());
    b.forward(pass, x.data());
    REQUIRE(std::all_of(a.y.begin(), a.y.end(), [](float v) { return std::isfinite(v); }));
    CHECK(b.y == a.y);

    constexpr float sentinel = 1234.5f;
    std::vector<float> dx_a(n * In::size), dx_b(n * In::size), dp_a(P + extra), dp_b(P + extra, sentinel);
    a.backward(pass, x.data(), dy.data(), dx_a.data(), dp_a.data());
    b.backward(pass, x.data(), dy.data(), dx_b.data(), dp_b.data());
    CHECK(dx_b == dx_a);
    CHECK(std::equal(dp_b.begin(), dp_b.begin() + P, dp_a.begin()));
    CHECK(std::all_of(dp_b.begin() + P, dp_b.end(), [&](float v) { return v == sentinel; }));
}
} // namespace

TEST_CASE("Convolutions without bias: gradients match finite differences, alone and with a fused ReLU",
          "[cpu][layers][gradient][bias]")
{
    for (const auto path : testing::conv_paths()) {   // im2col, and oneDNN where built
        const testing::ConvPathScope scope(path);
        INFO(testing::conv_path_name(path));
        check_gradients<Conv2d<4, 3, 2, 1, Bias::none>, Shape<2, 7, 6>>(3);   // stride 2 + padding, non-square
        check_gradients<Conv2d<3, 1, 1, 0, Bias::none>, Shape<4, 5, 5>>(2);
        check_gradients<Conv1d<3, 5, 2, 2, Bias::none>, Shape<3, 13>>(3);
        check_gradients<Conv1d<4, 3, 1, 0, Bias::none>, Shape<2, 11>>(2);
        check_gradients<ConvTranspose2d<3, 4, 2, 1, Bias::none>, Shape<2, 4, 5>>(2);
        // The ReLU after them is fused (forward_relu, backward_relu): its rule still runs.
        check_gradients<Sequential<Conv2d<4, 3, 2, 1, Bias::none>, ReLU>, Shape<2, 7, 6>>(3, {}, {.kinks = true});
        check_gradients<Sequential<Conv1d<3, 5, 2, 2, Bias::none>, ReLU>, Shape<3, 13>>(3, {}, {.kinks = true});
    }
}

TEST_CASE("A convolution without bias equals one with a zero bias and touches its weights only",
          "[cpu][layers][forward][bias]")
{
    same_as_zero_bias<Conv2d<4, 3, 2, 1>, Conv2d<4, 3, 2, 1, Bias::none>, Shape<2, 7, 6>>(3);
    same_as_zero_bias<Conv2d<5, 1>, Conv2d<5, 1, 1, 0, Bias::none>, Shape<3, 4, 4>>(2);
    same_as_zero_bias<Conv1d<3, 5, 2, 2>, Conv1d<3, 5, 2, 2, Bias::none>, Shape<3, 13>>(3);
    same_as_zero_bias<ConvTranspose2d<3, 4, 2, 1>, ConvTranspose2d<3, 4, 2, 1, Bias::none>, Shape<2, 4, 5>>(2);
    same_as_zero_bias<Sequential<Conv2d<4, 3, 1, 1>, ReLU>, Sequential<Conv2d<4, 3, 1, 1, Bias::none>, ReLU>,
                      Shape<2, 6, 5>>(3);
    same_as_zero_bias<Sequential<Conv1d<3, 3, 1, 1>, ReLU>, Sequential<Conv1d<3, 3, 1, 1, Bias::none>, ReLU>,
                      Shape<2, 9>>(2);
}

TEST_CASE("A convolution without bias initialises its weights within 1/sqrt(fan_in)", "[cpu][layers][init][bias]")
{
    check_init<Conv2d<8, 3, 1, 0, Bias::none>, Shape<4, 9, 9>>(4 * 3 * 3);
    check_init<Conv1d<6, 5, 1, 0, Bias::none>, Shape<3, 20>>(3 * 5);
    check_init<ConvTranspose2d<5, 4, 2, 1, Bias::none>, Shape<3, 4, 4>>(5 * 4 * 4);
}

// =============================================================================================
// oneDNN's convolutions against im2col's (builds with oneDNN): the same float passes both ways.

#if defined(REPLICA_ONEDNN)
namespace {
// Float rounding in another order: a within 1e-5 of e, relative to e's largest value (at least 1).
bool within_rounding(const std::vector<float>& a, const std::vector<float>& e)
{
    double largest = 0, error = 0;
    for (std::size_t i = 0; i < e.size(); ++i) {
        largest = std::max(largest, double(std::abs(e[i])));
        error = std::max(error, std::isfinite(a[i]) ? double(std::abs(a[i] - e[i])) : INFINITY);
    }
    return error <= 1e-5 * std::max(largest, 1.0);
}

// The passes of one window and filter count, both ways, in every variant (ReLU, bias, accumulating
// dx). Each must make oneDNN plans: a shape oneDNN refused would run im2col under ConvPath::onednn
// too, and compare im2col with itself.
template <core::Window g>
void onednn_matches_im2col(int cout, std::size_t n, std::mt19937_64& rng)
{
    using backend::cpu::ConvPath;
    Ctx ctx;
    const std::size_t xs = n * g.in_size(), ys = n * std::size_t(cout) * g.out_pixels(),
                      ws = std::size_t(cout) * g.col_rows();
    const auto x = uniform(xs, -1.0f, 1.0f, rng), w = uniform(ws, -0.5f, 0.5f, rng), b = uniform(cout, -0.5f, 0.5f, rng),
               dy = uniform(ys, -1.0f, 1.0f, rng), dx0 = uniform(xs, -1.0f, 1.0f, rng);
    std::vector<float> scratch(backend::cpu::conv_scratch_size<g, float>(ctx, cout, n));
    struct Out {
        std::vector<float> y, dx, dw, db;
    };
    // relu: the fused ReLU; bias: with a bias (and its gradient); accumulate: dx starts at dx0 and is added to.
    auto run = [&](ConvPath path, bool relu, bool bias, bool accumulate) {
        const testing::ConvPathScope scope(path);
        Out o{std::vector<float>(ys, NAN), accumulate ? dx0 : std::vector<float>(xs, NAN), std::vector<float>(ws, NAN),
              std::vector<float>(cout, NAN)};
        backend::cpu::conv_forward<g>(ctx, cout, w.data(), bias ? b.data() : nullptr, x.data(), o.y.data(), n,
                                      scratch.data(), relu);
        backend::cpu::conv_backward<g>(ctx, cout, w.data(), x.data(), dy.data(), o.dx.data(), o.dw.data(),
                                       bias ? o.db.data() : nullptr, n, scratch.data(), accumulate);
        return o;
    };
    for (const bool relu : {false, true})
        for (const bool bias : {false, true})
            for (const bool accumulate : {false, true}) {
                CAPTURE(relu, bias, accumulate);
                const std::size_t made = ctx.onednn().plans_made();
                const Out e = run(ConvPath::blas, relu, bias, accumulate), a = run(ConvPath::onednn, relu, bias, accumulate);
                // oneDNN ran: new plans for both passes (the backward one's key has no ReLU: made with relu false)
                if (!accumulate) CHECK(ctx.onednn().plans_made() == made + (relu ? 1 : 2));
                CHECK(within_rounding(a.y, e.y));
                CHECK(within_rounding(a.dx, e.dx));
                CHECK(within_rounding(a.dw, e.dw));
                if (bias) CHECK(within_rounding(a.db, e.db));
                if (relu) CHECK(std::none_of(a.y.begin(), a.y.end(), [](float v) { return v < 0.0f; }));
            }
    // Timed (ConvPath::timed): each candidate runs several times on the first call of a shape; what a
    // run changed that the pass reads (dx, added to) is put back, so the result is still one pass's.
    {
        const Out e = run(ConvPath::blas, true, true, true), t = run(ConvPath::timed, true, true, true);
        CHECK(within_rounding(t.y, e.y));
        CHECK(within_rounding(t.dx, e.dx));
        CHECK(within_rounding(t.dw, e.dw));
    }
    // Without an input gradient (a first layer's): dw alone, the same.
    const testing::ConvPathScope scope(ConvPath::onednn);
    std::vector<float> dw(ws, NAN), db(cout, NAN);
    backend::cpu::conv_backward<g>(ctx, cout, w.data(), x.data(), dy.data(), nullptr, dw.data(), db.data(), n,
                                   scratch.data());
    CHECK(within_rounding(dw, run(ConvPath::blas, false, true, false).dw));
}

// The same for a transposed convolution (oneDNN's deconvolution): x (n, c, g.oh, g.ow), y (n, g.c,
// g.h, g.w), w (c, g.c, kh, kw), with and without a bias and an input gradient.
template <core::Window g>
void onednn_transposed_matches_im2col(int c, std::size_t n, std::mt19937_64& rng)
{
    using backend::cpu::ConvPath;
    Ctx ctx;
    const std::size_t xs = n * std::size_t(c) * g.out_pixels(), ys = n * g.in_size(), ws = std::size_t(c) * g.col_rows();
    const auto x = uniform(xs, -1.0f, 1.0f, rng), w = uniform(ws, -0.5f, 0.5f, rng), b = uniform(g.c, -0.5f, 0.5f, rng),
               dy = uniform(ys, -1.0f, 1.0f, rng);
    std::vector<float> scratch(backend::cpu::conv_transpose_scratch_size<g, float>(ctx, c, n));
    struct Out {
        std::vector<float> y, dx, dw, db;
    };
    auto run = [&](ConvPath path, bool bias, bool data) {
        const testing::ConvPathScope scope(path);
        Out o{std::vector<float>(ys, NAN), std::vector<float>(xs, NAN), std::vector<float>(ws, NAN),
              std::vector<float>(g.c, NAN)};
        backend::cpu::conv_transpose_forward<g>(ctx, c, w.data(), bias ? b.data() : nullptr, x.data(), o.y.data(), n,
                                                scratch.data());
        backend::cpu::conv_transpose_backward<g>(ctx, c, w.data(), x.data(), dy.data(), data ? o.dx.data() : nullptr,
                                                 o.dw.data(), bias ? o.db.data() : nullptr, n, scratch.data());
        return o;
    };
    for (const bool bias : {false, true})
        for (const bool data : {true, false}) {
            CAPTURE(bias, data);
            const std::size_t made = ctx.onednn().plans_made();
            const Out e = run(ConvPath::blas, bias, data), a = run(ConvPath::onednn, bias, data);
            // oneDNN ran: a new plan for each pass (without dx, the forward one is the previous round's)
            CHECK(ctx.onednn().plans_made() == made + (data ? 2 : 1));
            CHECK(within_rounding(a.y, e.y));
            CHECK(within_rounding(a.dw, e.dw));
            if (data) CHECK(within_rounding(a.dx, e.dx));
            if (bias) CHECK(within_rounding(a.db, e.db));
        }
}
} // namespace

TEST_CASE("oneDNN's transposed convolutions equal im2col's within float rounding: forward, input, weight and bias "
          "gradients",
          "[cpu][layers][onednn]")
{
    const std::uint64_t seed = testing::test_seed();
    INFO(testing::rerun(seed));
    std::mt19937_64 rng(seed);
    using core::Window;
    onednn_transposed_matches_im2col<Window{5, 16, 16, 4, 4, 2, 2, 1, 1, 8, 8}>(6, 3, rng);   // FCN's kind, x2
    onednn_transposed_matches_im2col<Window{3, 7, 9, 3, 3, 1, 1, 0, 0, 5, 7}>(4, 2, rng);     // stride 1, non-square
    onednn_transposed_matches_im2col<Window{2, 5, 5, 3, 3, 2, 2, 1, 1, 3, 3}>(2, 2, rng);     // stride 2, padding 1
}

TEST_CASE("oneDNN's convolutions equal im2col's within float rounding: forward, input, weight and bias gradients",
      "[cpu][layers][onednn]")
{
    const std::uint64_t seed = testing::test_seed();
    INFO(testing::rerun(seed));
    std::mt19937_64 rng(seed);
    using core::Window;
    onednn_matches_im2col<Window{8, 9, 9, 3, 3, 1, 1, 1, 1, 9, 9}>(16, 3, rng);     // padding 1
    onednn_matches_im2col<Window{8, 10, 9, 3, 3, 2, 2, 1, 1, 5, 5}>(16, 2, rng);    // stride 2, padding, non-square
    onednn_matches_im2col<Window{16, 8, 8, 1, 1, 2, 2, 0, 0, 4, 4}>(8, 3, rng);     // 1x1, stride 2 (a projection)
    onednn_matches_im2col<Window{3, 7, 7, 2, 2, 2, 2, 0, 0, 3, 3}>(4, 2, rng);      // the last row and column unread
    onednn_matches_im2col<Window{1, 12, 12, 5, 5, 1, 1, 0, 0, 8, 8}>(6, 4, rng);    // one input channel (LeNet's first)
    onednn_matches_im2col<Window{4, 1, 20, 1, 5, 1, 2, 0, 2, 1, 10}>(6, 3, rng);    // 1-D, stride 2, padding 2
}

// Which code the automatic path runs for the forward pass and the gradients of one layer, told by the
// bits: each pass equals, bit for bit, the run forced onto the code the rule names (and the two codes
// differ in bits there, or the check could not tell them apart).
template <core::Window g>
void automatic_runs(int cout, bool forward_onednn, bool backward_onednn)
{
    using backend::cpu::ConvPath;
    Ctx ctx;
    std::mt19937_64 rng(5);
    const std::size_t n = 4, xs = n * g.in_size(), ys = n * std::size_t(cout) * g.out_pixels(),
                      ws = std::size_t(cout) * g.col_rows();
    const auto x = uniform(xs, -1.0f, 1.0f, rng), w = uniform(ws, -0.5f, 0.5f, rng), dy = uniform(ys, -1.0f, 1.0f, rng);
    std::vector<float> scratch(backend::cpu::conv_scratch_size<g, float>(ctx, cout, n));
    auto run = [&](ConvPath path) {
        const testing::ConvPathScope scope(path);
        std::vector<float> y(ys), dx(xs), dw(ws);
        backend::cpu::conv_forward<g>(ctx, cout, w.data(), nullptr, x.data(), y.data(), n, scratch.data(), false);
        backend::cpu::conv_backward<g>(ctx, cout, w.data(), x.data(), dy.data(), dx.data(), dw.data(), nullptr, n,
                                       scratch.data());
        return std::array{y, dw};
    };
    const auto blas = run(ConvPath::blas), onednn = run(ConvPath::onednn), automatic = run(ConvPath::automatic);
    REQUIRE(blas[0] != onednn[0]);
    REQUIRE(blas[1] != onednn[1]);
    CHECK(automatic[0] == (forward_onednn ? onednn : blas)[0]);
    CHECK(automatic[1] == (backward_onednn ? onednn : blas)[1]);
}

TEST_CASE("The automatic conv path: LeNet's gradients on im2col, the rest on oneDNN", "[cpu][layers][onednn]")
{
    using core::Window;
    automatic_runs<Window{1, 28, 28, 5, 5, 1, 1, 0, 0, 24, 24}>(20, true, false);     // LeNet's first
    automatic_runs<Window{20, 12, 12, 5, 5, 1, 1, 0, 0, 8, 8}>(50, true, false);      // LeNet's second
    automatic_runs<Window{16, 14, 14, 3, 3, 1, 1, 1, 1, 14, 14}>(16, true, true);     // a ResNet-20 layer
    automatic_runs<Window{3, 64, 64, 3, 3, 1, 1, 1, 1, 64, 64}>(16, true, true);      // RGB on a large image
}
#endif

} // namespace test_layers
