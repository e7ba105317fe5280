// Issue 43's first layers on the CPU: LayerNorm, GELU's tanh form, Linear over a sequence and
// CausalSelfAttention against PyTorch (tests/pytorch/transformer.txt, written by
// tests/pytorch/make_transformer_fixtures.py), their compile-time facts, and a small model of them
// trained alone and under DataParallel. Their numerical gradient checks are in test_layers.cpp.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "catch.hpp"
#include "fixtures.hpp"
#include "models.hpp"
#include "support.hpp"

using namespace replica;
using namespace replica::testing;

namespace {

template <class L, class In>
using op_of = typename L::template op<In>;

// Shapes and parameter layouts.
static_assert(std::is_same_v<op_of<Linear<6>, Shape<5, 8>>::output_shape, Shape<5, 6>>);
static_assert(op_of<Linear<6>, Shape<5, 8>>::param_count == 6 * 8 + 6);   // one W and b for every position
static_assert(std::is_same_v<op_of<Linear<6>, Shape<8>>::output_shape, Shape<6>>);
static_assert(op_of<LayerNorm<>, Shape<5, 8>>::param_count == 16);
static_assert(op_of<LayerNorm<LayerNormOptions{.affine = false}>, Shape<5, 8>>::param_count == 0);
static_assert(op_of<LayerNorm<>, Shape<5, 8>>::saved_size == 10);
static_assert(op_of<LayerNorm<>, Shape<12>>::saved_size == 2);
static_assert(op_of<LayerNorm<>, Shape<5, 8>>::options_signature == 0);
static_assert(op_of<LayerNorm<LayerNormOptions{.eps = 1e-3f}>, Shape<5, 8>>::options_signature != 0);
static_assert(op_of<LayerNorm<LayerNormOptions{.eps = 1e-3f}>, Shape<5, 8>>::options_signature !=
              op_of<LayerNorm<LayerNormOptions{.affine = false}>, Shape<5, 8>>::options_signature);
static_assert(op_of<LayerNorm<>, Shape<5, 8>>::param_blocks[0].kind == core::ParamKind::scale);
static_assert(op_of<LayerNorm<>, Shape<5, 8>>::param_blocks[1].kind == core::ParamKind::shift);
using Attn = op_of<CausalSelfAttention<2>, Shape<5, 8>>;
static_assert(std::is_same_v<Attn::output_shape, Shape<5, 8>>);
static_assert(Attn::param_count == 3 * 8 * 8 + 3 * 8 + 8 * 8 + 8);
static_assert(Attn::param_blocks.size() == 4 && Attn::param_blocks[0].count == 192 && Attn::param_blocks[1].count == 24 &&
              Attn::param_blocks[2].count == 64 && Attn::param_blocks[3].count == 8);
static_assert(Attn::param_blocks[0].kind == core::ParamKind::weight && Attn::param_blocks[1].kind == core::ParamKind::bias);
static_assert(Attn::kept_size == 4 * 5 * 8 && Attn::saved_size == 2 * 5);
static_assert(std::is_same_v<GELU, GELUWith<GeluApprox::none>>);
static_assert(!std::is_same_v<GELU, GELUWith<GeluApprox::tanh>>);

const Device kCpu[] = {Device::cpu()};

// One forward and one backward of layer L on the fixture's `name`_x with `name`_dy and parameters
// `params` (the record's name, or none), each result against PyTorch's within `bound` relative (max
// error over the largest value).
template <class L, class In>
void check_against_pytorch(const std::map<std::string, std::vector<double>>& f, const std::string& name,
                           const std::string& params, const std::string& results, double bound)
{
    using O = op_of<L, In>;
    INFO("record " << results);
    backend::cpu::Context ctx{Device::cpu()};
    O op{model::Build{.layer_id = 1, .devices = kCpu}};
    const std::vector<float> x = to_float(f.at(name + "_x")), dy = to_float(f.at(name + "_dy"));
    const std::size_t n = x.size() / In::size;
    REQUIRE(n * In::size == x.size());
    std::vector<float> p(O::param_count);
    if (!params.empty()) p = to_float(f.at(params));
    REQUIRE(p.size() == O::param_count);
    const float nan = std::nanf("");
    std::vector<float> y(n * O::output_shape::size, nan), dx(x.size(), nan), dp(O::param_count, nan),
        saved(n * O::saved_size, nan), kept(n * O::kept_size, nan), scratch(op.scratch_size(ctx, n), nan);
    op.forward(ctx, model::Pass{}, model::ForwardArgs<>{.params = p.data(), .weights = p.data(), .x = x.data(), .y = y.data(),
                                                      .n = n, .saved = saved.data(), .kept = kept.data(),
                                                      .scratch = scratch.data()});
    op.backward(ctx, model::Pass{}, model::BackwardArgs<>{.params = p.data(), .weights = p.data(), .x = x.data(),
                                                        .y = y.data(), .dy = dy.data(), .dx = dx.data(),
                                                        .dparams = dp.data(), .n = n, .saved = saved.data(),
                                                        .kept = kept.data(), .scratch = scratch.data()});
    const double ey = relative_error(y, f.at(results + "_y")), edx = relative_error(dx, f.at(results + "_dx"));
    CAPTURE(ey, edx);
    CHECK(ey < bound);
    CHECK(edx < bound);
    if constexpr (O::param_count > 0) {
        const double edp = relative_error(dp, f.at(results + "_dparams"));
        CAPTURE(edp);
        CHECK(edp < bound);
    }
}

const SGDOptions kSgd{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f};

// Three SGD steps of `batch` samples (the last one batch - 1, at least 1); the parameters after.
template <class Model, class Data>
std::vector<float> three_steps(Model& model, const Data& data, std::size_t batch, std::vector<float>* losses = nullptr)
{
    SGD opt{kSgd};
    std::size_t first = 0;
    for (int s = 0; s < 3; ++s) {
        const std::size_t n = s == 2 ? std::max<std::size_t>(1, batch - 1) : batch;
        const float loss = train_step(model, opt, data.batch(first, n, first));
        REQUIRE(std::isfinite(loss));
        if (losses) losses->push_back(loss);
        first += n;
    }
    return parameters(model);
}

} // namespace

TEST_CASE("LayerNorm against PyTorch: affine or not, eps 1e-5 and 1e-3, rows of a sequence and a vector",
          "[cpu][transformer][pytorch]")
{
    // Float sums of 8 or 12 values in another order than float64's: a few 1e-7 relative.
    const auto f = read_fixture("transformer.txt");
    check_against_pytorch<LayerNorm<>, Shape<5, 8>>(f, "ln", "ln_affine_params", "ln_affine", 1e-5);
    check_against_pytorch<LayerNorm<LayerNormOptions{.eps = 1e-3f}>, Shape<5, 8>>(f, "ln", "ln_affine_eps_params",
                                                                                  "ln_affine_eps", 1e-5);
    check_against_pytorch<LayerNorm<LayerNormOptions{.affine = false}>, Shape<5, 8>>(f, "ln", "", "ln_plain", 1e-5);
    check_against_pytorch<LayerNorm<LayerNormOptions{.eps = 1e-3f, .affine = false}>, Shape<5, 8>>(f, "ln", "",
                                                                                                   "ln_plain_eps", 1e-5);
    check_against_pytorch<LayerNorm<>, Shape<12>>(f, "ln_vector", "ln_vector_params", "ln_vector", 1e-5);
}

TEST_CASE("GELU's tanh form against PyTorch's GELU(approximate='tanh')", "[cpu][transformer][pytorch]")
{
    const auto f = read_fixture("transformer.txt");
    check_against_pytorch<GELUWith<GeluApprox::tanh>, Shape<41>>(f, "gelu_tanh", "", "gelu_tanh", 1e-6);
    // GELU stays the exact (erf) form, which differs from the tanh form by up to ~1e-3 here.
    backend::cpu::Context ctx;
    const std::vector<float> x = to_float(f.at("gelu_tanh_x"));
    std::vector<float> y(x.size());
    backend::cpu::gelu_forward(ctx, x.data(), y.data(), x.size());
    CHECK(relative_error(y, f.at("gelu_tanh_y")) > 1e-5);
}

TEST_CASE("Linear over a sequence against PyTorch's nn.Linear on (N, positions, features)", "[cpu][transformer][pytorch]")
{
    const auto f = read_fixture("transformer.txt");
    check_against_pytorch<Linear<6>, Shape<5, 8>>(f, "linear_seq", "linear_seq_params", "linear_seq", 1e-5);
}

TEST_CASE("CausalSelfAttention against nanoGPT's: 2 and 4 heads, T 5 to 8, D 8 to 16", "[cpu][transformer][pytorch]")
{
    const auto f = read_fixture("transformer.txt");
    check_against_pytorch<CausalSelfAttention<2>, Shape<5, 8>>(f, "attn_2_5_8", "attn_2_5_8_params", "attn_2_5_8", 1e-5);
    check_against_pytorch<CausalSelfAttention<4>, Shape<8, 16>>(f, "attn_4_8_16", "attn_4_8_16_params", "attn_4_8_16", 1e-5);
    check_against_pytorch<CausalSelfAttention<2>, Shape<7, 12>>(f, "attn_2_7_12", "attn_2_7_12_params", "attn_2_7_12", 1e-5);
    check_against_pytorch<CausalSelfAttention<4>, Shape<6, 8>>(f, "attn_4_6_8", "attn_4_6_8_params", "attn_4_6_8", 1e-5);
}

TEST_CASE("A small transformer trains, and DataParallel on 2 and 3 replicas equals the single model",
          "[cpu][transformer][parallel]")
{
    const RandomBatches<TinyTransformer> data(3 * 7, 5);
    for (std::size_t batch : {7, 3}) {   // 3 then 2 over 3 replicas: uneven, and a replica with no samples
        TinyTransformer single{Device::cpu(), 3};
        const std::vector<float> initial = parameters(single);
        std::vector<float> losses;
        const std::vector<float> want = three_steps(single, data, batch, &losses);
        CHECK(differences(want, initial) != "");
        for (std::size_t replicas : {2, 3}) {
            CAPTURE(batch, replicas);
            DataParallel<TinyTransformer, Threaded> dp{cpus(replicas), 3};
            CHECK(differences(parameters(dp), initial) == "");
            const std::vector<float> got = three_steps(dp, data, batch);
            // The replicas' gradients are summed in another order: float rounding.
            CHECK(max_relative_difference(want, got) < 2e-5);
        }
    }
    // More steps on one batch lower its loss (a label per position: 48 to fit).
    TinyTransformer net{Device::cpu(), 4};
    Adam opt{{.lr = 0.01f}};
    const float first = train_step(net, opt, data.batch(0, 8, 0));
    float last = first;
    for (int s = 0; s < 60; ++s) last = train_step(net, opt, data.batch(0, 8, 0));
    CAPTURE(first, last);
    CHECK(last < 0.5f * first);
}
