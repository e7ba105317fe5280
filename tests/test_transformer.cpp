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

namespace {
using FixtureGpt = GPT<2, 2, 16, 8, 24>;   // gpt.txt's (make_gpt_fixtures.py)
using Wte = Embedding<24, 16>;
static_assert(FixtureGpt::param_count == 7104);   // the head owns none: wte counted once
static_assert(op_of<TiedHead<Wte>, Shape<8, 16>>::param_count == 0);
static_assert(std::is_same_v<op_of<TiedHead<Wte>, Shape<8, 16>>::output_shape, Shape<8, 24>>);
static_assert(GPT2Small::param_count == 124'475'904);

std::vector<std::int32_t> ids_of(const std::vector<double>& v) { return {v.begin(), v.end()}; }
} // namespace

TEST_CASE("A 2-layer GPT with its head tied against nanoGPT's: logits, loss, gradients, 5 AdamW steps with clipping",
          "[cpu][transformer][pytorch][gpt]")
{
    const auto f = read_fixture("gpt.txt");
    const std::vector<std::int32_t> ids = ids_of(f.at("inputs")), labels = ids_of(f.at("labels"));
    constexpr std::size_t batch = 4, T = 8;
    FixtureGpt net{Device::cpu(), 1};
    net.set_parameters(to_float(f.at("initial")));

    // Logits: float sums of 16 to 64 products against float64, through two blocks.
    const std::vector<float> logits = predict(net, ids.data(), batch);
    const double e = relative_error(logits, f.at("logits"));
    CAPTURE(e);
    CHECK(e < 1e-5);
    // Each wrong variant is far outside that: without the causal mask, LayerNorm's eps 1e-3, GELU's erf form.
    for (const char* wrong : {"wrong_nomask", "wrong_eps", "wrong_erf"}) {
        CAPTURE(wrong);
        CHECK(relative_error(logits, f.at(wrong)) > 1e-4);
    }

    // The loss of batch 0 (the sum of the samples' means over their positions) and its gradient: the
    // table's is the head's and the embedding's, summed.
    // forward_backward's loss is the sum over every position of every sample: T times the record's.
    const double loss = net.forward_backward(model::Pass{}, ids.data(), labels.data(), batch, 1.0f / float(T));
    CHECK(std::abs(loss / double(T) - f.at("loss")[0]) < 1e-5 * f.at("loss")[0]);
    const double eg = relative_error(net.gradients(), f.at("grads"));
    CAPTURE(eg);
    CHECK(eg < 1e-5);

    // 5 steps of AdamW (weight decay on weights and embeddings: DecayWeights, nanoGPT's groups) with
    // every gradient clipped to its norm. Adam's steps of lr carry the gradients' relative rounding.
    const std::vector<double>& h = f.at("hyper");
    ClipGradNorm opt{AdamW{{.lr = float(h[0]), .beta1 = float(h[1]), .beta2 = float(h[2]), .eps = float(h[3]),
                            .weight_decay = float(h[4])}},
                     float(h[5])};
    for (std::size_t s = 0; s < 5; ++s) {
        const float l = train_step(net, opt, TokenBatch{ids.data() + s * batch * T, labels.data() + s * batch * T, batch,
                                                        s * batch, 1});
        CAPTURE(s, l);
        CHECK(std::abs(double(l) - f.at("losses")[s]) < 1e-5 * f.at("losses")[s]);
    }
    // Every parameter but the keys' biases, whose gradient is zero in exact arithmetic (adding the same
    // q . b to every score of a row leaves the softmax unchanged): Adam's normalised step moves them by
    // float rounding noise, up to lr a step, where float64's noise is 1e-17. They move less than that.
    const std::vector<float> after = parameters(net);
    std::vector<float> rest_got;
    std::vector<double> rest_want;
    constexpr std::size_t block = 2 * 16 + (48 * 16 + 48) + (16 * 16 + 16) + 2 * 16 + (64 * 16 + 64) + (16 * 64 + 16);
    for (std::size_t i = 0; i < after.size(); ++i) {
        const std::size_t in_block = (i - 24 * 16 - 8 * 16) % block;
        const bool key_bias = i >= 512 && i < 512 + 2 * block && in_block >= 32 + 48 * 16 + 16 && in_block < 32 + 48 * 16 + 32;
        if (key_bias) CHECK(std::abs(after[i] - f.at("initial")[i]) < 5 * h[0]);
        else rest_got.push_back(after[i]), rest_want.push_back(f.at("after")[i]);
    }
    REQUIRE(rest_got.size() == after.size() - 2 * 16);
    const double ea = relative_error(rest_got, rest_want);
    CAPTURE(ea);
    CHECK(ea < 1e-4);
    // Untied (a head of its own starting as a copy of the table), the table ends elsewhere.
    const std::vector<float> wte(after.begin(), after.begin() + 24 * 16);
    CHECK(relative_error(wte, f.at("wrong_untied_after")) > 1e-3);
    CHECK(relative_error(wte, {f.at("after").begin(), f.at("after").begin() + 24 * 16}) < 1e-4);
}
