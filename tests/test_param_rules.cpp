// Parameter rules (model/param_rules.hpp): the plan a rule makes of a model's parameters at compile
// time, AdamW over PyTorch's param_groups (tests/pytorch/param_groups.txt: a frozen first block, no decay
// on biases and normalisations, a half rate for one weight), frozen parameters' gradients left out of
// the all-reduce, rules under DataParallel, the reproducible mode, Accumulate and checkpoints.

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "catch.hpp"
#include "fixtures.hpp"
#include "models.hpp"
#include "replica/replica.hpp"
#include "seeds.hpp"
#include "support.hpp"

// The runner compiles the test files in groups (tests/meson.build): this file's names stay in its own
// namespace.
namespace test_param_rules {

using namespace replica;
using namespace replica::testing;

namespace {

using Plan = GroupNet::update_plan;
static_assert(model::param_ranges_of<GroupNet::chain>.back().layer == GroupRule::head &&
              model::param_ranges_of<GroupNet::chain>.back().kind == ParamKind::bias);
// The first Conv2d (2 -> 4, 3x3, no bias: 72) and its BatchNorm (8) are frozen: one run at the start.
static_assert(Plan::frozen_run_count == 1 && Plan::frozen_runs[0].first == 0 && Plan::frozen_runs[0].second == 80);
static_assert(GroupNet::trainable_count == GroupNet::param_count - 80);
static_assert(Plan::segments.front().begin == 80 && Plan::segments.front().state == 0 &&
              Plan::segments.front().decay == 1.0f);
static_assert(Plan::segments.back().decay == 0.0f && Plan::segments.back().count == 5);   // the Linear's bias
static_assert(Plan::segments[Plan::segment_count - 2].lr_scale == 0.5f);                  // its weight
// The default decays filters and weights only; DecayAll everything, in one segment.
static_assert(TorchResNet::update_plan::segment_count == 1 &&
              with_param_rule<TorchResNet, DecayWeights>::update_plan::segment_count > 1);
static_assert(with_param_rule<TorchResNet, GroupRule>::param_count == TorchResNet::param_count);
static_assert(std::is_same_v<with_param_rule<with_precision<TorchResNet, bf16>, GroupRule>,
                             with_precision<with_param_rule<TorchResNet, GroupRule>, bf16>>);

// TorchNet (fixtures.hpp: Linear ids 0, 2, 4, 6) with its first Linear frozen, weight decay on weights
// only and the last Linear at half the rate; and the same with its first two layers in a nested
// DataParallel.
struct FreezeFirstLinear {
    static constexpr Treatment treat(ParamKind kind, std::uint32_t layer)
    {
        if (layer == 0) return {.frozen = true};
        return {.decay = kind == ParamKind::weight ? 1.0f : 0.0f, .lr_scale = layer == 6 ? 0.5f : 1.0f};
    }
};
using Flat = with_param_rule<TorchNet, FreezeFirstLinear>;
using Nested = Sequential<ParamRule<FreezeFirstLinear>, Input<8>, DataParallel<Sequential<Input<8>, Linear<16>, GELU>, Threaded>,
                          Linear<12>, Tanh, Linear<10>, Sigmoid, Linear<4>>;
static_assert(Flat::trainable_count == Flat::param_count - 8 * 16 - 16 && Nested::trainable_count == Flat::trainable_count);

const std::vector<Device> kThreeCpus{Device::cpu(0), Device::cpu(1), Device::cpu(2)};

} // namespace

TEST_CASE("AdamW over parameter groups equals PyTorch's param_groups after 5 steps, on one replica and on three",
          "[cpu][optim][param-rules]")
{
    const auto f = read_fixture("param_groups.txt");
    const std::vector<float> initial = to_float(f.at("initial"));
    auto check = [&](auto& net, const char* what) {
        INFO(what);
        const std::vector<float> losses = train_groups(net, f);
        CHECK(max_error(losses, f.at("losses")) < kTorchTolerance);
        const std::vector<float> w = net.parameters();
        CHECK(max_error(w, f.at("final")) < kTorchTolerance);
        CHECK(max_error(net.statistics(), f.at("statistics")) < kTorchTolerance);
        // Frozen: not a bit moved; and no optimizer state for them (m and v for the others only).
        CHECK(std::equal(w.begin(), w.begin() + 80, initial.begin()));
        CHECK(net.optimizer_state().size() == 2 * GroupNet::trainable_count);
    };
    GroupNet one{Device::cpu()};
    check(one, "one replica");
    DataParallel<GroupNet, Threaded> three{kThreeCpus};
    check(three, "DataParallel over 3 CPU replicas");
}

TEST_CASE("A frozen range's gradients are not all-reduced", "[cpu][parallel][param-rules]")
{
    using Frozen = with_param_rule<TorchResNet, FreezeLayers<0, 8>>;   // the stem and the first block
    constexpr std::size_t frozen = Frozen::param_count - Frozen::trainable_count;
    static_assert(frozen > 0 && Frozen::update_plan::frozen_run_count == 1);
    DataParallel<Frozen, Threaded> dp{{Device::cpu(0), Device::cpu(1)}};
    DataParallel<TorchResNet, Threaded> all{{Device::cpu(0), Device::cpu(1)}};
    // The floats each replica hands to the all-reduce: the trainable parameters' gradients only.
    CHECK(dp.reduced_floats() == Frozen::trainable_count);
    CHECK(all.reduced_floats() == TorchResNet::param_count);
    // What the replicas hold after a step's backward: the reduced trainable part is the same on both;
    // the frozen part is each replica's own (their halves of the batch differ).
    const RandomBatches<Frozen> data(8, test_seed());
    dp.forward_backward(model::Pass{}, data.inputs.data(), data.labels.data(), 8, 1.0f);
    const std::vector<float> g0 = dp.replica(0).gradients(), g1 = dp.replica(1).gradients();
    CHECK(std::equal(g0.begin() + frozen, g0.end(), g1.begin() + frozen));
    CHECK_FALSE(std::equal(g0.begin(), g0.begin() + frozen, g1.begin()));
}

TEST_CASE("Rules train alike on one replica and under DataParallel: SGD, Adam, AdamW, Accumulate",
          "[cpu][parallel][param-rules]")
{
    using Net = with_param_rule<TorchResNet, GroupRule>;
    const RandomBatches<Net> data(12, test_seed());
    auto run = [&](auto& net, auto opt) {
        for (std::size_t s = 0; s < 4; ++s) train_step(net, opt, data.batch((s % 2) * 6, 6, (s % 2) * 6));
        return net.parameters();
    };
    auto both = [&](auto make_opt, const char* what) {
        INFO(what);
        Net one{Device::cpu()};
        DataParallel<Net, Threaded> three{kThreeCpus};
        const std::vector<float> a = run(one, make_opt()), b = run(three, make_opt());
        CHECK(norm_relative(a, b) < 1e-5);
        const std::vector<float> initial = Net{Device::cpu()}.parameters();
        CHECK(std::equal(a.begin(), a.begin() + 80, initial.begin()));   // frozen
        CHECK_FALSE(std::equal(a.begin() + 80, a.end(), initial.begin() + 80));
    };
    both([] { return SGD{{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-2f, .nesterov = true}}; }, "SGD");
    both([] { return Adam{{.lr = 0.01f, .weight_decay = 1e-2f}}; }, "Adam");
    both([] { return AdamW{{.lr = 0.01f, .weight_decay = 5e-2f}}; }, "AdamW");
    both([] { return Accumulate(AdamW{{.lr = 0.01f, .weight_decay = 5e-2f}}, 2); }, "Accumulate(AdamW, 2)");
    both([] { return ClipGradNorm(SGD{{.lr = 0.05f, .momentum = 0.9f}}, 0.5f); }, "ClipGradNorm(SGD)");

    // Accumulate's sum lives at the state indices: 2 batches of 6 equal one of 12 under the rule (a
    // model without BatchNorm, whose statistics would see the smaller batches).
    const RandomBatches<Flat> flat_data(12, test_seed());
    Flat a{Device::cpu()}, b{Device::cpu()};
    Accumulate acc(AdamW{{.lr = 0.01f, .weight_decay = 5e-2f}}, 2);
    AdamW plain{{.lr = 0.01f, .weight_decay = 5e-2f}};
    train_step(a, acc, flat_data.batch(0, 6, 0));
    train_step(a, acc, flat_data.batch(6, 6, 6));
    train_step(b, plain, flat_data.batch(0, 12, 0));
    CHECK(a.optimizer_state().size() == 3 * Flat::trainable_count);
    CHECK(norm_relative(a.parameters(), b.parameters()) < 1e-5);
    const std::vector<float> wa = a.parameters(), initial = Flat{Device::cpu()}.parameters();
    CHECK(std::equal(wa.begin(), wa.begin() + 8 * 16 + 16, initial.begin()));
}

TEST_CASE("ClipGradNorm's norm leaves out frozen parameters, as PyTorch's of the parameters that have gradients",
          "[cpu][optim][clip][param-rules]")
{
    using Net = with_param_rule<TorchResNet, FreezeLayers<0, 8>>;   // the stem and the first block
    const RandomBatches<Net> data(12, test_seed());
    Net clipped{Device::cpu()}, probe{Device::cpu()};
    const std::vector<float> w0 = probe.parameters();
    // The gradient train_step takes (the mean loss's), all of it, frozen parameters' too.
    probe.forward_backward(model::Pass{.seed = 7, .training = true}, data.inputs.data(), data.labels.data(), 12,
                           float(1.0 / 12.0));
    const std::vector<float> g = probe.gradients();
    constexpr std::size_t frozen = Net::param_count - Net::trainable_count;
    double squares = 0.0, all = 0.0;
    for (std::size_t i = 0; i < g.size(); ++i) {
        all += double(g[i]) * g[i];
        if (i >= frozen) squares += double(g[i]) * g[i];
    }
    const double norm = std::sqrt(squares);
    REQUIRE(std::sqrt(all) > 1.05 * norm);   // the frozen part would change the scale
    const float max_norm = float(0.5 * norm), lr = 0.1f;
    ClipGradNorm opt(SGD{{.lr = lr}}, max_norm);
    train_step(clipped, opt, data.batch(0, 12, 0));
    const double scale = double(max_norm) / (norm + 1e-6);
    const std::vector<float> w = clipped.parameters();
    std::vector<float> expected(w0);
    const auto plan = Net::update_plan::segments;
    for (const auto& s : plan)
        for (std::size_t j = 0; j < s.count; ++j)
            expected[s.begin + j] = float(w0[s.begin + j] - double(lr) * s.lr_scale * g[s.begin + j] * scale);
    CHECK(max_relative_difference(w, expected) < 1e-5);
    CHECK(std::equal(w.begin(), w.begin() + frozen, w0.begin()));
}

TEST_CASE("Under a rule the reproducible mode stays bit-identical on 1, 2 and 3 replicas", "[cpu][reproducible][param-rules]")
{
    using Net = with_param_rule<TorchResNet, GroupRule>;
    const RandomBatches<Net> data(12, test_seed());
    auto run = [&](auto& net) {
        AdamW opt{{.lr = 0.01f, .weight_decay = 5e-2f}};
        for (std::size_t s = 0; s < 3; ++s)
            train_step(net, opt, data.batch(0, 12, 0), StepOptions{.reproducible = true, .micro_shard = 4});
        return net.parameters();
    };
    DataParallel<Net, Threaded> one{{Device::cpu(0)}}, two{{Device::cpu(0), Device::cpu(1)}}, three{kThreeCpus};
    const std::vector<float> a = run(one);
    CHECK(run(two) == a);
    CHECK(run(three) == a);
}

TEST_CASE("A checkpoint holds state for the trainable parameters, and names the rule", "[cpu][checkpoint][param-rules]")
{
    using Net = with_param_rule<TorchResNet, GroupRule>;
    TempDir dir;
    const RandomBatches<Net> data(6, test_seed());
    Net net{Device::cpu()};
    AdamW opt{{.lr = 0.01f}};
    train_step(net, opt, data.batch(0, 6, 0));
    save_checkpoint(dir / "a.ckpt", net, {.epoch = 1, .step = 1}, opt);

    Net back{Device::cpu()};
    AdamW opt2{{.lr = 0.01f}};
    load_checkpoint(dir / "a.ckpt", back, opt2);
    CHECK(back.optimizer_state() == net.optimizer_state());
    CHECK(back.optimizer_state().size() == 2 * Net::trainable_count);
    train_step(net, opt, data.batch(0, 6, 0));
    train_step(back, opt2, data.batch(0, 6, 0));
    CHECK(back.parameters() == net.parameters());

    // The same layers under another rule: another model.
    CHECK(model_signature<Net>() != model_signature<TorchResNet>());
    CHECK(model_signature<TorchResNet>() != model_signature<with_param_rule<TorchResNet, DecayWeights>>());
    CHECK(model_signature<DataParallel<Net, Threaded>>() == model_signature<Net>());
    TorchResNet other{Device::cpu()};
    AdamW opt3{{.lr = 0.01f}};
    CHECK_THROWS_WITH(load_checkpoint(dir / "a.ckpt", other, opt3), Catch::Contains("signature"));

    // State that does not fit the trainable parameters is refused at the update, not used.
    Net wrong{Device::cpu()};
    wrong.set_optimizer_state(std::vector<float>(Net::trainable_count, 0.0f));   // SGD's size
    AdamW opt4{{.lr = 0.01f}};
    CHECK_THROWS_WITH(train_step(wrong, opt4, data.batch(0, 6, 0)),
                      Catch::Contains("keeps 2 for each of the " + std::to_string(Net::trainable_count) +
                                      " trainable parameters"));
    CHECK_THROWS_WITH(wrong.set_optimizer_state(std::vector<float>(Net::param_count, 0.0f)),
                      Catch::Contains("trainable parameters"));
}

TEST_CASE("A rule spans a nested DataParallel: its replicas update their slice as the model's rule says",
          "[cpu][parallel][param-rules]")
{
    const RandomBatches<Flat> data(12, test_seed());
    auto run = [&](auto& net) {
        AdamW opt{{.lr = 0.01f, .weight_decay = 0.1f}};
        for (int s = 0; s < 3; ++s) train_step(net, opt, data.batch(0, 12, 0));
        return net.parameters();
    };
    Flat flat{Device::cpu()};
    Nested nested{kThreeCpus};
    const std::vector<float> initial = flat.parameters();
    nested.set_parameters(initial);
    const std::vector<float> a = run(flat), b = run(nested);
    CHECK(norm_relative(a, b) < 1e-5);
    CHECK(std::equal(b.begin(), b.begin() + 8 * 16 + 16, initial.begin()));
    CHECK(nested.optimizer_state().size() == 2 * Nested::trainable_count);
}

} // namespace test_param_rules
