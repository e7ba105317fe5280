// The reproducible mode: bit-identical parameters on 1, 2, 3 and 4 CPU replicas, with either dispatch
// policy, and across runs; another seed gives other parameters.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "catch.hpp"
#include "models.hpp"
#include "support.hpp"

// The runner compiles the test files in groups (tests/meson.build): this file's names stay in its own
// namespace.
namespace test_reproducible {

using namespace replica;
using namespace replica::testing;

namespace {

// Five steps of 20 samples (five_steps) on one model, then on 1, 2, 3 and 4 replicas with either
// dispatch policy (Threaded only for BatchNorm over the global batch, which SingleThread refuses at
// compile time): the same parameters and statistics bit for bit, run to run too; another seed differs.
template <class M, class Data, class Opt = SGD>
void bit_identical_on_any_replica_count(const Data& data, StepOptions options = kReproducible, const Opt& opt = five_steps_sgd())
{
    M single{Device::cpu(), 1};
    const auto expected = five_steps(single, data, 7, options, opt);
    const auto stats = single.statistics();
    for (std::size_t replicas : {1, 2, 3, 4}) {
        CAPTURE(replicas);
        if constexpr (M::syncs == 0) {
            DataParallel<M, SingleThread> one_thread{cpus(replicas), 1};
            CHECK(differences(five_steps(one_thread, data, 7, options, opt), expected) == "");
            CHECK(differences(one_thread.statistics(), stats) == "");
        }
        DataParallel<M, Threaded> threaded{cpus(replicas), 1};
        CHECK(differences(five_steps(threaded, data, 7, options, opt), expected) == "");
        CHECK(differences(threaded.statistics(), stats) == "");
    }
    M again{Device::cpu(), 1};
    CHECK(differences(five_steps(again, data, 7, options, opt), expected) == "");   // run to run
    M other_seed{Device::cpu(), 2};
    CHECK(differences(five_steps(other_seed, data, 8, options, opt), expected) != "");   // another seed: other initial weights and masks
}
template <class M>
void bit_identical_on_any_replica_count()
{
    bit_identical_on_any_replica_count<M>(RandomBatches<M>(100, 4));
}

// GPT's optimizer: AdamW (its step count in the object: a fresh copy each run), under a clip of the
// whole gradient's norm as GPT-2 trains.
AdamW gpt_adamw() { return AdamW{{.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.95f, .weight_decay = 0.1f}}; }

} // namespace

TEST_CASE("Reproducible mode: LeNet is bit-identical on 1-4 replicas and across runs", "[cpu][reproducible]")
{
    bit_identical_on_any_replica_count<LeNet>();
}

// Every convolution through oneDNN (ConvPath::onednn; the automatic choice takes it for LeNet's
// second only): its primitives on one thread each, in plans made per context, give the same bits
// whichever replica runs a shard.
TEST_CASE("Reproducible mode with oneDNN's convolutions: LeNet is bit-identical on 1-4 replicas and across runs",
          "[cpu][reproducible][onednn]")
{
    if (!backend::cpu::has_onednn) return;
    const ConvPathScope onednn(backend::cpu::ConvPath::onednn);
    bit_identical_on_any_replica_count<LeNet>();
}

TEST_CASE("Reproducible mode: Concat and Dropout are bit-identical on 1-4 replicas and across runs", "[cpu][reproducible]")
{
    bit_identical_on_any_replica_count<ConcatDropoutNet>();
}

// Micro-shards of 2: ten a step, more than a stash holds on one replica (model/exact_gradient.hpp adds
// them 8 and 2), 5 and 5 on two, 4, 3 and 3 on three.
TEST_CASE("Reproducible mode: a small GPT is bit-identical on 1-4 replicas and across runs", "[cpu][reproducible]")
{
    const TokenBatches<TinyGpt> data(100, 3);
    bit_identical_on_any_replica_count<TinyGpt>(data);
    bit_identical_on_any_replica_count<TinyGpt>(data, {.reproducible = true, .micro_shard = 2});
}

TEST_CASE("Reproducible mode: a small ResNet with BatchNorm is bit-identical on 1-4 replicas, statistics included",
          "[cpu][reproducible][batchnorm]")
{
    const RandomBatches<SmallResNet> data(100, 4);
    bit_identical_on_any_replica_count<SmallResNet>(data);
    bit_identical_on_any_replica_count<SmallResNet>(data, {.reproducible = true, .micro_shard = 2});
    // Each replica's own BatchNorm statistics: no sync point, so SingleThread too.
    bit_identical_on_any_replica_count<SmallResNetPerReplica>(RandomBatches<SmallResNetPerReplica>(100, 4),
                                                              {.reproducible = true, .micro_shard = 2});
}

TEST_CASE("Reproducible mode: a nested DataParallel is bit-identical on 1-3 replicas and to the plain model",
          "[cpu][reproducible]")
{
    const RandomBatches<SmallAlexNetPlain> data(100, 4);
    SmallAlexNetPlain plain{Device::cpu(), 6};
    const auto expected = five_steps(plain, data, 7);
    for (std::size_t replicas : {1, 2, 3}) {
        CAPTURE(replicas);
        SmallAlexNet<SingleThread> one_thread{cpus(replicas), 6};
        SmallAlexNet<Threaded> threaded{cpus(replicas), 6};
        CHECK(differences(five_steps(one_thread, data, 7), expected) == "");
        CHECK(differences(five_steps(threaded, data, 7), expected) == "");
        // The replicas that sat out took replica 0's parameters: a fast step after agrees with the plain model's.
        SGD opt{{.lr = 0.05f}};
        SmallAlexNetPlain plain_again{Device::cpu(), 6};
        five_steps(plain_again, data, 7);
        train_step(plain_again, opt, data.batch(0, 20, 100));
        train_step(threaded, opt, data.batch(0, 20, 100));
        CHECK(max_relative_difference(parameters(plain_again), parameters(threaded)) < 1e-5);
    }
}

// The nested part runs each micro-shard whole on its first replica, BatchNorm's shard sums in the
// parent's exact accumulator: the plain model's bits on any replica count, statistics included, and
// the other replicas take the moved statistics (an evaluation over all of them reads them).
TEST_CASE("Reproducible mode: a nested DataParallel holding BatchNorm is bit-identical on 1-4 replicas and to the plain model",
          "[cpu][reproducible][batchnorm]")
{
    const RandomBatches<BatchNormNestedPlain> data(100, 4);
    auto with = [&](const auto& opt, StepOptions options) {
        BatchNormNestedPlain plain{Device::cpu(), 6};
        const auto expected = five_steps(plain, data, 7, options, opt);
        const auto stats = plain.statistics();
        REQUIRE(differences(stats, BatchNormNestedPlain{Device::cpu(), 6}.statistics()) != "");   // they moved
        const auto eval_plain = plain.evaluate(data.inputs.data(), data.labels.data(), 30);
        for (std::size_t replicas : {1, 2, 3, 4}) {
            CAPTURE(replicas);
            BatchNormNested<Threaded> nested{cpus(replicas), 6};
            CHECK(differences(five_steps(nested, data, 7, options, opt), expected) == "");
            CHECK(differences(nested.statistics(), stats) == "");
            const auto eval = nested.evaluate(data.inputs.data(), data.labels.data(), 30);
            CHECK(eval.loss_sum == Approx(eval_plain.loss_sum).epsilon(1e-5));
        }
    };
    with(five_steps_sgd(), kReproducible);
    with(AdamW{{.lr = 0.01f}}, {.reproducible = true, .micro_shard = 3});
}

// AdamW divides by the root of each parameter's squared gradients, so a last-bit difference in a
// gradient near zero (attention's key biases: zero in exact arithmetic) becomes a step of the learning
// rate: the sum must be exact. Tied head (its gradient added to the embedding's) and untied, shards of
// 8 (three, uneven) and of 2 (ten), plain and clipped.
TEST_CASE("Reproducible mode with AdamW: GPTs are bit-identical on 1-4 replicas, both policies, and across runs",
          "[cpu][reproducible][transformer]")
{
    const TokenBatches<TinyGpt> tiny(100, 3);
    bit_identical_on_any_replica_count<TinyGpt>(tiny, kReproducible, gpt_adamw());
    bit_identical_on_any_replica_count<TinyGpt>(tiny, {.reproducible = true, .micro_shard = 2}, ClipGradNorm{gpt_adamw(), 0.5f});
    const TokenBatches<PipeGpt> two_blocks(100, 5);
    bit_identical_on_any_replica_count<PipeGpt>(two_blocks, {.reproducible = true, .micro_shard = 3}, ClipGradNorm{gpt_adamw(), 0.5f});
}

TEST_CASE("Reproducible mode with AdamW: residual networks with BatchNorm are bit-identical on 1-4 replicas, statistics included",
          "[cpu][reproducible][batchnorm]")
{
    const AdamW adamw{{.lr = 0.01f}};
    bit_identical_on_any_replica_count<SmallResNet>(RandomBatches<SmallResNet>(100, 4), kReproducible, adamw);
    // Each replica's own BatchNorm statistics: no sync point, so SingleThread too.
    bit_identical_on_any_replica_count<SmallResNetPerReplica>(RandomBatches<SmallResNetPerReplica>(100, 4),
                                                              {.reproducible = true, .micro_shard = 3}, adamw);
}

// The standard networks themselves, steps of 20 samples: ResNet-20 (BatchNorm in every block,
// projection shortcuts) and the text demo's CharGPT (four blocks, 64 positions, tied head).
TEST_CASE("Reproducible mode with AdamW: ResNet-20 is bit-identical on 1-4 replicas, statistics included",
          "[cpu][reproducible][batchnorm]")
{
    bit_identical_on_any_replica_count<ResNet20>(RandomBatches<ResNet20>(100, 4), kReproducible, AdamW{{.lr = 0.01f}});
}

// CharGPT's step is the costliest here: one replica count a policy (the small GPTs above take all).
TEST_CASE("Reproducible mode with AdamW: CharGPT is bit-identical on 2 and 3 replicas, both policies", "[cpu][reproducible][transformer]")
{
    const TokenBatches<CharGPT> data(100, 3);
    CharGPT single{Device::cpu(), 1};
    const auto expected = five_steps(single, data, 7, kReproducible, gpt_adamw());
    DataParallel<CharGPT, SingleThread> one_thread{cpus(3), 1};
    CHECK(differences(five_steps(one_thread, data, 7, kReproducible, gpt_adamw()), expected) == "");
    DataParallel<CharGPT, Threaded> threaded{cpus(2), 1};
    CHECK(differences(five_steps(threaded, data, 7, kReproducible, gpt_adamw()), expected) == "");
}

// Without a micro-shard the batch is cut into max_replicas shards (8 by default): 20 samples into
// shards of 3 (seven, the last of 2), which 1 and 3 replicas (3, 2 and 2 shards) run to the same bits,
// the bits of micro_shard = 3 and not those of shards of 8.
TEST_CASE("Reproducible mode's default micro-shard: the batch cut into max_replicas shards, the same bits on 1 and 3 replicas",
          "[cpu][reproducible][batchnorm]")
{
    CHECK(default_micro_shard(20, 8) == 3);
    CHECK(default_micro_shard(128, 8) == 16);
    CHECK(default_micro_shard(129, 8) == 17);
    CHECK(default_micro_shard(5, 8) == 1);
    CHECK(default_micro_shard(20, 4) == 5);
    CHECK(default_micro_shard(20, 1) == 20);
    const StepOptions by_default{.reproducible = true};
    const RandomBatches<SmallResNet> images(100, 4);
    SmallResNet single{Device::cpu(), 1};
    const auto expected = five_steps(single, images, 7, by_default);
    const auto stats = single.statistics();
    for (std::size_t replicas : {1, 3}) {
        CAPTURE(replicas);
        DataParallel<SmallResNet, Threaded> threaded{cpus(replicas), 1};
        CHECK(differences(five_steps(threaded, images, 7, by_default), expected) == "");
        CHECK(differences(threaded.statistics(), stats) == "");
    }
    SmallResNet threes{Device::cpu(), 1}, eights{Device::cpu(), 1};
    CHECK(differences(five_steps(threes, images, 7, {.reproducible = true, .micro_shard = 3}), expected) == "");
    CHECK(differences(five_steps(eights, images, 7, kReproducible), expected) != "");
    // Another max_replicas, another shard (5 samples), the same on any replica count; SingleThread too.
    const TokenBatches<TinyGpt> tokens(100, 3);
    TinyGpt gpt{Device::cpu(), 1};
    const auto gpt_expected = five_steps(gpt, tokens, 7, {.reproducible = true, .max_replicas = 4}, gpt_adamw());
    TinyGpt fives{Device::cpu(), 1};
    CHECK(differences(five_steps(fives, tokens, 7, {.reproducible = true, .micro_shard = 5}, gpt_adamw()), gpt_expected) == "");
    for (std::size_t replicas : {1, 3}) {
        CAPTURE(replicas);
        DataParallel<TinyGpt, SingleThread> one_thread{cpus(replicas), 1};
        DataParallel<TinyGpt, Threaded> threaded{cpus(replicas), 1};
        CHECK(differences(five_steps(one_thread, tokens, 7, {.reproducible = true, .max_replicas = 4}, gpt_adamw()), gpt_expected) == "");
        CHECK(differences(five_steps(threaded, tokens, 7, {.reproducible = true, .max_replicas = 4}, gpt_adamw()), gpt_expected) == "");
    }
}

// The Trainer's default micro-shard too: batches of 16 (shards of 2) and an epoch's last of 12 (shards
// of 2, six), one model against 3 replicas, statistics included; and its max_replicas.
TEST_CASE("Reproducible mode's default micro-shard in the Trainer: the same bits on 1 and 3 replicas", "[cpu][reproducible][batchnorm]")
{
    const auto set = data::synthetic_dataset(60, SmallResNet::input_shape::size, 1, 5, 3);
    const TrainOptions options{.batch_size = 16, .epochs = 2, .seed = 5, .reproducible = true, .progress = false, .log = nullptr};
    SmallResNet single{Device::cpu(), 1};
    AdamW a{{.lr = 0.01f}};
    Trainer{single, a, options}.fit(set);
    DataParallel<SmallResNet, Threaded> three{cpus(3), 1};
    AdamW b{{.lr = 0.01f}};
    Trainer{three, b, options}.fit(set);
    CHECK(differences(parameters(three), parameters(single)) == "");
    CHECK(differences(three.statistics(), single.statistics()) == "");
    CHECK(differences(parameters(single), parameters(SmallResNet{Device::cpu(), 1})) != "");   // it trained
    // max_replicas reaches the step: 4 shards of 4 (and 3) are another run, theirs on any replica count.
    TrainOptions fours = options;
    fours.max_replicas = 4;
    SmallResNet single4{Device::cpu(), 1};
    AdamW c{{.lr = 0.01f}};
    Trainer{single4, c, fours}.fit(set);
    CHECK(differences(parameters(single4), parameters(single)) != "");
    DataParallel<SmallResNet, Threaded> two{cpus(2), 1};
    AdamW d{{.lr = 0.01f}};
    Trainer{two, d, fours}.fit(set);
    CHECK(differences(parameters(two), parameters(single4)) == "");
}

// A default micro-shard for no replica at all is refused, naming the option; an explicit size needs
// no max_replicas (it is not read).
TEST_CASE("Reproducible mode: max_replicas of 0 is refused with the option's name", "[cpu][reproducible]")
{
    const TokenBatches<TinyGpt> tokens(20, 3);
    TinyGpt gpt{Device::cpu(), 1};
    AdamW opt = gpt_adamw();
    const auto before = parameters(gpt);
    CHECK_THROWS_WITH(train_step(gpt, opt, tokens.batch(0, 20, 0), {.reproducible = true, .max_replicas = 0}),
                      Catch::Contains("StepOptions::max_replicas must be at least 1"));
    CHECK(differences(parameters(gpt), before) == "");
    CHECK(opt.step_count() == 0);
    train_step(gpt, opt, tokens.batch(0, 20, 0), {.reproducible = true, .micro_shard = 4, .max_replicas = 0});
    CHECK(differences(parameters(gpt), before) != "");
}

TEST_CASE("Reproducible mode: close to the fast mode", "[cpu][reproducible]")
{
    const RandomBatches<LeNet> data(100, 4);
    LeNet fast{Device::cpu(), 1}, exact{Device::cpu(), 1};
    SGD a{{.lr = 0.05f, .momentum = 0.9f}}, b{{.lr = 0.05f, .momentum = 0.9f}};
    for (std::size_t s = 0; s < 5; ++s) {
        train_step(fast, a, data.batch(s * 20, 20, s * 20));
        train_step(exact, b, data.batch(s * 20, 20, s * 20), kReproducible);
    }
    CHECK(max_relative_difference(parameters(fast), parameters(exact)) < 1e-4);
}

TEST_CASE("Fixed-point sums do not depend on order", "[cpu][reproducible]")
{
    std::vector<float> terms(1000);
    for (std::size_t i = 0; i < terms.size(); ++i)
        terms[i] = (core::random_uniform(3, core::Stream::synthetic, 0, 0, std::uint32_t(i)) - 0.5f) * std::pow(10.0f, float(i % 7) - 4.0f);
    std::int64_t forward = 0, backward = 0;
    for (std::size_t i = 0; i < terms.size(); ++i) core::add_fixed(&terms[i], &forward, 1);
    for (std::size_t i = terms.size(); i-- > 0;) core::add_fixed(&terms[i], &backward, 1);
    CHECK(forward == backward);
    float big = 1e7f;
    std::int64_t acc = 0;
    CHECK_THROWS_AS(core::add_fixed(&big, &acc, 1), Error);
}

// add_fixed takes blocks of terms below 2^11 by a double's rounding addition (core/fixed_point.hpp)
// and the others one term at a time: both give to_fixed's integers, ties to even included;
// add_fixed_rows gives the sum of one add_fixed a row.
TEST_CASE("Fixed-point sums: every path gives to_fixed's integers", "[cpu][reproducible]")
{
    const float ulp = std::ldexp(1.0f, -40);   // the fixed point's resolution
    // Row 0: terms of magnitudes 2^-60 .. 2^21, either sign, and edge cases (every block has a large
    // term: the one-at-a-time path). Row 1: the same below 1000 (the fast path).
    std::vector<float> large = {0.0f, -0.0f, 0.5f * ulp, 1.5f * ulp, 2.5f * ulp, -0.5f * ulp, -1.5f * ulp, -2.5f * ulp,
                                0.49f * ulp, 1e-30f, -1e-30f, 1e-45f, 2047.999f, -2047.999f, 2048.0f, -2048.0f,
                                3000.5f, -4e6f, std::ldexp(1.0f, 21)};
    for (std::size_t i = 0; large.size() < 3001; ++i) {
        const float u = core::random_uniform(5, core::Stream::synthetic, 0, 0, std::uint32_t(i));
        const float e = core::random_uniform(5, core::Stream::synthetic, 0, 1, std::uint32_t(i));
        large.push_back((u < 0.5f ? -1.0f : 1.0f) * std::ldexp(1.0f + u, int(e * 81.0f) - 60));
        if (i % 5 == 0) large.push_back((i % 2 ? -1.0f : 1.0f) * std::ldexp(float(2 * (i % 999) + 1) * 0.5f, -40));   // a tie
    }
    const std::size_t n = large.size();
    std::vector<float> rows(2 * n);
    std::copy(large.begin(), large.end(), rows.begin());
    for (std::size_t i = 0; i < n; ++i) rows[n + i] = std::fmod(large[i], 1000.0f);
    std::vector<std::int64_t> expected(2 * n, 7);   // to_fixed, term by term, added to 7
    std::size_t refused = 0;
    for (std::size_t i = 0; i < 2 * n; ++i) {
        std::int64_t v = 0;
        refused += !core::to_fixed(rows[i], v);
        expected[i] += v;
    }
    REQUIRE(refused == 0);
    std::vector<std::int64_t> each(2 * n, 7);
    core::add_fixed(rows.data(), each.data(), 2 * n);
    CHECK(each == expected);
    std::vector<std::int64_t> summed(n, 14), expected_sum(n);
    for (std::size_t i = 0; i < n; ++i) expected_sum[i] = expected[i] + expected[n + i];
    core::add_fixed_rows(rows.data(), 2, n, summed.data(), n);
    CHECK(summed == expected_sum);
    // Back to floats: from_fixed's, for sums below 2^51 (the fast path) and above (term by term).
    for (const auto* sums : {&expected, &expected_sum}) {
        std::vector<float> back(sums->size()), each_back(sums->size());
        core::fixed_to_float(sums->data(), back.data(), sums->size());
        for (std::size_t i = 0; i < sums->size(); ++i) each_back[i] = core::from_fixed((*sums)[i]);
        CHECK(std::memcmp(back.data(), each_back.data(), back.size() * sizeof(float)) == 0);
    }
    std::vector<std::int64_t> small(n);
    for (std::size_t i = 0; i < n; ++i) small[i] = expected[n + i];   // every block below 2^51
    std::vector<float> back(n), each_back(n);
    core::fixed_to_float(small.data(), back.data(), n);
    for (std::size_t i = 0; i < n; ++i) each_back[i] = core::from_fixed(small[i]);
    CHECK(std::memcmp(back.data(), each_back.data(), n * sizeof(float)) == 0);
    // Out of range or NaN, in a block of small terms: thrown, as to_fixed refuses it.
    for (float bad : {std::ldexp(1.0f, 22), -std::ldexp(1.0f, 23), std::numeric_limits<float>::quiet_NaN(),
                      std::numeric_limits<float>::infinity()}) {
        rows[n + 300] = bad;
        std::vector<std::int64_t> acc(n);
        CHECK_THROWS_AS(core::add_fixed_rows(rows.data(), 2, n, acc.data(), n), core::FixedRangeError);
        CHECK_THROWS_AS(core::add_fixed(rows.data() + n, acc.data(), n), core::FixedRangeError);
    }
}

} // namespace test_reproducible
