// Optimizers and schedules: Adam and AdamW against a float64 reference of PyTorch's rule and against
// PyTorch itself (tests/pytorch/*.txt, written by tests/pytorch/make_fixtures.py), the step count's
// contract under DataParallel, warm-up and cosine schedules; and the new activations against PyTorch.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <numbers>
#include <string>
#include <vector>

#include "catch.hpp"
#include "replica/replica.hpp"

using namespace replica;

namespace {

// A fixture file: records "name count" followed by count numbers.
std::map<std::string, std::vector<double>> read_fixture(const std::string& name)
{
    const std::string path = std::string(REPLICA_SOURCE_DIR) + "/tests/pytorch/" + name;
    std::ifstream in(path);
    REQUIRE(in.good());
    std::map<std::string, std::vector<double>> records;
    std::string key;
    std::size_t count = 0;
    while (in >> key >> count) {
        std::vector<double>& v = records[key];
        v.resize(count);
        for (double& x : v) REQUIRE(bool(in >> x));
    }
    REQUIRE(!records.empty());
    return records;
}

std::vector<float> to_float(const std::vector<double>& v) { return {v.begin(), v.end()}; }

// The largest |got - want| over the vectors.
double max_error(const std::vector<float>& got, const std::vector<double>& want)
{
    REQUIRE(got.size() == want.size());
    double most = 0.0;
    for (std::size_t i = 0; i < got.size(); ++i) most = std::max(most, std::abs(double(got[i]) - want[i]));
    return most;
}

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

// The model of the PyTorch fixtures, plain and with its first two layers in a nested DataParallel
// (same parameter layout): the optimizer is then applied slice by slice, on three replicas.
using TorchNet = Sequential<Input<8>, Linear<16>, GELU, Linear<12>, Tanh, Linear<10>, Sigmoid, Linear<4>>;
using TorchNetNested = Sequential<Input<8>, DataParallel<Sequential<Input<8>, Linear<16>, GELU>, Threaded>, Linear<12>,
                                  Tanh, Linear<10>, Sigmoid, Linear<4>>;
static_assert(TorchNet::param_count == 522 && TorchNetNested::param_count == 522);

const std::vector<Device> kThreeCpus{Device::cpu(0), Device::cpu(1), Device::cpu(2)};

// Trains `net` 5 steps on the fixture's batches with `opt`; returns the losses.
template <class M, class Opt>
std::vector<float> train_fixture(M& net, Opt& opt, const std::map<std::string, std::vector<double>>& f)
{
    net.set_parameters(to_float(f.at("initial")));
    const std::vector<float> inputs = to_float(f.at("inputs"));
    std::vector<std::int32_t> labels;
    for (double l : f.at("labels")) labels.push_back(std::int32_t(l));
    const std::size_t batch = labels.size() / 5;
    std::vector<float> losses;
    for (std::size_t s = 0; s < 5; ++s)
        losses.push_back(train_step(net, opt, Batch{inputs.data() + s * batch * 8, labels.data() + s * batch, batch, s * batch, 1}));
    return losses;
}

template <class Opt>
Opt fixture_optimizer(const std::vector<double>& h)
{
    return Opt{{.lr = float(h[0]), .beta1 = float(h[1]), .beta2 = float(h[2]), .eps = float(h[3]), .weight_decay = float(h[4])}};
}

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
                opt.apply(ctx, w.data(), g.data(), state.data(), w.size());
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
    CHECK_THROWS_WITH(opt.apply(ctx, &w, &g, s, 1), Catch::Contains("before begin_update()"));
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
        op.forward(ctx, model::Pass{}, model::ForwardArgs{.params = nullptr, .x = x.data(), .y = y.data(), .n = 1,
                                                          .saved = nullptr, .scratch = nullptr});
        op.backward(ctx, model::Pass{}, model::BackwardArgs{.params = nullptr, .x = x.data(), .y = y.data(), .dy = dy.data(),
                                                            .dx = dx.data(), .dparams = nullptr, .n = 1, .saved = nullptr,
                                                            .scratch = nullptr});
        // Float rounding of the libm functions: a few ulp of values of magnitude <= 5.
        CHECK(max_error(y, f.at(name + "_y")) < 2e-6);
        CHECK(max_error(dx, f.at(name + "_dx")) < 2e-6);
    };
    check(Identity{}, "identity");
    check(Sigmoid{}, "sigmoid");
    check(Tanh{}, "tanh");
    check(GELU{}, "gelu");
}

// Tolerance: float rounding differs from PyTorch's (summation order in the GEMMs, libm), by about
// 1e-7 relative in each gradient; Adam divides m by sqrt(v), so a relative error of the gradient
// becomes at most about the same relative error of each step (steps of at most lr = 0.01), and the
// 5 steps add up. 2e-5 on parameters of magnitude <= 0.5 (and on the losses, about 1.4) is a few
// hundred times that, and 100 times smaller than one step of Adam: a wrong bias correction, a wrong
// weight decay or a step counted twice moves parameters by 1e-3 or more.
constexpr double kTorchTolerance = 2e-5;

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
