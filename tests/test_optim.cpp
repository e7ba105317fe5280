// Optimizers and schedules: Adam and AdamW against a float64 reference of PyTorch's rule and against
// PyTorch itself (tests/pytorch/*.txt, written by tests/pytorch/make_fixtures.py), the step count's
// contract under DataParallel, warm-up and cosine schedules; and the new activations against PyTorch.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <numbers>
#include <span>
#include <string>
#include <vector>

#include "catch.hpp"
#include "fixtures.hpp"
#include "models.hpp"
#include "replica/replica.hpp"
#include "replica/train/trainer.hpp"
#include "support.hpp"

// The runner compiles the test files in groups (tests/meson.build): this file's names stay in its own
// namespace.
namespace test_optim {

using namespace replica;
using namespace replica::testing;

namespace {

// A float64 reference of torch.optim.Adam / AdamW, `steps` updates with the same gradient.
std::vector<double> adam_reference(std::vector<double> w, const std::vector<float>& g, int steps, double lr, double b1,
                                   double b2, double eps, double wd, bool decoupled)
{
    std::vector<double> m(w.size(), 0.0), v(w.size(), 0.0);
    for (int t = 1; t <= steps; ++t)
        for (std::size_t i = 0; i < w.size(); ++i) {
            double gi = g[i];
            if (decoupled) w[i] *= 1.0 - lr * wd;
            else gi += wd * w[i];
            m[i] = b1 * m[i] + (1.0 - b1) * gi;
            v[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
            const double mh = m[i] / (1.0 - std::pow(b1, t)), vh = v[i] / (1.0 - std::pow(b2, t));
            w[i] -= lr * mh / (std::sqrt(vh) + eps);
        }
    return w;
}

// The fixtures' model (fixtures.hpp) with its first two layers in a nested DataParallel (the same
// parameter layout): the optimizer is then applied slice by slice, on three replicas.
using TorchNetNested = Sequential<ParamRule<DecayAll>, Input<8>, DataParallel<Sequential<Input<8>, Linear<16>, GELU>, Threaded>, Linear<12>,
                                  Tanh, Linear<10>, Sigmoid, Linear<4>>;
static_assert(TorchNet::param_count == 522 && TorchNetNested::param_count == 522);

const std::vector<Device> kThreeCpus{Device::cpu(0), Device::cpu(1), Device::cpu(2)};

} // namespace

TEST_CASE("Adam and AdamW follow PyTorch's update rule", "[cpu][optim]")
{
    const std::vector<float> g{0.3f, -0.1f, 2.0f, 1e-4f, 0.0f};
    const std::vector<double> w0{1.0, -2.0, 0.5, 0.25, -0.75};
    for (bool decoupled : {false, true}) {
        CAPTURE(decoupled);
        backend::cpu::Context ctx;
        std::vector<float> w(w0.begin(), w0.end()), state(2 * w.size(), 0.0f);
        auto run = [&](auto opt) {
            for (int t = 0; t < 4; ++t) {
                opt.begin_update();
                const ParamSegment all = core::whole_slice(w.size());
                opt.apply(ctx, w.data(), g.data(), state.data(), {&all, 1});
            }
            CHECK(opt.step_count() == 4);
        };
        if (decoupled) run(AdamW{{.lr = 0.1f, .beta1 = 0.8f, .beta2 = 0.99f, .eps = 1e-3f, .weight_decay = 0.05f}});
        else run(Adam{{.lr = 0.1f, .beta1 = 0.8f, .beta2 = 0.99f, .eps = 1e-3f, .weight_decay = 0.05f}});
        const auto want = adam_reference(w0, g, 4, 0.1, 0.8, 0.99, 1e-3, 0.05, decoupled);
        for (std::size_t i = 0; i < w.size(); ++i) {
            CAPTURE(i);
            CHECK(std::abs(w[i] - want[i]) < 2e-6 * std::max(1.0, std::abs(want[i])));
        }
    }
}

TEST_CASE("Adam and AdamW refuse bad options and an update without begin_update", "[cpu][optim]")
{
    CHECK_THROWS_WITH(Adam({.lr = 0.0f}), Catch::Contains("Adam learning rate must be > 0"));
    CHECK_THROWS_WITH(AdamW({.beta1 = 1.0f}), Catch::Contains("AdamW beta1 must be in [0, 1)"));
    CHECK_THROWS_WITH(Adam({.beta2 = -0.1f}), Catch::Contains("Adam beta2 must be in [0, 1)"));
    CHECK_THROWS_WITH(Adam({.eps = 0.0f}), Catch::Contains("Adam eps must be > 0"));
    CHECK_THROWS_WITH(AdamW({.weight_decay = -1.0f}), Catch::Contains("AdamW weight decay must be >= 0"));
    CHECK(AdamW{}.options().weight_decay == 1e-2f);   // PyTorch's defaults
    CHECK(Adam{}.options().weight_decay == 0.0f);
    backend::cpu::Context ctx;
    float w = 1.0f, g = 1.0f, s[2] = {0.0f, 0.0f};
    Adam opt;
    const ParamSegment one = core::whole_slice(1);
    CHECK_THROWS_WITH(opt.apply(ctx, &w, &g, s, {&one, 1}), Catch::Contains("before begin_update()"));
}

TEST_CASE("Activations match PyTorch's forward and input gradient", "[cpu][optim][layers]")
{
    const auto f = read_fixture("activations.txt");
    const std::vector<float> x = to_float(f.at("x")), dy = to_float(f.at("dy"));
    REQUIRE(x.size() == 41);
    using In = Shape<41>;
    const Device cpu[] = {Device::cpu()};
    backend::cpu::Context ctx;
    auto check = [&]<class L>(L, const std::string& name) {
        INFO(name);
        typename L::template op<In> op{model::Build{.layer_id = 0, .devices = cpu}};
        std::vector<float> y(41, NAN), dx(41, NAN);
        op.forward(ctx, model::Pass{}, model::ForwardArgs<>{.params = nullptr, .weights = nullptr, .x = x.data(),
                                                          .y = y.data(), .n = 1, .saved = nullptr, .kept = nullptr,
                                                          .scratch = nullptr});
        op.backward(ctx, model::Pass{}, model::BackwardArgs<>{.params = nullptr, .weights = nullptr, .x = x.data(),
                                                            .y = y.data(), .dy = dy.data(), .dx = dx.data(),
                                                            .dparams = nullptr, .n = 1, .saved = nullptr,
                                                            .kept = nullptr, .scratch = nullptr});
        // Float rounding of the libm functions: a few ulp of values of magnitude <= 5.
        CHECK(max_error(y, f.at(name + "_y")) < 2e-6);
        CHECK(max_error(dx, f.at(name + "_dx")) < 2e-6);
    };
    check(Identity{}, "identity");
    check(Sigmoid{}, "sigmoid");
    check(Tanh{}, "tanh");
    check(GELU{}, "gelu");
}

TEST_CASE("Adam and AdamW equal PyTorch's after 5 steps, on one replica, on three, and nested", "[cpu][optim]")
{
    for (const std::string kind : {"adam", "adamw"}) {
        INFO(kind);
        const auto f = read_fixture(kind + ".txt");
        auto check = [&](auto& net, const char* what) {
            INFO(what);
            std::vector<float> losses;
            if (kind == "adam") {
                auto opt = fixture_optimizer<Adam>(f.at("hyper"));
                losses = train_fixture(net, opt, f);
                CHECK(opt.step_count() == 5);
            } else {
                auto opt = fixture_optimizer<AdamW>(f.at("hyper"));
                losses = train_fixture(net, opt, f);
                CHECK(opt.step_count() == 5);
            }
            CHECK(max_error(losses, f.at("losses")) < kTorchTolerance);
            CHECK(max_error(parameters(net), f.at("final")) < kTorchTolerance);
        };
        TorchNet one{Device::cpu()};
        check(one, "one replica");
        DataParallel<TorchNet, Threaded> three{kThreeCpus};
        check(three, "DataParallel over 3 CPU replicas");
        TorchNetNested nested{kThreeCpus};
        check(nested, "a nested DataParallel over 3 CPU replicas");
    }
}

TEST_CASE("Cosine decay and warm-up give exact rates", "[cpu][optim][schedule]")
{
    const Schedule c = Schedule::cosine(10, 0.001);
    const double b = 0.1f;   // the base rate as the schedule sees it
    CHECK(c.lr(0.1f, 0.0) == 0.1f);
    CHECK(c.lr(0.1f, 5.0) == float(0.001 + (b - 0.001) * 0.5));
    CHECK(c.lr(0.1f, 2.5) == float(0.001 + (b - 0.001) * 0.5 * (1.0 + std::cos(std::numbers::pi / 4))));
    CHECK(c.lr(0.1f, 10.0) == 0.001f);
    CHECK(c.lr(0.1f, 14.0) == 0.001f);   // stays at the floor
    CHECK(Schedule::cosine(4).lr(1.0f, 4.0) == 0.0f);

    // Warm-up multiplies whichever schedule by a factor rising from start_factor to 1.
    const Schedule w = Schedule::cosine(10).with_warmup(2);
    CHECK(w.lr(0.1f, 0.0) == 0.0f);
    CHECK(w.lr(0.1f, 0.5) == float(0.25 * (b * 0.5 * (1.0 + std::cos(std::numbers::pi * 0.05)))));
    CHECK(w.lr(0.1f, 2.0) == float(b * 0.5 * (1.0 + std::cos(std::numbers::pi * 0.2))));
    CHECK(w.warmup_epochs() == 2.0);
    const Schedule fixed = Schedule::fixed().with_warmup(0.5, 0.2);
    CHECK(fixed.lr(1.0f, 0.0) == 0.2f);
    CHECK(fixed.lr(1.0f, 0.25) == 0.6f);
    CHECK(fixed.lr(1.0f, 0.5) == 1.0f);
    CHECK(fixed.lr(1.0f, 3.0) == 1.0f);
    CHECK(Schedule::step(2, 0.5).with_warmup(1).lr(0.1f, 0.5) == float(0.5 * double(0.1f)));
    CHECK(Schedule::step(2, 0.5).with_warmup(1).lr(0.1f, 3.0) == float(0.5 * double(0.1f)));
    CHECK(Schedule::exponential(0.5).with_warmup(4).lr(1.0f, 2.0) == 0.125f);
    CHECK(Schedule::polynomial(1, 10).with_warmup(5).lr(1.0f, 1.0) == float(0.2 * 0.9));

    CHECK_THROWS_WITH(Schedule::cosine(0), Catch::Contains("cosine schedule"));
    CHECK_THROWS_WITH(Schedule::cosine(10, -1), Catch::Contains("min_lr must be >= 0"));
    CHECK_THROWS_WITH(Schedule::fixed().with_warmup(0), Catch::Contains("warm-up: it must last > 0 epochs"));
    CHECK_THROWS_WITH(Schedule::fixed().with_warmup(1, 1.0), Catch::Contains("start_factor must be in [0, 1)"));
}

// ---- optimizer state and model statistics in checkpoints ----

namespace {

// A model with statistics (the members BatchNorm's models have), to test their checkpoint section.
struct StatsNet : TorchNet {
    using TorchNet::TorchNet;
    static constexpr std::size_t statistics_count = 3;
    std::vector<float> stats{0.5f, -1.25f, 3.0f};
    std::vector<float> statistics() const { return stats; }
    void set_statistics(std::span<const float> s)
    {
        core::require(s.size() == statistics_count, "StatsNet::set_statistics: wrong count");
        stats.assign(s.begin(), s.end());
    }
};
static_assert(train::HasStatistics<StatsNet> && train::statistics_count_of<TorchNet>() == 0);

// Writes bytes with their last four replaced by the right CRC-32: a file whose checksum holds.
void write_sealed(const std::filesystem::path& p, std::vector<unsigned char> b)
{
    const std::uint32_t crc = train::detail::crc32_of(b.data(), b.size() - 4);
    for (int i = 0; i < 4; ++i) b[b.size() - 4 + i] = static_cast<unsigned char>(crc >> (8 * i));
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
    REQUIRE(out.good());
}

template <class F>
std::string error_of(F&& f)
{
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "(no replica::Error was thrown)";
}

// Three steps of opt on TorchNet from the AdamW fixture's start.
template <class Opt>
TorchNet trained(Opt& opt, std::size_t steps = 3)
{
    const auto f = read_fixture("adamw.txt");
    TorchNet net{Device::cpu()};
    net.set_parameters(to_float(f.at("initial")));
    const std::vector<float> inputs = to_float(f.at("inputs"));
    std::vector<std::int32_t> labels(f.at("labels").begin(), f.at("labels").end());
    for (std::size_t s = 0; s < steps; ++s)
        train_step(net, opt, Batch{inputs.data() + s * 48, labels.data() + s * 6, 6, s * 6, 1});
    return net;
}

} // namespace

TEST_CASE("A checkpoint keeps Adam's moments and step count, and resuming equals training straight through",
          "[cpu][optim][checkpoint]")
{
    testing::TempDir dir;
    const auto set = data::synthetic_dataset(60, 8, 1, 4, 3);
    const TrainOptions base{.batch_size = 12, .epochs = 3, .seed = 5, .progress = false, .log = nullptr};
    const AdamWOptions o{.lr = 0.01f, .weight_decay = 0.05f};

    TorchNet straight{Device::cpu()};
    AdamW opt1{o};
    Trainer{straight, opt1, base}.fit(set);
    CHECK(opt1.step_count() == 15);

    TrainOptions first = base;
    first.epochs = 2;
    first.checkpoint = dir / "run.ckpt";
    TorchNet part{Device::cpu()};
    AdamW opt2{o};
    Trainer{part, opt2, first}.fit(set);

    // What the file holds: the optimizer named, its step count, two moments a parameter.
    TorchNet loaded{Device::cpu(), 9};
    AdamW opt_loaded{o};
    const CheckpointState s = load_checkpoint(dir / "run.ckpt", loaded, opt_loaded);
    CHECK(s.optimizer == 3);
    CHECK(s.optimizer_steps == 10);
    CHECK(opt_loaded.step_count() == 10);
    CHECK(loaded.optimizer_state() == part.optimizer_state());
    CHECK(loaded.optimizer_state().size() == 2 * TorchNet::param_count);

    TrainOptions second = base;
    second.checkpoint = dir / "run.ckpt";
    second.resume = true;
    TorchNet resumed{Device::cpu(), 99};
    AdamW opt3{o};
    Trainer{resumed, opt3, second}.fit(set);
    CHECK(opt3.step_count() == 15);
    CHECK(parameters(resumed) == parameters(straight));
}

TEST_CASE("A checkpoint of one optimizer is refused by another, naming both", "[cpu][optim][checkpoint]")
{
    testing::TempDir dir;
    Adam adam{{.lr = 0.01f}};
    const TorchNet net = trained(adam);
    save_checkpoint(dir / "adam.ckpt", net, {}, adam);

    TorchNet other{Device::cpu(), 4};
    const auto before = other.parameters();
    AdamW adamw;
    std::string message = error_of([&] { load_checkpoint(dir / "adam.ckpt", other, adamw); });
    CHECK_THAT(message, Catch::Contains("holds the state of the optimizer Adam, but this run's optimizer is AdamW"));
    CHECK_THAT(message, Catch::Contains(dir.path().string()));
    SGD sgd;
    message = error_of([&] { load_checkpoint(dir / "adam.ckpt", other, sgd); });
    CHECK_THAT(message, Catch::Contains("holds the state of the optimizer Adam, but this run's optimizer is SGD"));
    CHECK(other.parameters() == before);
    CHECK(other.optimizer_state().empty());
    CHECK(adamw.step_count() == 0);

    // An SGD checkpoint into Adam, likewise.
    SGD momentum{{.lr = 0.01f, .momentum = 0.9f}};
    save_checkpoint(dir / "sgd.ckpt", trained(momentum), {}, momentum);
    message = error_of([&] { load_checkpoint(dir / "sgd.ckpt", other, adam); });
    CHECK_THAT(message, Catch::Contains("holds the state of the optimizer SGD, but this run's optimizer is Adam"));

    // A forged file naming Adam with one value a parameter makes no sense.
    auto b = file_bytes(dir / "sgd.ckpt");
    b[68] = 2;
    write_sealed(dir / "forged.ckpt", b);
    message = error_of([&] { load_checkpoint(dir / "forged.ckpt", other); });
    CHECK_THAT(message, Catch::Contains("values of Adam's state, which keeps 2 per trainable parameter"));
    b[68] = 9;
    write_sealed(dir / "forged.ckpt", b);
    CHECK_THAT(error_of([&] { load_checkpoint(dir / "forged.ckpt", other); }),
               Catch::Contains("names optimizer id 9, which this replica does not know"));
    CHECK(other.parameters() == before);
}

TEST_CASE("A version 1 checkpoint still loads", "[cpu][optim][checkpoint]")
{
    testing::TempDir dir;
    SGD sgd{{.lr = 0.01f, .momentum = 0.9f}};
    const TorchNet net = trained(sgd);
    save_checkpoint(dir / "v2.ckpt", net, {.epoch = 0, .step = 3, .seed = 4});
    // Version 1: the same bytes without the 20 from offset 68 (optimizer id, step count, statistics count).
    auto b = file_bytes(dir / "v2.ckpt");
    b.erase(b.begin() + 68, b.begin() + 88);
    b[8] = 1;
    write_sealed(dir / "v1.ckpt", b);
    TorchNet loaded{Device::cpu(), 5};
    const CheckpointState s = load_checkpoint(dir / "v1.ckpt", loaded, sgd);
    CHECK(s.step == 3);
    CHECK(s.seed == 4);
    CHECK(s.optimizer == 0);
    CHECK(loaded.parameters() == net.parameters());
    CHECK(loaded.optimizer_state() == net.optimizer_state());
}

TEST_CASE("A checkpoint keeps the model's statistics, and refuses a count that does not match or values that are not finite",
          "[cpu][optim][checkpoint]")
{
    testing::TempDir dir;
    StatsNet saved{Device::cpu(), 1};
    saved.stats = {1.5f, 2.5f, -0.125f};
    save_checkpoint(dir / "stats.ckpt", saved, {.epoch = 0, .step = 0, .seed = 0});
    StatsNet loaded{Device::cpu(), 2};
    load_checkpoint(dir / "stats.ckpt", loaded);
    CHECK(loaded.stats == saved.stats);
    CHECK(loaded.parameters() == saved.parameters());

    // A model without statistics and one with them do not load each other's files.
    TorchNet plain{Device::cpu(), 3};
    CHECK_THAT(error_of([&] { load_checkpoint(dir / "stats.ckpt", plain); }),
               Catch::Contains("holds 3 statistics values (BatchNorm's running means and variances); this model has 0"));
    save_checkpoint(dir / "plain.ckpt", plain, {});
    CHECK_THAT(error_of([&] { load_checkpoint(dir / "plain.ckpt", loaded); }),
               Catch::Contains("holds 0 statistics values (BatchNorm's running means and variances); this model has 3"));
    CHECK(loaded.stats == saved.stats);

    // Non-finite statistics: not written, and a forged file with them refused.
    StatsNet bad{Device::cpu(), 1};
    bad.stats[1] = std::numeric_limits<float>::quiet_NaN();
    CHECK_THAT(error_of([&] { save_checkpoint(dir / "bad.ckpt", bad, {}); }), Catch::Contains("statistics value 1 is nan"));
    CHECK(!std::filesystem::exists(dir / "bad.ckpt"));
    auto b = file_bytes(dir / "stats.ckpt");
    const float inf = std::numeric_limits<float>::infinity();
    std::memcpy(b.data() + b.size() - 4 - 4, &inf, 4);   // the last statistics value
    write_sealed(dir / "forged.ckpt", b);
    CHECK_THAT(error_of([&] { load_checkpoint(dir / "forged.ckpt", loaded); }),
               Catch::Contains("statistics value 2 is inf"));
    CHECK(loaded.stats == saved.stats);
}

// ---- gradient accumulation ----

namespace {

// Trains `net` on `steps` batches of `batch` samples, in order, from `set`; returns the parameters.
template <class M, class Opt>
std::vector<float> train_in_order(M& net, Opt& opt, const data::Dataset& set, std::size_t batch, std::size_t steps)
{
    for (std::size_t s = 0; s < steps; ++s)
        train_step(net, opt, Batch{set.inputs.data() + s * batch * 8, set.labels.data() + s * batch, batch, s * batch, 3});
    return parameters(net);
}

// k = 4 at batch 16 against batch 64, two updates: on one model, and on DataParallel over 3 CPU replicas
// (16 = 6 + 5 + 5). Tolerance: the two sum the same 64 per-sample gradients in another order (four
// sums of 16, then their mean), about 1e-7 relative, through two steps of at most lr: 1e-5 on
// parameters of magnitude <= 1 is a hundred times that, and a step of the wrong size (no mean, a
// batch applied early, a sum not cleared) moves them by 1e-3 or more.
template <class M, class Opt>
void accumulation_equals_a_larger_batch(M& big, M& accumulated, Opt base)
{
    const auto set = data::synthetic_dataset(128, 8, 1, 4, 11);
    big.set_parameters(parameters(accumulated));
    Opt one = base;
    const auto want = train_in_order(big, one, set, 64, 2);

    Accumulate acc{base, 4};
    const auto start = parameters(accumulated);
    CHECK(train_in_order(accumulated, acc, set, 16, 3) == start);   // no update before the 4th batch
    CHECK(acc.step_count() == 3);
    CHECK(!acc.updates_now());
    for (std::size_t s = 3; s < 8; ++s)
        train_step(accumulated, acc, Batch{set.inputs.data() + s * 16 * 8, set.labels.data() + s * 16, 16, s * 16, 3});
    CHECK(acc.step_count() == 8);
    if constexpr (requires { acc.wrapped().step_count(); }) CHECK(acc.wrapped().step_count() == 2);
    const double err = max_error(parameters(accumulated), std::vector<double>(want.begin(), want.end()));
    CAPTURE(err);
    CHECK(err < 1e-5);
    CHECK(max_error(start, std::vector<double>(want.begin(), want.end())) > 1e-3);   // the updates are not tiny
}

} // namespace

TEST_CASE("Accumulating 4 batches of 16 equals one batch of 64: SGD with momentum and AdamW, on 1 and 3 replicas",
          "[cpu][optim][accumulate]")
{
    const SGD sgd{{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 1e-3f}};
    const AdamW adamw{{.lr = 0.01f, .weight_decay = 0.05f}};
    {
        TorchNet a{Device::cpu()}, b{Device::cpu()};
        accumulation_equals_a_larger_batch(a, b, sgd);
    }
    {
        TorchNet a{Device::cpu()}, b{Device::cpu()};
        accumulation_equals_a_larger_batch(a, b, adamw);
    }
    {
        DataParallel<TorchNet, Threaded> a{kThreeCpus}, b{kThreeCpus};
        accumulation_equals_a_larger_batch(a, b, sgd);
    }
    {
        DataParallel<TorchNet, Threaded> a{kThreeCpus}, b{kThreeCpus};
        accumulation_equals_a_larger_batch(a, b, adamw);
    }
    CHECK_THROWS_WITH(Accumulate(SGD{}, 0), Catch::Contains("Accumulate: k, the batches per update, must be at least 1"));
}

TEST_CASE("Accumulate keeps its count in checkpoints and resumes mid-way", "[cpu][optim][accumulate][checkpoint]")
{
    testing::TempDir dir;
    const auto set = data::synthetic_dataset(128, 8, 1, 4, 12);
    TorchNet straight{Device::cpu()}, part{Device::cpu()}, resumed{Device::cpu(), 7};
    Accumulate a1{AdamW{{.lr = 0.01f}}, 4}, a2{AdamW{{.lr = 0.01f}}, 4}, a3{AdamW{{.lr = 0.01f}}, 4};
    const auto want = train_in_order(straight, a1, set, 16, 8);
    train_in_order(part, a2, set, 16, 6);   // one update, and two batches summed
    save_checkpoint(dir / "acc.ckpt", part, {}, a2);
    const CheckpointState s = load_checkpoint(dir / "acc.ckpt", resumed, a3);
    CHECK(s.optimizer == 0);
    CHECK(a3.step_count() == 6);
    CHECK(a3.wrapped().step_count() == 1);
    for (std::size_t b = 6; b < 8; ++b)
        train_step(resumed, a3, Batch{set.inputs.data() + b * 16 * 8, set.labels.data() + b * 16, 16, b * 16, 3});
    CHECK(parameters(resumed) == want);
}

TEST_CASE("A model with BatchNorm resumes with its running statistics and AdamW's state as if never stopped",
          "[cpu][optim][checkpoint]")
{
    using Net = SmallResNetGlobal;
    static_assert(Net::statistics_count > 0);
    testing::TempDir dir;
    const auto set = data::synthetic_dataset(48, Net::input_shape::size, 1, 5, 8);
    const TrainOptions base{.batch_size = 12, .epochs = 3, .seed = 6, .progress = false, .log = nullptr};
    const AdamWOptions o{.lr = 0.01f};

    Net straight{Device::cpu()};
    AdamW opt1{o};
    Trainer{straight, opt1, base}.fit(set);

    TrainOptions first = base;
    first.epochs = 2;
    first.checkpoint = dir / "bn.ckpt";
    Net part{Device::cpu()};
    AdamW opt2{o};
    Trainer{part, opt2, first}.fit(set);
    Net loaded{Device::cpu(), 3};
    AdamW opt_loaded{o};
    load_checkpoint(dir / "bn.ckpt", loaded, opt_loaded);
    CHECK(loaded.statistics() == part.statistics());
    CHECK(loaded.statistics() != Net{Device::cpu()}.statistics());   // they moved from their initial values

    TrainOptions second = base;
    second.checkpoint = dir / "bn.ckpt";
    second.resume = true;
    Net resumed{Device::cpu(), 99};
    AdamW opt3{o};
    Trainer{resumed, opt3, second}.fit(set);
    CHECK(parameters(resumed) == parameters(straight));
    CHECK(resumed.statistics() == straight.statistics());
}

TEST_CASE("ClipGradNorm: a clipped gradient's global norm is the bound, an unclipped one is untouched, replicas clip alike",
          "[cpu][optim][clip]")
{
    using Net = FusedMlpNet;
    const RandomBatches<Net> data(9, 3);
    const auto batch = data.batch(0, 9, 0);
    // Plain SGD at lr 1 without momentum: the step is the gradient.
    auto gradient_of_step = [](const std::vector<float>& before, const std::vector<float>& after) {
        std::vector<double> g(before.size());
        for (std::size_t i = 0; i < g.size(); ++i) g[i] = double(before[i]) - double(after[i]);
        return g;
    };
    auto norm = [](const std::vector<double>& g) {
        double s = 0.0;
        for (double v : g) s += v * v;
        return std::sqrt(s);
    };
    Net plain{Device::cpu(), 1};
    const auto w0 = parameters(plain);
    SGD sgd{{.lr = 1.0f}};
    train_step(plain, sgd, batch);
    const auto g = gradient_of_step(w0, parameters(plain));
    const double full = norm(g);
    REQUIRE(full > 1e-3);

    Net clipped{Device::cpu(), 1};
    ClipGradNorm tight{SGD{{.lr = 1.0f}}, float(full / 4)};
    train_step(clipped, tight, batch);
    const auto gc = gradient_of_step(w0, parameters(clipped));
    CHECK(norm(gc) == Approx(full / 4).epsilon(1e-4));
    for (std::size_t i = 0; i < g.size(); ++i) CHECK(gc[i] == Approx(g[i] / 4).epsilon(1e-3).margin(1e-6));

    Net loose{Device::cpu(), 1};
    ClipGradNorm wide{SGD{{.lr = 1.0f}}, float(full * 2)};
    train_step(loose, wide, batch);
    CHECK(differences(parameters(loose), parameters(plain)) == "");

    DataParallel<Net, Threaded> three{cpus(3), 1};
    ClipGradNorm tight3{SGD{{.lr = 1.0f}}, float(full / 4)};
    train_step(three, tight3, batch);
    CHECK(max_relative_difference(parameters(three), parameters(clipped)) < 1e-5);
    for (std::size_t r = 1; r < 3; ++r) CHECK(differences(parameters(three.replica(r)), parameters(three)) == "");

    CHECK(error_message([] { ClipGradNorm bad{SGD{}, 0.0f}; }).find("max_norm must be > 0") != std::string::npos);
}

} // namespace test_optim
