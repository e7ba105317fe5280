// Checkpoints: round trips on one and several replicas, and every way a file can be refused.

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "catch.hpp"
#include "support.hpp"
#include "replica/replica.hpp"
#include "replica/data/synthetic.hpp"
#include "replica/train/checkpoint.hpp"

// The runner compiles the test files in groups (tests/meson.build): this file's names stay in its own
// namespace.
namespace test_checkpoint {

using namespace replica;
namespace fs = std::filesystem;

using replica::testing::TempDir;
using replica::testing::file_bytes;
using replica::testing::write_bytes;

namespace {

using Tiny = Sequential<Input<1, 8, 8>, Conv2d<4, 3>, ReLU, Flatten, Linear<3>>;
// Same parameter count as Tiny, another structure.
using TinyWithoutReLU = Sequential<Input<1, 8, 8>, Conv2d<4, 3>, Flatten, Linear<3>>;

static_assert(Tiny::param_count == TinyWithoutReLU::param_count);
static_assert(model_signature<Tiny>() != model_signature<TinyWithoutReLU>());
static_assert(model_signature<Tiny>() != model_signature<LeNet>());
static_assert(model_signature<DataParallel<LeNet>>() == model_signature<LeNet>());
static_assert(model_signature<DataParallel<LeNet, Threaded>>() == model_signature<LeNet>());
static_assert(model_signature<AutoParallel<LeNet>>() == model_signature<LeNet>());
static_assert(train::Checkpointable<LeNet>);
static_assert(train::Checkpointable<DataParallel<LeNet>>);
static_assert(train::Checkpointable<AutoParallel<Tiny>>);
static_assert(!train::Checkpointable<int>);

// Runs f; requires that it throws replica::Error whose message contains every one of `parts`.
template <class F>
void require_error(F&& f, std::initializer_list<std::string_view> parts)
{
    std::string message = "(no replica::Error was thrown)";
    try {
        f();
    } catch (const Error& e) {
        message = e.what();
    }
    INFO("message: " << message);
    for (std::string_view part : parts) {
        INFO("should contain: " << part);
        REQUIRE(message.find(part) != std::string::npos);
    }
}

// One SGD step with momentum on a fixed synthetic batch, so that the optimizer state is not empty.
template <class M>
void train_once(M& model, std::uint64_t data_seed = 7)
{
    const auto set = synthetic_dataset(8, M::input_shape::size, 1, M::output_shape::size, data_seed);
    const SGD opt{{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-4f}};
    const Batch batch{.inputs = set.inputs.data(), .labels = set.labels.data(), .size = set.count,
                      .first_sample = 0, .seed = 11};
    train_step(model, opt, batch);
}

CheckpointState sample_state()
{
    CheckpointState s;
    s.epoch = 3;
    s.step = 2811;
    s.seed = 0x0123456789abcdefull;
    s.history = {{1, 2.302585, 1.9, 0.31, 12.5}, {2, 1.25, 1.125, 0.5625, 11.75}, {3, 0.1, 0.2, 0.9921875, 1e-3}};
    return s;
}

void require_same_state(const CheckpointState& a, const CheckpointState& b)
{
    REQUIRE(a.epoch == b.epoch);
    REQUIRE(a.step == b.step);
    REQUIRE(a.seed == b.seed);
    REQUIRE(a.history.size() == b.history.size());
    for (std::size_t i = 0; i < a.history.size(); ++i) {
        INFO("history record " << i);
        CHECK(a.history[i].epoch == b.history[i].epoch);
        CHECK(a.history[i].train_loss == b.history[i].train_loss);
        CHECK(a.history[i].validation_loss == b.history[i].validation_loss);
        CHECK(a.history[i].validation_accuracy == b.history[i].validation_accuracy);
        CHECK(a.history[i].seconds == b.history[i].seconds);
    }
}

template <class M>
void check_round_trip(const TempDir& dir)
{
    const fs::path file = dir / "model.ckpt";
    M saved{Device::cpu(), 1};
    train_once(saved);
    REQUIRE(saved.optimizer_state().size() == M::param_count);
    save_checkpoint(file, saved, sample_state());
    REQUIRE(fs::exists(file));
    REQUIRE(!fs::exists(dir / "model.ckpt.tmp"));

    M loaded{Device::cpu(), 2};
    REQUIRE(loaded.parameters() != saved.parameters());
    const CheckpointState state = load_checkpoint(file, loaded);
    require_same_state(state, sample_state());
    REQUIRE(loaded.parameters() == saved.parameters());
    REQUIRE(loaded.optimizer_state() == saved.optimizer_state());

    // Training on from the checkpoint is training on from the saved model.
    train_once(saved, 8);
    train_once(loaded, 8);
    REQUIRE(loaded.parameters() == saved.parameters());
    REQUIRE(loaded.optimizer_state() == saved.optimizer_state());
}

} // namespace

TEST_CASE("a checkpoint restores parameters, optimizer state and the run's state", "[cpu]")
{
    TempDir dir;
    SECTION("tiny model") { check_round_trip<Tiny>(dir); }
    SECTION("LeNet") { check_round_trip<LeNet>(dir); }
    SECTION("a model never trained has no optimizer state") {
        const fs::path file = dir / "fresh.ckpt";
        Tiny saved{Device::cpu(), 5};
        save_checkpoint(file, saved, {});
        Tiny loaded{Device::cpu(), 6};
        const CheckpointState state = load_checkpoint(file, loaded);
        require_same_state(state, CheckpointState{});
        REQUIRE(loaded.parameters() == saved.parameters());
        REQUIRE(loaded.optimizer_state().empty());
    }
    SECTION("saving again replaces the checkpoint; missing directories are created") {
        const fs::path file = dir / "a" / "b" / "model.ckpt";
        Tiny first{Device::cpu(), 1}, second{Device::cpu(), 2};
        save_checkpoint(file, first, {.epoch = 1});
        save_checkpoint(file, second, {.epoch = 2});
        Tiny loaded{Device::cpu(), 3};
        REQUIRE(load_checkpoint(file, loaded).epoch == 2);
        REQUIRE(loaded.parameters() == second.parameters());
        REQUIRE(!fs::exists(dir / "a" / "b" / "model.ckpt.tmp"));
    }
}

TEST_CASE("a checkpoint loads on any replica count", "[cpu]")
{
    TempDir dir;
    const std::vector<Device> two{Device::cpu(0), Device::cpu(1)};

    SECTION("DataParallel to a plain model and back") {
        DataParallel<LeNet> dp{two, 3};
        train_once(dp);
        save_checkpoint(dir / "dp.ckpt", dp, sample_state());

        LeNet plain{Device::cpu(), 4};
        require_same_state(load_checkpoint(dir / "dp.ckpt", plain), sample_state());
        REQUIRE(plain.parameters() == dp.parameters());
        REQUIRE(plain.optimizer_state() == dp.optimizer_state());

        train_once(plain, 9);
        save_checkpoint(dir / "plain.ckpt", plain, {.epoch = 4});
        DataParallel<LeNet, Threaded> back{two, 5};
        REQUIRE(load_checkpoint(dir / "plain.ckpt", back).epoch == 4);
        for (std::size_t r = 0; r < back.replica_count(); ++r) {
            INFO("replica " << r);
            REQUIRE(back.replica(r).parameters() == plain.parameters());
            REQUIRE(back.replica(r).optimizer_state() == plain.optimizer_state());
        }
    }
    SECTION("AutoParallel to a plain model") {
        auto model = auto_parallel(Tiny{Device::cpu(0), 6}, two);
        train_once(model);
        save_checkpoint(dir / "auto.ckpt", model, {.step = 1});
        Tiny plain{Device::cpu(), 7};
        REQUIRE(load_checkpoint(dir / "auto.ckpt", plain).step == 1);
        REQUIRE(plain.parameters() == model.parameters());
        REQUIRE(plain.optimizer_state() == model.optimizer_state());
    }
}

TEST_CASE("a truncated checkpoint is refused and the model is untouched", "[cpu]")
{
    TempDir dir;
    const fs::path good = dir / "good.ckpt", cut = dir / "cut.ckpt";
    Tiny saved{Device::cpu(), 1};
    train_once(saved);
    save_checkpoint(good, saved, sample_state());
    const std::vector<char> bytes = file_bytes<char>(good);
    REQUIRE(bytes.size() == 88 + 3 * 40 + 4 * 2 * Tiny::param_count + 4);

    Tiny model{Device::cpu(), 2};
    const auto before = model.parameters();
    for (std::size_t length : {std::size_t{0}, std::size_t{3}, std::size_t{8}, std::size_t{11}, std::size_t{40},
                               std::size_t{67}, std::size_t{68}, std::size_t{87}, std::size_t{100}, bytes.size() / 2,
                               bytes.size() - 4, bytes.size() - 1}) {
        INFO("cut at " << length << " of " << bytes.size() << " bytes");
        write_bytes(cut, {bytes.begin(), bytes.begin() + std::ptrdiff_t(length)});
        require_error([&] { load_checkpoint(cut, model); },
                      {cut.string(), "is truncated (" + std::to_string(length) + " bytes", "use an earlier checkpoint"});
        REQUIRE(model.parameters() == before);
        REQUIRE(model.optimizer_state().empty());
    }
}

TEST_CASE("a damaged checkpoint is refused as corrupt", "[cpu]")
{
    TempDir dir;
    const fs::path good = dir / "good.ckpt", bad = dir / "bad.ckpt";
    Tiny saved{Device::cpu(), 1};
    train_once(saved);
    save_checkpoint(good, saved, sample_state());
    const std::vector<char> bytes = file_bytes<char>(good);

    Tiny model{Device::cpu(), 2};
    const auto before = model.parameters();
    SECTION("one flipped byte") {
        // the epoch, a history record, a parameter, the optimizer state, the checksum itself
        for (std::size_t at : {std::size_t{36}, std::size_t{88 + 45}, std::size_t{88 + 120 + 17},
                               bytes.size() - 4 - 9, bytes.size() - 2}) {
            INFO("flipped byte " << at);
            std::vector<char> damaged = bytes;
            damaged[at] = char(damaged[at] ^ 0x10);
            write_bytes(bad, damaged);
            require_error([&] { load_checkpoint(bad, model); }, {bad.string(), "is corrupt (checksum mismatch)"});
            REQUIRE(model.parameters() == before);
        }
    }
    SECTION("bytes after the end") {
        std::vector<char> longer = bytes;
        longer.push_back('x');
        write_bytes(bad, longer);
        require_error([&] { load_checkpoint(bad, model); }, {bad.string(), "is corrupt"});
        REQUIRE(model.parameters() == before);
    }
    SECTION("another format version") {
        std::vector<char> newer = bytes;
        newer[8] = 4;
        write_bytes(bad, newer);
        require_error([&] { load_checkpoint(bad, model); }, {bad.string(), "format version 4"});
        REQUIRE(model.parameters() == before);
    }
}

TEST_CASE("a checkpoint of another model is refused", "[cpu]")
{
    TempDir dir;
    const fs::path file = dir / "tiny.ckpt";
    Tiny tiny{Device::cpu(), 1};
    save_checkpoint(file, tiny, {});

    SECTION("other parameter count") {
        LeNet lenet{Device::cpu()};
        const auto before = lenet.parameters();
        require_error([&] { load_checkpoint(file, lenet); },
                      {file.string(), "was saved from a different model (" + std::to_string(Tiny::param_count) +
                                          " parameters",
                       "this model has " + std::to_string(LeNet::param_count) + " parameters"});
        REQUIRE(lenet.parameters() == before);
    }
    SECTION("same parameter count, other structure") {
        TinyWithoutReLU other{Device::cpu(), 2};
        const auto before = other.parameters();
        require_error([&] { load_checkpoint(file, other); }, {file.string(), "different model"});
        REQUIRE(other.parameters() == before);
    }
}

// BatchNorm's options are part of the signature where they are not the defaults, so a checkpoint saved
// with other eps or momentum is refused, although its layout is the same.
using WithBatchNorm = Sequential<Input<2, 6, 6>, Conv2d<3, 3>, BatchNorm2d, ReLU, Flatten, Linear<3>>;
template <BatchNormOptions O>
using WithBatchNormOptions = Sequential<Input<2, 6, 6>, Conv2d<3, 3>, BatchNorm2dWith<O>, ReLU, Flatten, Linear<3>>;
static_assert(model_signature<WithBatchNormOptions<BatchNormOptions{}>>() == model_signature<WithBatchNorm>());
static_assert(model_signature<WithBatchNormOptions<BatchNormOptions{.eps = 1e-3f}>>() != model_signature<WithBatchNorm>());
static_assert(model_signature<WithBatchNormOptions<BatchNormOptions{.momentum = 0.01f}>>() !=
              model_signature<WithBatchNormOptions<BatchNormOptions{.eps = 1e-3f}>>());

TEST_CASE("a checkpoint of a model with other BatchNorm options is refused; one with its own loads", "[cpu][batchnorm]")
{
    TempDir dir;
    const fs::path file = dir / "bn.ckpt";
    WithBatchNorm saved{Device::cpu(), 1};
    save_checkpoint(file, saved, {});
    WithBatchNormOptions<BatchNormOptions{.eps = 1e-3f, .momentum = 0.01f}> other{Device::cpu(), 2};
    const auto before = other.parameters();
    require_error([&] { load_checkpoint(file, other); }, {file.string(), "different model", "BatchNorm"});
    REQUIRE(other.parameters() == before);
    // affine = false: other parameter count; cumulative: another statistics count.
    WithBatchNormOptions<BatchNormOptions{.affine = false}> no_affine{Device::cpu(), 2};
    require_error([&] { load_checkpoint(file, no_affine); }, {file.string(), "different model"});

    // Cumulative averaging: the batches tracked travel with the running estimates.
    using Cumulative = WithBatchNormOptions<BatchNormOptions{.cumulative = true}>;
    Cumulative trained{Device::cpu(), 3};
    SGD opt{{.lr = 0.1f}};
    const auto data = synthetic_dataset(8, Cumulative::input_shape::size, 1, 3, 5);
    for (std::size_t s = 0; s < 2; ++s)
        train_step(trained, opt, Batch{data.inputs.data() + s * 4 * Cumulative::input_shape::size,
                                       data.labels.data() + s * 4, 4, s * 4, 1});
    REQUIRE(trained.statistics().back() == 2.0f);
    const fs::path cumulative = dir / "cumulative.ckpt";
    save_checkpoint(cumulative, trained, {});
    Cumulative loaded{Device::cpu(), 4};
    load_checkpoint(cumulative, loaded);
    CHECK(loaded.statistics() == trained.statistics());
    require_error([&] { load_checkpoint(cumulative, saved); }, {cumulative.string(), "holds 7 statistics values"});
}

TEST_CASE("a file that is not a checkpoint is refused", "[cpu]")
{
    TempDir dir;
    Tiny model{Device::cpu(), 1};
    const auto before = model.parameters();

    SECTION("text") {
        const fs::path file = dir / "notes.txt";
        const std::string text = "These are not the parameters you are looking for. Nor is this a header of any kind.";
        write_bytes(file, {text.begin(), text.end()});
        require_error([&] { load_checkpoint(file, model); }, {file.string(), "is not a replica checkpoint"});
    }
    SECTION("a few bytes") {
        const fs::path file = dir / "short.bin";
        write_bytes(file, {'R', 'E', 'X'});
        require_error([&] { load_checkpoint(file, model); }, {file.string(), "is not a replica checkpoint"});
    }
    SECTION("missing") {
        const fs::path file = dir / "nowhere" / "model.ckpt";
        require_error([&] { load_checkpoint(file, model); }, {file.string(), "not found"});
    }
    REQUIRE(model.parameters() == before);
}

TEST_CASE("a failed save leaves the previous checkpoint intact", "[cpu]")
{
    TempDir dir;
    const fs::path file = dir / "model.ckpt";
    Tiny first{Device::cpu(), 1};
    train_once(first);
    save_checkpoint(file, first, sample_state());
    const std::vector<char> before = file_bytes<char>(file);

    // The temporary file cannot be created where a directory stands (root ignores permissions).
    fs::create_directories(dir / "model.ckpt.tmp");
    Tiny second{Device::cpu(), 2};
    require_error([&] { save_checkpoint(file, second, {.epoch = 9}); },
                  {"cannot write checkpoint " + file.string(), "model.ckpt.tmp", "Is a directory"});
    REQUIRE(file_bytes<char>(file) == before);
    REQUIRE(fs::is_directory(dir / "model.ckpt.tmp"));

    Tiny loaded{Device::cpu(), 3};
    require_same_state(load_checkpoint(file, loaded), sample_state());
    REQUIRE(loaded.parameters() == first.parameters());
    REQUIRE(loaded.optimizer_state() == first.optimizer_state());

    SECTION("a directory where the checkpoint goes") {
        const fs::path taken = dir / "taken.ckpt";
        fs::create_directories(taken / "inside");
        require_error([&] { save_checkpoint(taken, second, {}); }, {"cannot write checkpoint " + taken.string()});
        REQUIRE(!fs::exists(dir / "taken.ckpt.tmp"));
        REQUIRE(fs::is_directory(taken / "inside"));
    }
}

} // namespace test_checkpoint
