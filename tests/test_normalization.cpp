// BatchNorm and Residual in models: statistics over the global batch under DataParallel (equal to
// the single model on 1-4 replicas, uneven splits and idle replicas included), the per-replica
// option (which differs), running estimates against a float64 reference, evaluation with them, and
// the model-state contract (statistics(), set_statistics()).

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "catch.hpp"
#include "fixtures.hpp"
#include "models.hpp"
#include "seeds.hpp"
#include "support.hpp"

// The runner compiles the test files in groups (tests/meson.build): this file's names stay in its own
// namespace.
namespace test_normalization {

using namespace replica;
using namespace replica::testing;

namespace {

static_assert(SmallResNet::statistics_count == 2 * (4 + 4 + 4 + 6 + 6 + 6));
static_assert(SmallResNet::syncs == 2 * 6);
static_assert(SmallResNetPerReplica::syncs == 0 && SmallResNetPerReplica::statistics_count == 8);
static_assert(model::TrainableModel<DataParallel<SmallResNet, Threaded>>);

const SGDOptions kSgd{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f};

struct Trained {
    std::vector<float> parameters, statistics;
};

// Three SGD steps of `batch` samples (the last one batch - 1, at least 1).
template <class Model, class Data>
Trained three_steps(Model& model, const Data& data, std::size_t batch)
{
    SGD opt{kSgd};
    std::size_t first = 0;
    for (int s = 0; s < 3; ++s) {
        const std::size_t n = s == 2 ? std::max<std::size_t>(1, batch - 1) : batch;
        REQUIRE(std::isfinite(train_step(model, opt, data.batch(first, n, first))));
        first += n;
    }
    return {parameters(model), model.statistics()};
}

} // namespace

TEST_CASE("BatchNorm over the global batch: DataParallel on 1-4 replicas equals the single model", "[cpu][batchnorm][parallel]")
{
    for (std::size_t batch : {7, 3}) {   // 7: uneven over 2-4 replicas; 3 then 2: replicas with no samples
        const RandomBatches<SmallResNet> data(3 * batch, 5);
        SmallResNet single{Device::cpu(), 3};
        const Trained want = three_steps(single, data, batch);
        for (std::size_t replicas : {1, 2, 3, 4}) {
            CAPTURE(batch, replicas);
            DataParallel<SmallResNet, Threaded> dp{cpus(replicas), 3};
            const Trained got = three_steps(dp, data, batch);
            CHECK(max_relative_difference(want.parameters, got.parameters) < 2e-5);
            CHECK(max_relative_difference(want.statistics, got.statistics) < 2e-5);
            // Every replica's running estimates are the same.
            for (std::size_t r = 1; r < replicas; ++r) CHECK(differences(dp.replica(r).statistics(), got.statistics) == "");
        }
    }
}

TEST_CASE("auto_parallel gives a model with global BatchNorm the threaded dispatch", "[cpu][batchnorm][parallel]")
{
    auto m = auto_parallel(SmallResNet{Device::cpu()}, cpus(2), {.dispatch = DispatchChoice::single});
    CHECK(m.description().find("threaded") != std::string::npos);
    const RandomBatches<SmallResNet> data(21, 5);
    SmallResNet single{Device::cpu()};
    CHECK(max_relative_difference(three_steps(single, data, 7).parameters, three_steps(m, data, 7).parameters) < 2e-5);
}

TEST_CASE("BatchStats::per_replica normalises with each replica's own samples", "[cpu][batchnorm][parallel]")
{
    // The same network with each option: on one replica both are the single model...
    const RandomBatches<SmallResNetGlobal> data(24, 9);
    SmallResNetGlobal global{Device::cpu(), 2};
    SmallResNetPerReplica own{Device::cpu(), 2};
    const Trained a = three_steps(global, data, 8), b = three_steps(own, data, 8);
    CHECK(differences(a.parameters, b.parameters) == "");
    // ...on two, the global one still is, the per-replica one is not (its statistics are per half batch).
    DataParallel<SmallResNetGlobal, Threaded> g2{cpus(2), 2};
    DataParallel<SmallResNetPerReplica, SingleThread> p2{cpus(2), 2};   // no collective: any dispatch
    const Trained c = three_steps(g2, data, 8), d = three_steps(p2, data, 8);
    CHECK(max_relative_difference(a.parameters, c.parameters) < 2e-5);
    CHECK(max_relative_difference(a.parameters, d.parameters) > 1e-3);
}

TEST_CASE("BatchNorm's running estimates follow PyTorch's update (float64 reference)", "[cpu][batchnorm]")
{
    // BatchNorm first: its input is the batch itself, so the reference needs no network.
    using Net = Sequential<Input<3, 2, 2>, BatchNorm2d, Flatten, Linear<2>>;
    constexpr std::size_t n = 5, C = 3, inner = 4;
    const RandomBatches<Net> data(3 * n, 13);
    Net net{Device::cpu()};
    {
        const auto s = net.statistics();
        REQUIRE(s.size() == 2 * C);
        for (std::size_t c = 0; c < C; ++c) CHECK((s[c] == 0.0f && s[C + c] == 1.0f));
    }
    std::vector<double> mean(C, 0.0), var(C, 1.0);
    SGD opt{{.lr = 0.1f}};
    for (std::size_t step = 0; step < 3; ++step) {
        train_step(net, opt, data.batch(step * n, n, step * n));
        for (std::size_t c = 0; c < C; ++c) {
            double s = 0.0, s2 = 0.0;
            for (std::size_t i = 0; i < n; ++i)
                for (std::size_t j = 0; j < inner; ++j) s += data.inputs[((step * n + i) * C + c) * inner + j];
            const double m = s / double(n * inner);
            for (std::size_t i = 0; i < n; ++i)
                for (std::size_t j = 0; j < inner; ++j) {
                    const double d = data.inputs[((step * n + i) * C + c) * inner + j] - m;
                    s2 += d * d;
                }
            mean[c] = 0.9 * mean[c] + 0.1 * m;
            var[c] = 0.9 * var[c] + 0.1 * s2 / double(n * inner - 1);   // unbiased
        }
    }
    const auto s = net.statistics();
    for (std::size_t c = 0; c < C; ++c) {
        CAPTURE(c);
        CHECK(s[c] == Approx(mean[c]).epsilon(1e-5).margin(1e-6));
        CHECK(s[C + c] == Approx(var[c]).epsilon(1e-5));
    }
}

TEST_CASE("Evaluation and prediction use the running estimates", "[cpu][batchnorm]")
{
    const RandomBatches<SmallResNet> data(18, 3);
    SmallResNet net{Device::cpu()};
    three_steps(net, data, 6);
    // With running estimates a sample's logits do not depend on the batch around it.
    std::vector<float> all(8 * 5), one(5);
    net.predict(data.inputs.data(), 8, all.data());
    for (std::size_t i : {0, 5}) {
        net.predict(data.inputs.data() + i * SmallResNet::input_shape::size, 1, one.data());
        for (std::size_t k = 0; k < 5; ++k) CHECK(one[k] == Approx(all[i * 5 + k]).epsilon(1e-5).margin(1e-6));
    }
    // And they are the model's state: other statistics, other outputs; the same ones back, the same outputs.
    const auto saved = net.statistics();
    auto changed = saved;
    for (auto& v : changed) v *= 1.5f;
    net.set_statistics(changed);
    std::vector<float> other(8 * 5);
    net.predict(data.inputs.data(), 8, other.data());
    CHECK(max_relative_difference(all, other) > 1e-3);
    net.set_statistics(saved);
    net.predict(data.inputs.data(), 8, other.data());
    CHECK(differences(all, other) == "");
    CHECK(error_message([&] { net.set_statistics(std::vector<float>(3)); }).find("the model has") != std::string::npos);
    // Training does not touch them through the optimizer, and evaluation does not move them.
    net.evaluate(data.inputs.data(), data.labels.data(), 8);
    CHECK(differences(net.statistics(), saved) == "");
}

TEST_CASE("A DataParallel built from a model keeps its statistics", "[cpu][batchnorm][parallel]")
{
    const RandomBatches<SmallResNet> data(18, 3);
    SmallResNet net{Device::cpu()};
    three_steps(net, data, 6);
    const auto stats = net.statistics();
    DataParallel<SmallResNet, Threaded> dp{std::move(net), cpus(3)};
    for (std::size_t r = 0; r < 3; ++r) CHECK(differences(dp.replica(r).statistics(), stats) == "");
}

TEST_CASE("Reproducible mode with BatchNorm and Residual: bit-identical on 1-4 replicas, statistics included",
          "[cpu][batchnorm][reproducible]")
{
    // 5 steps of 20 samples in micro-shards of 8, 8 and 4: uneven over every replica count, and a
    // replica with no shard on 4.
    const RandomBatches<SmallResNet> data(100, 4);
    SmallResNet single{Device::cpu(), 1};
    const auto expected = five_steps(single, data, 7);
    const auto stats = single.statistics();
    REQUIRE(differences(stats, SmallResNet{Device::cpu(), 1}.statistics()) != "");   // they moved
    for (std::size_t replicas : {1, 2, 3, 4}) {
        CAPTURE(replicas);
        DataParallel<SmallResNet, Threaded> dp{cpus(replicas), 1};
        CHECK(differences(five_steps(dp, data, 7), expected) == "");
        for (std::size_t r = 0; r < replicas; ++r) CHECK(differences(dp.replica(r).statistics(), stats) == "");
    }
    SmallResNet again{Device::cpu(), 1};
    CHECK(differences(five_steps(again, data, 7), expected) == "");   // run to run
    CHECK(differences(again.statistics(), stats) == "");
    // Each replica's own statistics: the same shards, so the same bits on any replica count and dispatch.
    const RandomBatches<SmallResNetPerReplica> own_data(100, 4);
    SmallResNetPerReplica own{Device::cpu(), 1};
    const auto own_expected = five_steps(own, own_data, 7);
    for (std::size_t replicas : {2, 3}) {
        CAPTURE(replicas);
        DataParallel<SmallResNetPerReplica, SingleThread> dp{cpus(replicas), 1};
        CHECK(differences(five_steps(dp, own_data, 7), own_expected) == "");
        CHECK(differences(dp.statistics(), own.statistics()) == "");
    }
}

TEST_CASE("Reproducible mode with BatchNorm: one micro-shard is the whole batch, as in the fast mode",
          "[cpu][batchnorm][reproducible]")
{
    // With shard = batch the shard's statistics are the batch's: the fast mode's step up to the
    // fixed-point rounding of the gradient (2^-40). Smaller shards normalise with their own (ghost
    // batch normalisation), which is another function.
    const RandomBatches<SmallResNet> data(60, 6);
    SmallResNet fast{Device::cpu(), 2}, whole{Device::cpu(), 2}, ghost{Device::cpu(), 2};
    const Trained a = three_steps(fast, data, 20);
    SGD opt_whole{kSgd}, opt_ghost{kSgd};
    for (std::size_t s = 0; s < 3; ++s) {
        const std::size_t n = s == 2 ? 19 : 20;
        train_step(whole, opt_whole, data.batch(s * 20, n, s * 20), {.reproducible = true, .micro_shard = 20});
        train_step(ghost, opt_ghost, data.batch(s * 20, n, s * 20), {.reproducible = true, .micro_shard = 5});
    }
    CHECK(max_relative_difference(a.parameters, parameters(whole)) < 1e-5);
    CHECK(max_relative_difference(a.statistics, whole.statistics()) < 1e-5);
    CHECK(max_relative_difference(a.parameters, parameters(ghost)) > 1e-4);
}

TEST_CASE("Reproducible mode: BatchNorm's running estimates move once a step, to the whole batch's (float64 reference)",
          "[cpu][batchnorm][reproducible]")
{
    // BatchNorm first, as in the float64 test above: batches of 9 in micro-shards of 4, 4 and 1.
    using Net = Sequential<Input<3, 2, 2>, BatchNorm2d, Flatten, Linear<2>>;
    constexpr std::size_t n = 9, C = 3, inner = 4;
    const RandomBatches<Net> data(3 * n, 13);
    std::vector<double> mean(C, 0.0), var(C, 1.0);
    for (std::size_t replicas : {1, 3}) {
        CAPTURE(replicas);
        DataParallel<Net, Threaded> net{cpus(replicas)};
        SGD opt{{.lr = 0.1f}};
        std::fill(mean.begin(), mean.end(), 0.0);
        std::fill(var.begin(), var.end(), 1.0);
        for (std::size_t step = 0; step < 3; ++step) {
            train_step(net, opt, data.batch(step * n, n, step * n), {.reproducible = true, .micro_shard = 4});
            for (std::size_t c = 0; c < C; ++c) {
                double s = 0.0, s2 = 0.0;
                auto at = [&](std::size_t i, std::size_t j) { return double(data.inputs[((step * n + i) * C + c) * inner + j]); };
                for (std::size_t i = 0; i < n; ++i)
                    for (std::size_t j = 0; j < inner; ++j) s += at(i, j);
                const double m = s / double(n * inner);
                for (std::size_t i = 0; i < n; ++i)
                    for (std::size_t j = 0; j < inner; ++j) s2 += (at(i, j) - m) * (at(i, j) - m);
                mean[c] = 0.9 * mean[c] + 0.1 * m;
                var[c] = 0.9 * var[c] + 0.1 * s2 / double(n * inner - 1);
            }
        }
        const auto s = net.statistics();
        for (std::size_t c = 0; c < C; ++c) {
            CAPTURE(c);
            CHECK(s[c] == Approx(mean[c]).epsilon(1e-5).margin(1e-6));
            CHECK(s[C + c] == Approx(var[c]).epsilon(1e-5));
        }
    }
}

TEST_CASE("BatchNorm inside Concat branches: statistics over the global batch, and the reproducible mode",
          "[cpu][batchnorm][parallel]")
{
    static_assert(ConcatBatchNormNet::statistics_count == 2 * (6 + 4 + 2));
    static_assert(ConcatBatchNormNet::syncs == 2 * 3);
    // The fast mode: DataParallel on 2-4 replicas equals the single model, uneven and idle replicas included.
    for (std::size_t batch : {7, 3}) {
        const RandomBatches<ConcatBatchNormNet> data(3 * batch, 8);
        ConcatBatchNormNet single{Device::cpu(), 3};
        const Trained want = three_steps(single, data, batch);
        REQUIRE(differences(want.statistics, ConcatBatchNormNet{Device::cpu(), 3}.statistics()) != "");
        for (std::size_t replicas : {2, 4}) {
            CAPTURE(batch, replicas);
            DataParallel<ConcatBatchNormNet, Threaded> dp{cpus(replicas), 3};
            const Trained got = three_steps(dp, data, batch);
            CHECK(max_relative_difference(want.parameters, got.parameters) < 2e-5);
            CHECK(max_relative_difference(want.statistics, got.statistics) < 2e-5);
        }
    }
    // The reproducible mode: the same bits on 1 and 3 replicas.
    const RandomBatches<ConcatBatchNormNet> data(100, 4);
    ConcatBatchNormNet one{Device::cpu(), 1};
    const auto expected = five_steps(one, data, 7);
    DataParallel<ConcatBatchNormNet, Threaded> three{cpus(3), 1};
    CHECK(differences(five_steps(three, data, 7), expected) == "");
    CHECK(differences(three.statistics(), one.statistics()) == "");
}

// PyTorch as the reference (tests/pytorch/make_fixtures.py, resnet.txt): a small ResNet-style model
// with convolutions without bias, BatchNorm, an identity and a projection residual block.
// Tolerances: float rounding in another order than PyTorch's (its convolutions, our products) gives
// about 1e-6 relative in the forward output; gradients pass through BatchNorm's division by the
// batch's standard deviation, which amplifies it (1e-5 relative); three SGD steps at lr 0.1 add up
// to about 1e-5 absolute on parameters of about 0.3. Each bound is 10-30 times what we see, and
// 100 times smaller than what a wrong variance (biased for unbiased), a missing term of BatchNorm's
// input gradient or a shortcut on the wrong side would do.
TEST_CASE("BatchNorm and Residual against PyTorch: forward, gradients, running estimates, 3 SGD steps",
          "[cpu][batchnorm][residual][pytorch]")
{
    for (const auto path : conv_paths()) {   // im2col, and oneDNN where built
        const ConvPathScope scope(path);
        INFO(conv_path_name(path));
        const auto f = read_fixture("resnet.txt");
        using Net = TorchResNet;
        REQUIRE(f.at("initial").size() == Net::param_count);
        REQUIRE(f.at("statistics").size() == Net::statistics_count);
        constexpr std::size_t n = 6;
        Net net{Device::cpu()};
        net.set_parameters(to_float(f.at("initial")));

        // One training forward and backward of the layers, with the fixture's output gradient.
        backend::cpu::Context ctx{Device::cpu()};
        auto& chain = net.layers();
        const auto x = to_float(f.at("x")), dy = to_float(f.at("dy"));
        auto params = net.parameters(), statistics = net.statistics();
        std::vector<float> y(n * 5), dx(n * Net::input_shape::size), dparams(Net::param_count),
            saved(n * Net::chain::saved_size), kept(n * Net::chain::kept_size), scratch(chain.scratch_size(ctx, n));
        chain.forward(ctx, model::Pass{}, model::ForwardArgs<>{.params = params.data(), .weights = params.data(), .x = x.data(),
                                                             .y = y.data(), .n = n, .saved = saved.data(), .kept = kept.data(),
                                                             .scratch = scratch.data(), .statistics = statistics.data()});
        chain.backward(ctx, model::Pass{}, model::BackwardArgs<>{.params = params.data(), .weights = params.data(), .x = x.data(),
                                                               .y = y.data(), .dy = dy.data(), .dx = dx.data(),
                                                               .dparams = dparams.data(), .n = n, .saved = saved.data(),
                                                               .kept = kept.data(), .scratch = scratch.data()});
        const double ey = max_error(y, f.at("y")), edx = max_error(dx, f.at("dx")), edp = max_error(dparams, f.at("dparams")),
                     est = max_error(statistics, f.at("statistics_after_forward"));
        CAPTURE(ey, edx, edp, est);
        CHECK(ey < 1e-5);
        CHECK(edx < 1e-5);
        CHECK(edp < 1e-4);
        CHECK(est < 1e-5);

        // Three SGD steps, the model's running estimates, and evaluation with them.
        Net trained{Device::cpu()};
        const auto losses = train_resnet_fixture(trained, f);
        const double eloss = max_error(losses, f.at("losses")), ew = max_error(parameters(trained), f.at("final")),
                     es = max_error(trained.statistics(), f.at("statistics"));
        std::vector<float> eval(n * 5);
        trained.predict(to_float(f.at("inputs")).data(), n, eval.data());
        const double ee = max_error(eval, f.at("eval_y"));
        CAPTURE(eloss, ew, es, ee);
        CHECK(eloss < 1e-5);
        CHECK(ew < 1e-4);
        CHECK(es < 1e-4);
        CHECK(ee < 1e-4);
    }
}

TEST_CASE("A Residual whose body ends in BatchNorm adds the other branch in BatchNorm's pass and keeps no copy of "
          "the body's output",
          "[cpu][layers][residual]")
{
    using In = Shape<4, 6, 6>;
    using Body = Sequential<Conv2d<4, 3, 1, 1, Bias::none>, BatchNorm2d>;
    using BodyRelu = Sequential<Conv2d<4, 3, 1, 1, Bias::none>, BatchNorm2d, ReLU>;
    using Shortcut = Sequential<Conv2d<4, 1, 1, 0, Bias::none>, BatchNorm2d>;
    // The body's output is the Residual's: nothing kept beyond the body's (and the shortcut's) own.
    static_assert(Residual<Body>::op<In>::kept_size == Body::op<In>::kept_size);
    static_assert(Residual<Body, Shortcut>::op<In>::kept_size ==
                  Body::op<In>::kept_size + Shortcut::op<In>::kept_size + In::size);
    // A body ending in anything else keeps its output for the addition after it.
    static_assert(Residual<BodyRelu>::op<In>::kept_size == BodyRelu::op<In>::kept_size + In::size);
    static_assert(Body::op<In>::takes_addend && !BodyRelu::op<In>::takes_addend);
}

TEST_CASE("A Residual sums its branches' input gradients where a convolution writes them: no pass of its own",
          "[cpu][layers][residual]")
{
    using In = Shape<4, 6, 6>;
    using Body = Sequential<Conv2d<4, 3, 1, 1, Bias::none>, BatchNorm2d>;
    using Shortcut = Sequential<Conv2d<4, 1, 1, 0, Bias::none>, BatchNorm2d>;
    using PoolFirst = Sequential<MaxPool2d<1, 1>, Conv2d<4, 3, 1, 1, Bias::none>, BatchNorm2d>;
    // A body whose first op is a convolution and whose output gradient another op reads: in place.
    static_assert(Body::op<In>::accumulates_input_gradient && Body::op<In>::reads_output_gradient_first);
    static_assert(Residual<Body>::op<In>::identity_in_place && !Residual<Body>::op<In>::gradient_apart);
    // A projection whose first op is a convolution adds its gradient to the body's: no scratch for it.
    static_assert(!Residual<Body, Shortcut>::op<In>::identity_in_place && !Residual<Body, Shortcut>::op<In>::gradient_apart);
    // A lone convolution would read its output gradient where it writes its input gradient; a body that
    // starts with pooling cannot add: both add in a pass of their own.
    static_assert(!Residual<Conv2d<4, 3, 1, 1>>::op<In>::identity_in_place);
    static_assert(!Residual<PoolFirst>::op<In>::identity_in_place && !PoolFirst::op<In>::accumulates_input_gradient);
    static_assert(Residual<PoolFirst, Shortcut>::op<In>::gradient_apart == false);
    static_assert(Residual<Body, Sequential<MaxPool2d<1, 1>, Conv2d<4, 1, 1, 0, Bias::none>>>::op<In>::gradient_apart);
}

// =============================================================================================
// BatchNorm's options (eps, momentum or cumulative averaging, affine, track_running_stats).

namespace {

using In3 = Shape<3, 5, 5>;
static_assert(std::same_as<BatchNorm2dWith<BatchNormOptions{}>, BatchNorm2d>);
static_assert(std::same_as<BatchNorm1dWith<BatchNormOptions{}>, BatchNorm1d>);
static_assert(BatchNorm2dWith<kNonAffine>::op<In3>::param_count == 0);
static_assert(BatchNorm2dWith<kNonAffine>::op<In3>::statistics_count == 6);
static_assert(BatchNorm2dWith<kCumulative>::op<In3>::param_count == 6);
static_assert(BatchNorm2dWith<kCumulative>::op<In3>::statistics_count == 7);   // and the batches tracked
static_assert(BatchNorm2dWith<kUntracked>::op<In3>::statistics_count == 0);
static_assert(BatchNorm2dWith<kUntracked>::op<In3>::syncs == 2);   // training still sums over replicas
static_assert(BatchNorm2d::op<In3>::options_signature == 0);
static_assert(BatchNorm2dWith<BatchNormOptions{.eps = 1e-3f}>::op<In3>::options_signature != 0);
static_assert(BatchNorm2dWith<BatchNormOptions{.momentum = 0.01f}>::op<In3>::options_signature !=
              BatchNorm2dWith<BatchNormOptions{.eps = 1e-3f}>::op<In3>::options_signature);

// The fixture's options as a model of one layer (tests/pytorch/make_fixtures.py, batchnorm()).
template <BatchNormOptions O>
using OneBatchNorm = Sequential<Input<3, 5, 5>, BatchNorm2dWith<O>>;

// Three training forward and backward passes with the fixture's x and dy, each checked against
// PyTorch's output, input gradient, parameter gradients and running statistics; then evaluation.
// Bounds: float sums in another order than PyTorch's give up to 3e-7 relative; each bound is 10 times
// that, and 100 times smaller than what the default eps (1e-5 for 1e-3) or the default momentum
// (0.1 for 0.01) would do.
template <BatchNormOptions O>
void check_against_pytorch(const std::map<std::string, std::vector<double>>& f, const std::string& name)
{
    using Net = OneBatchNorm<O>;
    constexpr std::size_t n = 4, size = Net::input_shape::size;
    INFO("variant " << name);
    Net net{Device::cpu()};
    if constexpr (O.affine) net.set_parameters(to_float(f.at(name + "_params")));
    backend::cpu::Context ctx{Device::cpu()};
    auto& chain = net.layers();
    const auto xs = to_float(f.at("x")), dys = to_float(f.at("dy"));
    auto params = net.parameters(), statistics = net.statistics();
    std::vector<float> y(n * size), dx(n * size), dparams(Net::param_count), scratch(chain.scratch_size(ctx, n));
    for (std::size_t s = 0; s < 3; ++s) {
        CAPTURE(s);
        const float* x = xs.data() + s * n * size;
        chain.forward(ctx, model::Pass{}, model::ForwardArgs<>{.params = params.data(), .weights = params.data(), .x = x,
                                                             .y = y.data(), .n = n, .saved = nullptr, .kept = nullptr,
                                                             .scratch = scratch.data(), .statistics = statistics.data()});
        chain.backward(ctx, model::Pass{}, model::BackwardArgs<>{.params = params.data(), .weights = params.data(), .x = x,
                                                               .y = y.data(), .dy = dys.data() + s * n * size,
                                                               .dx = dx.data(), .dparams = dparams.data(), .n = n,
                                                               .saved = nullptr, .kept = nullptr, .scratch = scratch.data()});
        const std::string at = std::to_string(s);
        const double ey = relative_error(y, f.at(name + "_y" + at)), edx = relative_error(dx, f.at(name + "_dx" + at));
        CAPTURE(ey, edx);
        CHECK(ey < 3e-6);
        CHECK(edx < 3e-6);
        if constexpr (O.affine) {
            const double edp = relative_error(dparams, f.at(name + "_dparams" + at));
            CAPTURE(edp);
            CHECK(edp < 3e-6);
        }
        if constexpr (O.track_running_stats) {
            const double es = relative_error(statistics, f.at(name + "_statistics" + at));
            CAPTURE(es);
            CHECK(es < 3e-6);
        }
    }
    // Evaluation: the running estimates (without them the batch's statistics).
    net.set_statistics(statistics);
    std::vector<float> eval(n * size);
    net.predict(to_float(f.at("x_eval")).data(), n, eval.data());
    const double ee = relative_error(eval, f.at(name + "_eval_y"));
    CAPTURE(ee);
    CHECK(ee < 3e-6);
}

template <BatchNormOptions O>
void check_data_parallel()
{
    using Net = BatchNormOptionsNet<O>;
    for (std::size_t batch : {7, 3}) {   // 3 then 2 over 3 replicas: uneven, and a replica with no samples
        const RandomBatches<Net> data(3 * batch, 5);
        Net single{Device::cpu(), 3};
        const Trained want = three_steps(single, data, batch);
        for (std::size_t replicas : {2, 3}) {
            CAPTURE(batch, replicas);
            DataParallel<Net, Threaded> dp{cpus(replicas), 3};
            const Trained got = three_steps(dp, data, batch);
            CHECK(max_relative_difference(want.parameters, got.parameters) < 2e-5);
            // The running estimates move by sums the replicas add in another order: float rounding,
            // far below what a wrong eps or momentum moves them by.
            CHECK(max_relative_difference(want.statistics, got.statistics) < 5e-5);
            for (std::size_t r = 1; r < replicas; ++r) CHECK(differences(dp.replica(r).statistics(), got.statistics) == "");
        }
    }
    // The reproducible mode: the same bits on 1 and 3 replicas, statistics included.
    const RandomBatches<Net> data(100, 4);
    Net one{Device::cpu(), 1};
    const auto expected = five_steps(one, data, 7);
    DataParallel<Net, Threaded> three{cpus(3), 1};
    CHECK(differences(five_steps(three, data, 7), expected) == "");
    CHECK(differences(three.statistics(), one.statistics()) == "");
    if constexpr (O.cumulative) {   // each BatchNorm counted the 5 steps once
        const auto s = one.statistics();
        for (std::size_t at : {8, 17, 26}) CHECK(s[at] == 5.0f);
    }
}

} // namespace

TEST_CASE("BatchNorm's options against PyTorch: eps, momentum, affine=False, cumulative, untracked",
          "[cpu][batchnorm][pytorch]")
{
    const auto f = read_fixture("batchnorm.txt");
    check_against_pytorch<kNonAffine>(f, "nonaffine");
    check_against_pytorch<kCumulative>(f, "cumulative");
    check_against_pytorch<kUntracked>(f, "untracked");
}

TEST_CASE("BatchNorm's options: DataParallel on 2-3 replicas equals the single model, and the reproducible mode",
          "[cpu][batchnorm][parallel][reproducible]")
{
    static_assert(BatchNormOptionsNet<kNonAffine>::param_count == BatchNormOptionsNet<BatchNormOptions{}>::param_count - 3 * 2 * 4);
    static_assert(BatchNormOptionsNet<kCumulative>::statistics_count == 3 * (2 * 4 + 1));
    static_assert(BatchNormOptionsNet<kUntracked>::statistics_count == 0);
    check_data_parallel<kNonAffine>();
    check_data_parallel<kCumulative>();
    check_data_parallel<kUntracked>();
}

TEST_CASE("BatchNorm without running statistics evaluates with the batch's", "[cpu][batchnorm]")
{
    using Net = BatchNormOptionsNet<kUntracked>;
    const RandomBatches<Net> data(16, 8);
    Net net{Device::cpu(), 2};
    three_steps(net, data, 5);
    // Each sample's output depends on the batch it is in, and evaluating moves nothing.
    std::vector<float> a(2 * 5), again(2 * 5), both(4 * 5);
    net.predict(data.inputs.data(), 2, a.data());
    net.predict(data.inputs.data(), 4, both.data());
    net.predict(data.inputs.data(), 2, again.data());
    CHECK(differences(std::vector<float>(both.begin(), both.begin() + 10), a) != "");
    CHECK(differences(again, a) == "");
}

// The nested replicas sum BatchNorm's statistics over the nested batch at their own sync points inside
// the parent's step: the model trains as the plain one does (float rounding apart), a replica without
// samples included; the parent's statistics are replica 0's, and an evaluation on every replica reads
// them, also after they are set from outside (a checkpoint).
TEST_CASE("BatchNorm under a nested DataParallel: statistics over the nested batch, as the plain model",
          "[cpu][batchnorm][parallel]")
{
    static_assert(BatchNormNested<Threaded>::statistics_count == BatchNormNestedPlain::statistics_count &&
                  BatchNormNested<Threaded>::statistics_count == 20);
    const RandomBatches<BatchNormNestedPlain> data(40, 5);
    SGD opt{{.lr = 0.05f, .momentum = 0.9f}};
    auto train = [&](auto& net, std::size_t batch) {
        SGD o = opt;
        for (std::size_t s = 0; s < 4; ++s) REQUIRE(std::isfinite(train_step(net, o, data.batch(s * batch, batch, s * batch))));
    };
    for (std::size_t batch : {7, 2}) {   // 2: fewer samples than replicas on 3 and 4
        BatchNormNestedPlain plain{Device::cpu(), 3};
        train(plain, batch);
        const auto eval_plain = plain.evaluate(data.inputs.data(), data.labels.data(), 20);
        for (std::size_t replicas : {1, 2, 3, 4}) {
            CAPTURE(batch, replicas);
            BatchNormNested<Threaded> nested{cpus(replicas), 3};
            train(nested, batch);
            CHECK(max_relative_difference(parameters(nested), parameters(plain)) < 1e-5);
            CHECK(max_relative_difference(nested.statistics(), plain.statistics()) < 1e-5);
            const auto eval = nested.evaluate(data.inputs.data(), data.labels.data(), 20);
            CHECK(eval.loss_sum == Approx(eval_plain.loss_sum).epsilon(1e-5));
            CHECK(eval.correct == eval_plain.correct);
        }
    }
    // Statistics set from outside reach every nested replica before an evaluation reads them.
    BatchNormNestedPlain plain{Device::cpu(), 3};
    BatchNormNested<Threaded> nested{cpus(3), 3};
    train(plain, 7);
    train(nested, 7);
    std::vector<float> stats = plain.statistics();
    for (std::size_t i = 0; i < stats.size(); ++i) stats[i] = stats[i] * 1.5f + 0.25f;
    plain.set_statistics(stats);
    nested.set_statistics(stats);
    nested.set_parameters(parameters(plain));
    const auto a = plain.evaluate(data.inputs.data(), data.labels.data(), 21);
    const auto b = nested.evaluate(data.inputs.data(), data.labels.data(), 21);
    CHECK(b.loss_sum == Approx(a.loss_sum).epsilon(1e-5));
}

// The CPU kernels' per-channel sums (in double, by lane within blocks of a row), the normalisation and
// the input gradient against float64 sums, on rows that span two blocks and end in part of a lane
// group (300 values) and on rows shorter than a group (7), with and without the ReLU's mask
// (recomputed from x, or read from the output after an addend). A sum is its float rounding.
TEST_CASE("BatchNorm's CPU kernels against float64 over long and short rows", "[cpu][batchnorm]")
{
    namespace cpu = backend::cpu;
    const std::uint64_t seed = testing::test_seed();
    INFO(testing::rerun(seed));
    std::mt19937_64 rng(seed);
    const cpu::Context ctx;
    for (const auto [n, c, inner] : {std::array<std::size_t, 3>{3, 5, 300}, {4, 3, 7}}) {
        CAPTURE(n, c, inner);
        const std::size_t count = n * c * inner;
        auto uniform = [&](std::size_t size, float lo, float hi) {
            std::uniform_real_distribution<float> u(lo, hi);
            std::vector<float> v(size);
            for (auto& e : v) e = u(rng);
            return v;
        };
        const auto x = uniform(count, -3.0f, 5.0f), dy = uniform(count, -1.0f, 1.0f), addend = uniform(count, -1.0f, 1.0f);
        const auto shift = uniform(c, 0.0f, 1.0f), weight = uniform(c, 0.5f, 1.5f), bias = uniform(c, -0.5f, 0.5f);
        auto at = [&](const std::vector<float>& v, std::size_t i, std::size_t ch, std::size_t j) {
            return double(v[(i * c + ch) * inner + j]);
        };
        // got is want rounded to float (half an ulp, 2^-24 relative), give or take the double sums' order.
        auto close = [](double got, double want, double magnitude) {
            return std::abs(got - want) <= 6e-8 * std::abs(want) + 1e-13 * magnitude;
        };

        std::vector<float> sums(2 * c + 1);
        cpu::batch_norm_sums(ctx, x.data(), n, c, inner, shift.data(), sums.data(), nullptr);
        std::vector<float> mean(c), invstd(c);
        for (std::size_t ch = 0; ch < c; ++ch) {
            double s1 = 0.0, s2 = 0.0, magnitude = 0.0;
            for (std::size_t i = 0; i < n; ++i)
                for (std::size_t j = 0; j < inner; ++j) {
                    const double d = at(x, i, ch, j) - shift[ch];
                    s1 += d, s2 += d * d, magnitude += std::abs(d);
                }
            CHECK(close(sums[ch], s1, magnitude));
            CHECK(close(sums[c + ch], s2, s2));
            mean[ch] = float(shift[ch] + s1 / double(n * inner));
            invstd[ch] = float(1.0 / std::sqrt(s2 / double(n * inner) - (s1 / double(n * inner)) * (s1 / double(n * inner)) + 1e-5));
        }
        CHECK(sums[2 * c] == float(n * inner));

        for (const bool with_addend : {false, true}) {
            CAPTURE(with_addend);
            std::vector<float> y(count);
            cpu::batch_norm_apply(ctx, x.data(), y.data(), n, c, inner, weight.data(), bias.data(), mean.data(), invstd.data(),
                                  true, with_addend ? addend.data() : nullptr);
            std::size_t wrong = 0;
            for (std::size_t i = 0; i < n; ++i)
                for (std::size_t ch = 0; ch < c; ++ch)
                    for (std::size_t j = 0; j < inner; ++j) {
                        const double want = std::max(0.0, (at(x, i, ch, j) - mean[ch]) * invstd[ch] * weight[ch] + bias[ch] +
                                                                  (with_addend ? at(addend, i, ch, j) : 0.0));
                        wrong += !(std::abs(at(y, i, ch, j) - want) <= 1e-5 * (1.0 + std::abs(want)));
                    }
            CHECK(wrong == 0);

            // The backward passes through the ReLU's mask (y > 0), and without one.
            for (const bool masked : {false, true}) {
                CAPTURE(masked);
                std::vector<float> dparams(2 * c), dz(count, 7.0f), dx(count);
                backend::ReluAfter<float> relu;
                if (masked && with_addend) relu = {.y = y.data(), .dz = dz.data()};
                else if (masked) relu = {.weight = weight.data(), .bias = bias.data()};
                cpu::batch_norm_backward_sums(ctx, x.data(), dy.data(), n, c, inner, mean.data(), invstd.data(),
                                              dparams.data(), nullptr, relu);
                auto g = [&](std::size_t i, std::size_t ch, std::size_t j) {
                    return masked && !(at(y, i, ch, j) > 0.0) ? 0.0 : at(dy, i, ch, j);
                };
                const float elements = float(n * inner);
                if (relu.from_y()) {
                    std::size_t written = 0;
                    for (std::size_t i = 0; i < n; ++i)
                        for (std::size_t ch = 0; ch < c; ++ch)
                            for (std::size_t j = 0; j < inner; ++j) written += at(dz, i, ch, j) == g(i, ch, j);
                    CHECK(written == count);
                    cpu::batch_norm_backward_input(ctx, x.data(), dz.data(), dx.data(), n, c, inner, weight.data(),
                                                   mean.data(), invstd.data(), dparams.data(), &elements);
                } else {
                    cpu::batch_norm_backward_input(ctx, x.data(), dy.data(), dx.data(), n, c, inner, weight.data(),
                                                   mean.data(), invstd.data(), dparams.data(), &elements, relu);
                }
                std::size_t wrong_dx = 0;
                for (std::size_t ch = 0; ch < c; ++ch) {
                    double sdy = 0.0, sdyx = 0.0, mdy = 0.0, mdyx = 0.0;
                    for (std::size_t i = 0; i < n; ++i)
                        for (std::size_t j = 0; j < inner; ++j) {
                            const double xhat = (at(x, i, ch, j) - mean[ch]) * invstd[ch];
                            sdy += g(i, ch, j), sdyx += g(i, ch, j) * xhat;
                            mdy += std::abs(g(i, ch, j)), mdyx += std::abs(g(i, ch, j) * xhat);
                        }
                    CHECK(close(dparams[c + ch], sdy, mdy));
                    CHECK(close(dparams[ch], sdyx, mdyx));
                    for (std::size_t i = 0; i < n; ++i)
                        for (std::size_t j = 0; j < inner; ++j) {
                            const double xhat = (at(x, i, ch, j) - mean[ch]) * invstd[ch];
                            const double want = weight[ch] * invstd[ch] *
                                                (g(i, ch, j) - dparams[c + ch] / elements - xhat * dparams[ch] / elements);
                            wrong_dx += !(std::abs(at(dx, i, ch, j) - want) <= 1e-5 * (1.0 + std::abs(want)));
                        }
                }
                CHECK(wrong_dx == 0);
            }
        }
    }
}

} // namespace test_normalization
