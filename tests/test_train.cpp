// train: the optimizer, schedules, the Trainer (real data, resume, scaling).

#include <filesystem>

#include "catch.hpp"
#include "models.hpp"
#include "replica/data/fashion_mnist.hpp"
#include "replica/train/trainer.hpp"

// The runner compiles the test files in groups (tests/meson.build): this file's names stay in its own
// namespace.
namespace test_train {

using namespace replica;
using namespace replica::testing;

namespace {
bool have_fashion_mnist()
{
    return std::filesystem::exists(data::default_fashion_mnist_dir() / "train-labels-idx1-ubyte.gz") ||
           std::filesystem::exists(data::default_fashion_mnist_dir() / "train-labels-idx1-ubyte");
}
} // namespace

TEST_CASE("SGD follows PyTorch's update rule", "[cpu]")
{
    // Three steps of the float64 reference against the kernel, with every option on.
    for (bool nesterov : {false, true}) {
        CAPTURE(nesterov);
        SGD opt{{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f, .nesterov = nesterov}};
        backend::cpu::Context ctx;
        std::vector<float> w{1.0f, -2.0f, 0.5f}, v(3, 0.0f);
        std::vector<double> rw{1.0, -2.0, 0.5}, rv(3, 0.0);
        const std::vector<float> g{0.3f, -0.1f, 2.0f};
        for (int step = 0; step < 3; ++step) {
            const ParamSegment all = core::whole_slice(3);
            opt.apply(ctx, w.data(), g.data(), v.data(), {&all, 1});
            for (int i = 0; i < 3; ++i) {
                const double gi = g[i] + 0.01 * rw[i];
                rv[i] = 0.9 * rv[i] + gi;
                rw[i] -= 0.1 * (nesterov ? gi + 0.9 * rv[i] : rv[i]);
            }
        }
        for (int i = 0; i < 3; ++i) CHECK(std::abs(w[i] - rw[i]) < 1e-6 * std::max(1.0, std::abs(rw[i])));
    }
}

TEST_CASE("Learning-rate schedules", "[cpu]")
{
    CHECK(Schedule::fixed().lr(0.1f, 7.5) == 0.1f);
    CHECK(std::abs(Schedule::step(2, 0.5).lr(0.1f, 3.9) - 0.05f) < 1e-7);
    CHECK(std::abs(Schedule::step(2, 0.5).lr(0.1f, 4.0) - 0.025f) < 1e-7);
    CHECK(std::abs(Schedule::exponential(0.5).lr(0.1f, 2.0) - 0.025f) < 1e-7);
    CHECK(std::abs(Schedule::polynomial(2, 10).lr(0.1f, 5.0) - 0.025f) < 1e-7);
    CHECK(Schedule::polynomial(2, 10).lr(0.1f, 12.0) == 0.0f);
    CHECK_THROWS_AS(Schedule::step(0, 0.5), Error);
}

TEST_CASE("LeNet learns Fashion-MNIST: one pass over 10,000 images, >= 75% on the test set", "[cpu][fashion-mnist]")
{
    if (!have_fashion_mnist())
        REPLICA_SKIP("Fashion-MNIST not found in " << data::default_fashion_mnist_dir() << ": install dataset-fashion-mnist");
    const auto train = data::load_fashion_mnist(data::Split::train).slice(0, 10000);
    const auto test = data::load_fashion_mnist(data::Split::test);
    LeNet net{Device::cpu(), 1};
    SGD opt{{.lr = 0.01f, .momentum = 0.9f}};
    Trainer trainer{net, opt, {.batch_size = 32, .epochs = 1, .seed = 1, .progress = false, .log = nullptr}};
    const History h = trainer.fit(train, test);
    REQUIRE(h.epochs.size() == 1);
    CHECK(h.epochs[0].validation_accuracy >= 0.75);
    CHECK(evaluate(net, test).accuracy == h.epochs[0].validation_accuracy);
}

TEST_CASE("Training resumed from a checkpoint equals training straight through", "[cpu]")
{
    const auto dir = std::filesystem::temp_directory_path() / ("replica-resume-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const auto set = data::synthetic_dataset(96, ConcatDropoutNet::input_shape::size, 1, 10, 3);
    const TrainOptions base{.batch_size = 16, .epochs = 3, .seed = 5, .progress = false, .log = nullptr};

    ConcatDropoutNet straight{Device::cpu()};
    SGD opt1{{.lr = 0.05f, .momentum = 0.9f}};
    Trainer{straight, opt1, base}.fit(set);

    // Two epochs, stop, then a fresh model and optimizer resume for the third.
    TrainOptions first = base;
    first.epochs = 2;
    first.checkpoint = dir / "run.ckpt";
    ConcatDropoutNet part{Device::cpu()};
    SGD opt2{{.lr = 0.05f, .momentum = 0.9f}};
    Trainer{part, opt2, first}.fit(set);

    TrainOptions second = base;
    second.checkpoint = dir / "run.ckpt";
    second.resume = true;
    ConcatDropoutNet resumed{Device::cpu(), 99};
    SGD opt3{{.lr = 0.05f, .momentum = 0.9f}};
    const History h = Trainer{resumed, opt3, second}.fit(set);
    CHECK(h.epochs.size() == 3);
    CHECK(parameters(resumed) == parameters(straight));
    std::filesystem::remove_all(dir);
}

TEST_CASE("Weak scaling multiplies the global batch; strong keeps it", "[cpu]")
{
    const auto set = data::synthetic_dataset(64, LeNet::input_shape::size, 1, 10, 1);
    auto model = auto_parallel(LeNet{Device::cpu()}, cpus(2));
    SGD opt;
    Trainer strong{model, opt, {.batch_size = 8, .epochs = 1, .scaling = Scaling::strong, .progress = false, .log = nullptr}};
    Trainer weak{model, opt, {.batch_size = 8, .epochs = 1, .scaling = Scaling::weak, .progress = false, .log = nullptr}};
    CHECK(strong.global_batch() == 8);
    CHECK(weak.global_batch() == 16);
    CHECK(data::Loader(set, weak.global_batch(), 1).batches_per_epoch() == 4);
}

TEST_CASE("The Trainer refuses data that does not fit the model", "[cpu]")
{
    LeNet net{Device::cpu()};
    SGD opt;
    Trainer trainer{net, opt, {.progress = false, .log = nullptr}};
    const auto wrong = data::synthetic_dataset(10, 100, 1, 10, 1);
    try {
        trainer.fit(wrong);
        FAIL("accepted a data set of the wrong size");
    } catch (const Error& e) {
        CHECK(std::string(e.what()).find("the model's Input needs 784") != std::string::npos);
    }
}

} // namespace test_train
