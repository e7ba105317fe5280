// Dynamic loss scaling (train/loss_scale.hpp): skipped overflows, growth, equality with the unscaled
// run in every step mode, accumulation windows, checkpoints, DataParallel's decisions, the Trainer's
// option and History, and the option checks.

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "catch.hpp"
#include "models.hpp"
#include "replica/data/synthetic.hpp"
#include "replica/replica.hpp"
#include "replica/train/trainer.hpp"
#include "support.hpp"

// The runner compiles the test files in groups (tests/meson.build): this file's names stay in its own
// namespace.
namespace test_loss_scale {

using namespace replica;
using namespace replica::testing;

namespace {

using Net = FusedMlpNet;   // Linear and ReLU only: a large input gives a large gradient, nothing saturates

// Batches of 9 samples; the second constructor's inputs are multiplied by `gain`.
struct Data {
    RandomBatches<Net> plain{72, 5};
    RandomBatches<Net> loud{72, 5};
    explicit Data(float gain = 1.0f)
    {
        for (float& v : loud.inputs) v *= gain;
    }
    Batch batch(std::size_t s) const { return plain.batch(s * 9, 9, s * 9); }
    Batch loud_batch(std::size_t s) const { return loud.batch(s * 9, 9, s * 9); }
};

constexpr float kHuge = 0x1p127f;   // a scale at which any gradient above 2 overflows

} // namespace

TEST_CASE("An overflowing step is skipped: parameters, Adam's state and step count unchanged, the scale halved",
          "[cpu][loss_scale]")
{
    const Data data(100.0f);
    Net net{Device::cpu(), 1};
    LossScale opt{Adam{{.lr = 0.01f}}, {.init_scale = 1024.0f, .growth_interval = 100}};
    train_step(net, opt, data.batch(0));   // a clean step: Adam's state is not zero
    REQUIRE(!opt.skipped_last());
    REQUIRE(opt.wrapped().step_count() == 1);
    const auto w = parameters(net);
    const auto state = net.optimizer_state();
    REQUIRE(!state.empty());

    opt.set_scale_state({.scale = kHuge, .clean_steps = 0, .skipped_steps = 0});
    const float loss = train_step(net, opt, data.loud_batch(1));
    CHECK(std::isfinite(loss));   // the loss is not scaled; the gradient overflowed
    CHECK(opt.skipped_last());
    CHECK(opt.skipped_steps() == 1);
    CHECK(opt.scale() == kHuge / 2);
    CHECK(opt.scale_state().clean_steps == 0);
    CHECK(opt.wrapped().step_count() == 1);
    CHECK(differences(parameters(net), w) == "");
    CHECK(differences(net.optimizer_state(), state) == "");

    // The fast mode: the same, and the step queued ahead (at the old scale) is computed again.
    opt.set_scale_state({.scale = kHuge, .clean_steps = 0, .skipped_steps = 0});
    const Batch next = data.batch(3);
    train_step(net, opt, data.loud_batch(2), {}, &next);
    CHECK(opt.skipped_last());
    CHECK(opt.scale() == kHuge / 2);
    CHECK(differences(parameters(net), w) == "");
    opt.set_scale_state({.scale = 1024.0f, .clean_steps = 0, .skipped_steps = 0});
    train_step(net, opt, next);
    CHECK(!opt.skipped_last());
    CHECK(opt.wrapped().step_count() == 2);
    CHECK(differences(parameters(net), w) != "");
}

TEST_CASE("The scale grows after growth_interval clean steps and backs off on an overflow", "[cpu][loss_scale]")
{
    const Data data(100.0f);
    Net net{Device::cpu(), 2};
    LossScale opt{SGD{{.lr = 0.01f}}, {.init_scale = 8.0f, .growth_factor = 4.0f, .backoff_factor = 0.25f,
                                       .growth_interval = 3}};
    CHECK(opt.loss_scale() == 8.0f);
    for (std::size_t s = 0; s < 2; ++s) train_step(net, opt, data.batch(s));
    CHECK(opt.scale() == 8.0f);
    CHECK(opt.scale_state().clean_steps == 2);
    train_step(net, opt, data.batch(2));
    CHECK(opt.scale() == 32.0f);
    CHECK(opt.scale_state().clean_steps == 0);
    train_step(net, opt, data.batch(3));
    CHECK(opt.scale_state().clean_steps == 1);

    opt.set_scale_state({.scale = kHuge, .clean_steps = 2, .skipped_steps = 0});
    train_step(net, opt, data.loud_batch(4));
    CHECK(opt.skipped_last());
    CHECK(opt.scale() == kHuge / 4);
    CHECK(opt.scale_state().clean_steps == 0);   // the run of clean steps starts again

    // A scale that would grow past the largest float stays.
    opt.set_scale_state({.scale = kHuge, .clean_steps = 2, .skipped_steps = 1});
    train_step(net, opt, data.batch(5));
    CHECK(!opt.skipped_last());
    CHECK(opt.scale() == kHuge);
    CHECK(opt.scale_state().clean_steps == 0);
}

TEST_CASE("With nothing overflowing, a scaled run equals the unscaled one: plain, fast, reproducible, clipped, "
          "accumulated",
          "[cpu][loss_scale]")
{
    const Data data;
    // The scale is a power of two: the gradient is the unscaled one times it exactly, and the division
    // gives it back exactly, so these runs agree bit for bit. The reproducible mode sums in fixed point
    // (2^-40), which resolves the scaled gradient more finely: float noise there.
    const AdamOptions adam{.lr = 0.01f, .weight_decay = 1e-3f};
    SECTION("plain and fast")
    {
        for (bool fast : {false, true}) {
            Net a{Device::cpu(), 3}, b{Device::cpu(), 3};
            Adam plain{adam};
            LossScale scaled{Adam{adam}};
            for (std::size_t s = 0; s < 6; ++s) {
                const Batch next = data.batch(s + 1);
                const float la = train_step(a, plain, data.batch(s), {}, fast ? &next : nullptr);
                const float lb = train_step(b, scaled, data.batch(s), {}, fast ? &next : nullptr);
                CHECK(la == lb);
            }
            CHECK(scaled.skipped_steps() == 0);
            CHECK(scaled.wrapped().step_count() == 6);
            CHECK(differences(parameters(a), parameters(b)) == "");
            CHECK(differences(a.optimizer_state(), b.optimizer_state()) == "");
        }
    }
    SECTION("reproducible")
    {
        Net a{Device::cpu(), 3}, b{Device::cpu(), 3};
        Adam plain{adam};
        LossScale scaled{Adam{adam}, {.init_scale = 1024.0f}};
        for (std::size_t s = 0; s < 6; ++s) {
            train_step(a, plain, data.batch(s), kReproducible);
            train_step(b, scaled, data.batch(s), kReproducible);
        }
        CHECK(scaled.skipped_steps() == 0);
        CHECK(max_relative_difference(parameters(a), parameters(b)) < 1e-5);
    }
    SECTION("reproducible: a term beyond the exact sum's range is an overflow")
    {
        Net b{Device::cpu(), 3};
        LossScale scaled{Adam{adam}, {.init_scale = 0x1p40f}};
        const auto w = parameters(b);
        const float loss = train_step(b, scaled, data.batch(0), kReproducible);
        CHECK(std::isnan(loss));
        CHECK(scaled.skipped_last());
        CHECK(scaled.scale() == 0x1p39f);
        CHECK(scaled.wrapped().step_count() == 0);
        CHECK(differences(parameters(b), w) == "");
        while (scaled.skipped_last()) train_step(b, scaled, data.batch(1), kReproducible);   // backs off until it fits
        CHECK(scaled.scale() < 0x1p39f);
        CHECK(differences(parameters(b), w) != "");
    }
    SECTION("clipped after unscaling")
    {
        Net a{Device::cpu(), 3}, b{Device::cpu(), 3};
        ClipGradNorm plain{SGD{{.lr = 0.5f}}, 0.05f};
        LossScale scaled{ClipGradNorm{SGD{{.lr = 0.5f}}, 0.05f}};
        for (std::size_t s = 0; s < 4; ++s) {
            train_step(a, plain, data.batch(s));
            train_step(b, scaled, data.batch(s));
        }
        CHECK(differences(parameters(a), parameters(b)) == "");
    }
    SECTION("accumulated")
    {
        Net a{Device::cpu(), 3}, b{Device::cpu(), 3};
        Accumulate plain{AdamW{{.lr = 0.01f}}, 3};
        LossScale scaled{Accumulate{AdamW{{.lr = 0.01f}}, 3}, {.growth_interval = 1}};
        for (std::size_t s = 0; s < 6; ++s) {
            train_step(a, plain, data.batch(s));
            train_step(b, scaled, data.batch(s));
            CHECK(scaled.scale() == (s < 2 ? 65536.0f : s < 5 ? 131072.0f : 262144.0f));   // once a window
        }
        CHECK(scaled.wrapped().wrapped().step_count() == 2);
        CHECK(max_relative_difference(parameters(a), parameters(b)) < 1e-6);
    }
}

TEST_CASE("An overflow in an accumulation window skips the window's update and drops its sum", "[cpu][loss_scale]")
{
    const Data data(100.0f);
    Net net{Device::cpu(), 4}, reference{Device::cpu(), 4};
    LossScale opt{Accumulate{AdamW{{.lr = 0.01f}}, 3}, {.init_scale = 1024.0f}};
    Accumulate plain{AdamW{{.lr = 0.01f}}, 3};
    for (std::size_t s = 0; s < 3; ++s) train_step(net, opt, data.batch(s));   // one clean window
    for (std::size_t s = 0; s < 3; ++s) train_step(reference, plain, data.batch(s));
    const auto w = parameters(net);

    opt.set_scale_state({.scale = kHuge, .clean_steps = 0, .skipped_steps = 0});
    train_step(net, opt, data.batch(3));
    train_step(net, opt, data.loud_batch(4));   // overflows
    CHECK(!opt.skipped_last());                 // not decided before the window's end
    CHECK(opt.scale() == kHuge);
    train_step(net, opt, data.batch(5));
    CHECK(opt.skipped_last());
    CHECK(opt.skipped_steps() == 1);
    CHECK(opt.scale() == kHuge / 2);
    CHECK(opt.wrapped().step_count() == 6);
    CHECK(opt.wrapped().wrapped().step_count() == 1);
    CHECK(differences(parameters(net), w) == "");

    // The next window starts from an empty sum: as the unscaled run's window over the same batches.
    opt.set_scale_state({.scale = 1024.0f, .clean_steps = 0, .skipped_steps = 1});
    plain.set_step_count(6);
    plain.wrapped().set_step_count(1);
    for (std::size_t s = 6; s < 9; ++s) {
        train_step(net, opt, data.batch(s - 6));
        train_step(reference, plain, data.batch(s - 6));
    }
    CHECK(opt.wrapped().wrapped().step_count() == 2);
    CHECK(max_relative_difference(parameters(net), parameters(reference)) < 1e-6);
}

TEST_CASE("A checkpoint keeps the scaler's state; one without it loads with the defaults", "[cpu][loss_scale][checkpoint]")
{
    TempDir dir;
    const Data data;
    Net net{Device::cpu(), 5};
    LossScale opt{Adam{{.lr = 0.01f}}, {.init_scale = 512.0f}};
    train_step(net, opt, data.batch(0));
    opt.set_scale_state({.scale = 2048.0f, .clean_steps = 17, .skipped_steps = 3});
    save_checkpoint(dir / "scaled.ckpt", net, {.epoch = 0, .step = 1, .seed = 1}, opt);

    Net loaded{Device::cpu(), 6};
    LossScale again{Adam{{.lr = 0.01f}}, {.init_scale = 512.0f}};
    const CheckpointState s = load_checkpoint(dir / "scaled.ckpt", loaded, again);
    REQUIRE(s.loss_scale.has_value());
    CHECK(*s.loss_scale == opt.scale_state());
    CHECK(again.scale_state() == opt.scale_state());
    CHECK(again.wrapped().step_count() == 1);
    CHECK(parameters(loaded) == parameters(net));

    // The same file into a plain Adam: the scaler's state is not its business.
    Adam adam{{.lr = 0.01f}};
    Net plain_loaded{Device::cpu(), 7};
    load_checkpoint(dir / "scaled.ckpt", plain_loaded, adam);
    CHECK(adam.step_count() == 1);

    // A checkpoint without it (a plain Adam's, format version 2) loads into a LossScale as a new run's.
    save_checkpoint(dir / "plain.ckpt", net, {.epoch = 0, .step = 1, .seed = 1}, adam);
    LossScale fresh{Adam{{.lr = 0.01f}}, {.init_scale = 256.0f}};
    fresh.set_scale_state({.scale = 4.0f, .clean_steps = 1, .skipped_steps = 1});
    const CheckpointState p = load_checkpoint(dir / "plain.ckpt", loaded, fresh);
    CHECK(!p.loss_scale.has_value());
    CHECK(fresh.scale_state() == LossScaleState{.scale = 256.0f, .clean_steps = 0, .skipped_steps = 0});

    // A forged scale is refused.
    REQUIRE_THROWS_WITH(save_checkpoint(dir / "bad.ckpt", net,
                                        {.loss_scale = LossScaleState{.scale = -1.0f}}),
                        Catch::Contains("loss scale must be finite and > 0"));
}

TEST_CASE("DataParallel over 2 Threaded CPU replicas takes the same decisions as one model", "[cpu][loss_scale][parallel]")
{
    const Data data(100.0f);
    Net one{Device::cpu(), 8};
    DataParallel<Net, Threaded> two{cpus(2), 8};
    REQUIRE(parameters(one) == parameters(two));
    const LossScaleOptions o{.init_scale = 0x1p126f, .growth_interval = 3};
    LossScale a{Adam{{.lr = 0.01f}}, o}, b{Adam{{.lr = 0.01f}}, o};
    std::vector<bool> skipped_one, skipped_two;
    for (std::size_t s = 0; s < 8; ++s) {
        const Batch batch = s % 2 ? data.loud_batch(s) : data.batch(s);
        train_step(one, a, batch);
        train_step(two, b, batch);
        skipped_one.push_back(a.skipped_last());
        skipped_two.push_back(b.skipped_last());
        CHECK(a.scale() == b.scale());
    }
    CHECK(skipped_one == skipped_two);
    CHECK(a.skipped_steps() >= 1);
    CHECK(a.skipped_steps() < 8);
    CHECK(a.wrapped().step_count() == b.wrapped().step_count());
    // The replicas sum the per-sample gradients in another order (about 1e-7 relative), which Adam's
    // normalised steps carry to about 1e-5 here; one update made or skipped differently moves
    // parameters by about lr, 1e-2.
    CHECK(max_relative_difference(parameters(one), parameters(two)) < 1e-4);
    CHECK(differences(parameters(two.replica(1)), parameters(two)) == "");

    // The reproducible mode: a term beyond the exact sum's range, found on a replica's thread, is an
    // overflow for the whole model too.
    const auto w = parameters(two);
    b.set_scale_state({.scale = 0x1p40f});
    CHECK(std::isnan(train_step(two, b, data.batch(0), kReproducible)));
    CHECK(b.skipped_last());
    CHECK(b.scale() == 0x1p39f);
    CHECK(differences(parameters(two), w) == "");
    b.set_scale_state({.scale = 1.0f});
    train_step(two, b, data.batch(1), kReproducible);   // and the model trains on
    CHECK(!b.skipped_last());
    CHECK(differences(parameters(two), w) != "");
}

TEST_CASE("The Trainer's loss_scale option: skips and the scale in History and the epoch line", "[cpu][loss_scale][train]")
{
    auto set = data::synthetic_dataset(48, Net::input_shape::size, 1, 5, 9);
    for (float& v : set.inputs) v *= 100.0f;
    std::ostringstream log;
    TrainOptions options{.batch_size = 12, .epochs = 2, .seed = 3, .progress = false, .log = &log};
    options.loss_scale = LossScaleOptions{.init_scale = kHuge, .growth_interval = 1000};
    Net net{Device::cpu(), 9};
    Adam adam{{.lr = 0.01f}};
    const History h = Trainer{net, adam, options}.fit(set);
    REQUIRE(h.epochs.size() == 2);
    CHECK(h.epochs[0].scale_skipped_steps >= 1);
    CHECK(h.scale_skipped_steps == h.epochs[0].scale_skipped_steps + h.epochs[1].scale_skipped_steps);
    CHECK(h.scale_skipped_steps < 8);
    CHECK(h.epochs[1].loss_scale == double(kHuge) / std::pow(2.0, double(h.scale_skipped_steps)));
    CHECK(adam.step_count() == 8 - h.scale_skipped_steps);   // the caller's optimizer, wrapped for the run
    CHECK(log.str().find("skipped") != std::string::npos);
    CHECK(h.skipped_steps == 0);

    // A run resumed from its checkpoint goes on with the scale it had, as if never stopped.
    {
        TempDir dir;
        TrainOptions straight = options, first = options, second = options;
        straight.epochs = second.epochs = 3;
        straight.log = first.log = second.log = nullptr;
        first.checkpoint = second.checkpoint = dir / "scaled.ckpt";
        second.resume = true;
        Net a{Device::cpu(), 9}, b{Device::cpu(), 9}, c{Device::cpu(), 1};
        Adam oa{{.lr = 0.01f}}, ob{{.lr = 0.01f}}, oc{{.lr = 0.01f}};
        const History whole = Trainer{a, oa, straight}.fit(set);
        Trainer{b, ob, first}.fit(set);
        const History resumed = Trainer{c, oc, second}.fit(set);
        CHECK(resumed.scale_skipped_steps == 0);   // the skips were the first epoch's
        CHECK(resumed.epochs[2].loss_scale == whole.epochs[2].loss_scale);
        CHECK(oc.step_count() == oa.step_count());
        CHECK(differences(parameters(c), parameters(a)) == "");
    }

    // Without it, no scale in the line.
    std::ostringstream quiet;
    options.loss_scale.reset();
    options.log = &quiet;
    Net other{Device::cpu(), 9};
    Adam adam2{{.lr = 0.01f}};
    const History h2 = Trainer{other, adam2, options}.fit(set);
    CHECK(h2.epochs[1].loss_scale == 0.0);
    CHECK(quiet.str().find("scale") == std::string::npos);

    // Both ways at once is refused.
    LossScale scaled{Adam{{.lr = 0.01f}}};
    options.loss_scale = LossScaleOptions{};
    CHECK(error_message([&] { Trainer{other, scaled, options}.fit(set); }).find("set the options in one place") !=
          std::string::npos);
}

TEST_CASE("LossScale refuses options out of range, saying the range", "[cpu][loss_scale]")
{
    auto message = [](LossScaleOptions o) { return error_message([&] { LossScale s{SGD{}, o}; }); };
    CHECK(message({.growth_factor = 1.0f}).find("growth_factor must be > 1") != std::string::npos);
    CHECK(message({.backoff_factor = 1.0f}).find("backoff_factor must be in (0, 1)") != std::string::npos);
    CHECK(message({.backoff_factor = 0.0f}).find("backoff_factor must be in (0, 1)") != std::string::npos);
    CHECK(message({.init_scale = 0.0f}).find("init_scale must be a finite number > 0") != std::string::npos);
    CHECK(message({.init_scale = INFINITY}).find("init_scale must be a finite number > 0") != std::string::npos);
    CHECK(message({.growth_interval = 0}).find("growth_interval must be at least 1") != std::string::npos);
    CHECK(message({}) == "no error");
    LossScale s{SGD{}};
    CHECK(error_message([&] { s.set_scale_state({.scale = NAN}); }).find("scale must be a finite number > 0") !=
          std::string::npos);

    // Disabled: the wrapped optimizer alone, no scale on the loss.
    const Data data;
    Net a{Device::cpu(), 10}, b{Device::cpu(), 10};
    SGD plain{{.lr = 0.1f}};
    LossScale off{SGD{{.lr = 0.1f}}, {.enabled = false}};
    CHECK(off.loss_scale() == 1.0f);
    train_step(a, plain, data.batch(0));
    train_step(b, off, data.batch(0));
    CHECK(differences(parameters(a), parameters(b)) == "");
}

} // namespace test_loss_scale
