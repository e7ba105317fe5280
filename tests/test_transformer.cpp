// Issue 43's first layers on the CPU: LayerNorm, GELU's tanh form, Linear over a sequence and
// CausalSelfAttention against PyTorch (tests/pytorch/transformer.txt, written by
// tests/pytorch/make_transformer_fixtures.py), their compile-time facts, and a small model of them
// trained alone and under DataParallel. Their numerical gradient checks are in test_layers.cpp.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "catch.hpp"
#include "fixtures.hpp"
#include "models.hpp"
#include "support.hpp"

// The runner compiles the test files in groups (tests/meson.build): this file's names stay in its own
// namespace.
namespace test_transformer {

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

namespace {
using TwoBlockGpt = GPT<2, 2, 16, 8, 24>;
// Every op of a GPT decodes one position at a time; a convolution, which mixes positions, does not.
static_assert(layers::decodes_of<TinyGpt::chain> && layers::decodes_of<TwoBlockGpt::chain>);
static_assert(TinyGpt::chain::decode_cache == 2 * 16 * 32);   // one attention's keys and values
static_assert(!layers::decodes_of<Sequential<Input<Tokens<8>>, Embedding<16, 8>, Conv1d<8, 1>, Linear<16>>::chain>);

// Model M's logits at the last position of `window` (at most Context ids, from position 0): predict on
// the window padded with id 0, whose causal mask keeps the padding out of the window's positions.
template <class M>
std::vector<float> predicted_logits(M& net, std::span<const std::int32_t> window)
{
    constexpr std::size_t C = M::input_shape::size, V = M::vocabulary;
    std::vector<std::int32_t> ids(C, 0);
    std::copy(window.begin(), window.end(), ids.begin());
    const std::vector<float> all = predict(net, ids.data(), 1);
    const auto row = all.begin() + std::ptrdiff_t((window.size() - 1) * V);
    return {row, row + std::ptrdiff_t(V)};
}

// max |got - want| over max |want|.
double row_error(std::span<const float> got, const std::vector<float>& want)
{
    double most = 0.0, scale = 0.0;
    for (std::size_t i = 0; i < want.size(); ++i) {
        most = std::max(most, std::abs(double(got[i]) - double(want[i])));
        scale = std::max(scale, std::abs(double(want[i])));
    }
    return most / scale;
}

template <class M>
std::vector<std::int32_t> random_ids(std::size_t n, std::uint64_t seed)
{
    std::vector<std::int32_t> ids(n);
    for (std::size_t i = 0; i < n; ++i)
        ids[i] = std::int32_t(core::random_bits(seed, core::Stream::synthetic, 9, i, 0) % M::vocabulary);
    return ids;
}

// A model of seed `seed` after 3 Adam steps on token batches (LayerNorm's weights and biases moved off 1, 0).
template <class M>
M trained_gpt(std::uint64_t seed)
{
    M net{Device::cpu(), seed};
    const TokenBatches<M> data(12, seed);
    Adam opt{{.lr = 0.01f}};
    for (std::size_t s = 0; s < 3; ++s) REQUIRE(std::isfinite(train_step(net, opt, data.batch(4 * s, 4, 4 * s))));
    return net;
}

// Greedy ids after the prompt, each from predict on the whole sequence so far.
template <class M>
std::vector<std::int32_t> greedy_by_predict(M& net, std::vector<std::int32_t> ids, std::size_t n)
{
    for (std::size_t i = 0; i < n; ++i) {
        const std::vector<float> l = predicted_logits(net, ids);
        ids.push_back(std::int32_t(std::max_element(l.begin(), l.end()) - l.begin()));
    }
    return ids;
}
} // namespace

TEST_CASE("Decoding one position at a time equals predict at every position: TinyGpt and a 2-block GPT",
          "[cpu][transformer][generate]")
{
    auto check = [](auto net) {
        using M = decltype(net);
        constexpr std::size_t C = M::input_shape::size;
        const std::vector<std::int32_t> ids = random_ids<M>(C, 3);
        Decoder<M> decoder{net};
        for (std::size_t round = 0; round < 2; ++round) {   // and again after reset()
            decoder.reset();
            for (std::size_t p = 0; p < C; ++p) {
                const std::span<const float> got = decoder.push(ids[p]);
                REQUIRE(got.size() == M::vocabulary);
                const double e = row_error(got, predicted_logits(net, std::span(ids).first(p + 1)));
                CAPTURE(round, p, e);
                CHECK(e < 1e-5);
            }
        }
    };
    check(trained_gpt<TinyGpt>(5));
    check(trained_gpt<TwoBlockGpt>(6));
}

TEST_CASE("generate with top_k = 1, or a temperature near 0, is greedy as predict on the whole prefix computes it",
          "[cpu][transformer][generate]")
{
    TinyGpt net = trained_gpt<TinyGpt>(7);
    const std::vector<std::int32_t> prompt = {3, 17, 42};
    const std::vector<std::int32_t> want = greedy_by_predict(net, prompt, 8);
    CHECK(generate(net, prompt, 8, {.top_k = 1, .seed = 1}) == want);
    CHECK(generate(net, prompt, 8, {.temperature = 5.0f, .top_k = 1, .seed = 2}) == want);
    CHECK(generate(net, prompt, 8, {.temperature = 1e-6f, .seed = 3}) == want);
    CHECK(generate(net, prompt, 0) == prompt);
}

TEST_CASE("generate: the same seed gives the same ids, another seed others; DataParallel's model the same",
          "[cpu][transformer][generate]")
{
    TinyGpt net = trained_gpt<TinyGpt>(8);
    const std::vector<std::int32_t> prompt = {1, 2};
    const std::vector<std::int32_t> a = generate(net, prompt, 12, {.temperature = 1.0f, .top_k = 20, .seed = 11});
    REQUIRE(a.size() == 14);
    CHECK(std::equal(prompt.begin(), prompt.end(), a.begin()));
    CHECK(generate(net, prompt, 12, {.temperature = 1.0f, .top_k = 20, .seed = 11}) == a);
    CHECK(generate(net, prompt, 12, {.temperature = 1.0f, .top_k = 20, .seed = 12}) != a);
    for (std::int32_t id : a) CHECK((id >= 0 && id < 64));
    // Each draw is keyed on its position in the output: the Decoder's logits and a Sampler, by hand.
    {
        Decoder<TinyGpt> decoder{net};
        Sampler sample{{.temperature = 1.0f, .top_k = 20, .seed = 11}};
        std::vector<std::int32_t> by_hand = prompt;
        std::span<const float> logits;
        for (std::int32_t id : prompt) logits = decoder.push(id);
        while (by_hand.size() < a.size()) logits = decoder.push(by_hand.emplace_back(sample(logits, by_hand.size())));
        CHECK(by_hand == a);
    }
    // Trained under DataParallel, from its parameters: the single model's ids.
    DataParallel<TinyGpt, Threaded> dp{cpus(2), 8};
    TinyGpt single{Device::cpu(), 8};
    const TokenBatches<TinyGpt> data(8, 8);
    Adam o1{{.lr = 0.01f}}, o2{{.lr = 0.01f}};
    for (std::size_t s = 0; s < 2; ++s) {
        train_step(dp, o1, data.batch(4 * s, 4, 4 * s));
        train_step(single, o2, data.batch(4 * s, 4, 4 * s));
    }
    const GenerateOptions greedy{.top_k = 1};
    CHECK(generate(dp, prompt, 10, greedy) == generate(single, prompt, 10, greedy));
    CHECK(generate(dp, prompt, 10, greedy) == greedy_by_predict(single, prompt, 10));
}

TEST_CASE("Sampling draws each id with softmax(logits / temperature) over the top_k, ties to the lower id",
          "[cpu][transformer][generate]")
{
    const std::vector<float> logits = {0.0f, 1.0f, 2.0f, -1.0f, 0.5f, 2.5f};
    constexpr std::size_t draws = 40000;
    for (const auto& [t, k] : {std::pair{1.0f, std::size_t{0}}, std::pair{1.7f, std::size_t{0}}, std::pair{0.8f, std::size_t{3}}}) {
        CAPTURE(t, k);
        std::vector<double> p(logits.size(), 0.0);
        std::vector<std::size_t> order = {5, 2, 1, 4, 0, 3};   // by logit, largest first
        double total = 0.0;
        for (std::size_t i = 0; i < (k ? k : logits.size()); ++i) total += p[order[i]] = std::exp(logits[order[i]] / t);
        for (double& q : p) q /= total;
        std::vector<std::size_t> counts(logits.size(), 0);
        Sampler sample{{.temperature = t, .top_k = k, .seed = 21}};
        for (std::size_t d = 0; d < draws; ++d) ++counts[std::size_t(sample(logits, d))];
        double chi2 = 0.0;
        for (std::size_t i = 0; i < p.size(); ++i) {
            if (p[i] == 0.0) CHECK(counts[i] == 0);
            else chi2 += (double(counts[i]) - draws * p[i]) * (double(counts[i]) - draws * p[i]) / (draws * p[i]);
        }
        CAPTURE(chi2);
        CHECK(chi2 < 40.0);   // 5 degrees of freedom at most: P(chi2 > 40) < 1e-6
    }
    // Ties: the lower id first.
    const std::vector<float> tied = {1.0f, 2.0f, 2.0f, 0.0f};
    Sampler greedy{{.top_k = 1, .seed = 4}};
    for (std::size_t d = 0; d < 50; ++d) CHECK(greedy(tied, d) == 1);
}

TEST_CASE("Beyond the context the window keeps its last Context / 2 ids, renumbered from 0, as predict computes them",
          "[cpu][transformer][generate]")
{
    TinyGpt net = trained_gpt<TinyGpt>(9);
    constexpr std::size_t C = 16;
    const std::vector<std::int32_t> ids = random_ids<TinyGpt>(3 * C + 5, 4);
    Decoder<TinyGpt> decoder{net};
    std::vector<std::int32_t> window;   // the rule, as the header states it
    for (std::size_t i = 0; i < ids.size(); ++i) {
        if (window.size() == C) window.erase(window.begin(), window.end() - std::ptrdiff_t(C / 2 - 1));
        window.push_back(ids[i]);
        const std::span<const float> got = decoder.push(ids[i]);
        REQUIRE(std::vector<std::int32_t>(decoder.window().begin(), decoder.window().end()) == window);
        const double e = row_error(got, predicted_logits(net, window));
        CAPTURE(i, e);
        CHECK(e < 1e-5);
    }
    // generate goes on past the context, and reads a prompt longer than it the same way.
    const std::vector<std::int32_t> prompt = {5, 6};
    const std::vector<std::int32_t> long_text = generate(net, prompt, C + 10, {.temperature = 0.9f, .seed = 5});
    CHECK(long_text.size() == C + 12);
    const std::vector<std::int32_t> longer = generate(net, long_text, 4, {.top_k = 1});
    REQUIRE(longer.size() == C + 16);
    window.clear();
    for (std::int32_t id : long_text) {
        if (window.size() == C) window.erase(window.begin(), window.end() - std::ptrdiff_t(C / 2 - 1));
        window.push_back(id);
    }
    const std::vector<float> l = predicted_logits(net, window);
    CHECK(longer[C + 12] == std::int32_t(std::max_element(l.begin(), l.end()) - l.begin()));
}

TEST_CASE("generate refuses an empty prompt, ids outside the vocabulary, temperature <= 0 or not finite, top_k > Vocab",
          "[cpu][transformer][generate]")
{
    TinyGpt net{Device::cpu(), 1};
    const std::vector<std::int32_t> empty;
    CHECK_THROWS_WITH(generate(net, empty, 3), Catch::Contains("prompt is empty"));
    CHECK_THROWS_WITH(generate(net, std::vector<std::int32_t>{1, 2, 64}, 3),
                      Catch::Contains("position 2") && Catch::Contains("token id 64"));
    CHECK_THROWS_WITH(generate(net, std::vector<std::int32_t>{-1}, 3), Catch::Contains("token id -1"));
    const std::vector<std::int32_t> prompt = {1};
    CHECK_THROWS_WITH(generate(net, prompt, 3, {.temperature = 0.0f}), Catch::Contains("temperature"));
    CHECK_THROWS_AS(generate(net, prompt, 3, {.temperature = -1.0f}), Error);
    CHECK_THROWS_AS(generate(net, prompt, 3, {.temperature = std::nanf("")}), Error);
    CHECK_THROWS_AS(generate(net, prompt, 3, {.temperature = INFINITY}), Error);
    CHECK_THROWS_WITH(generate(net, prompt, 3, {.top_k = 65}), Catch::Contains("top_k 65"));
    CHECK(generate(net, prompt, 3, {.top_k = 64}).size() == 4);
    Decoder<TinyGpt> decoder{net};
    CHECK_THROWS_WITH(decoder.push(64), Catch::Contains("token id 64"));
    CHECK_THROWS_AS(Decoder<TinyGpt>(std::vector<float>(10)), Error);
}

} // namespace test_transformer
