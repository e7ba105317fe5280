// Nothing lost, nothing silent: sizes that overflow, training that diverges, checkpoints that never
// end or whose checksum is right but whose content is not. Each case: a clear Error, nothing changed.
// The tuning cache (core/tuning_cache.hpp): a file that is not whole is ignored with one log line,
// never trusted, and a folder that cannot be written costs one line, never an exception.

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "catch.hpp"
#include "support.hpp"
#include "replica/core/checked.hpp"
#include "replica/core/tuning_cache.hpp"
#include "replica/data/synthetic.hpp"
#include "replica/replica.hpp"
#include "replica/train/checkpoint.hpp"
#include "replica/train/trainer.hpp"

// The runner compiles the test files in groups (tests/meson.build): this file's names stay in its own
// namespace.
namespace test_robust {

using namespace replica;
namespace fs = std::filesystem;
using replica::testing::error_message;
using replica::testing::TempDir;
using replica::testing::file_bytes;
using replica::testing::write_bytes;

namespace {

using Small = Sequential<Input<6>, Linear<5>, ReLU, Linear<3>>;
using OneFeature = Sequential<Input<1>, Linear<2>>;

void put_u64(std::vector<unsigned char>& b, std::size_t at, std::uint64_t v)
{
    for (int i = 0; i < 8; ++i) b[at + std::size_t(i)] = static_cast<unsigned char>(v >> (8 * i));
}

// Recomputes the trailing CRC-32, as a forger would.
void reseal(std::vector<unsigned char>& b)
{
    const std::uint32_t crc = std::uint32_t(crc32(crc32(0L, Z_NULL, 0), b.data(), uInt(b.size() - 4)));
    for (int i = 0; i < 4; ++i) b[b.size() - 4 + std::size_t(i)] = static_cast<unsigned char>(crc >> (8 * i));
}

void require_message(const std::string& message, std::initializer_list<std::string_view> parts)
{
    INFO("message: " << message);
    for (std::string_view part : parts) {
        INFO("should contain: " << part);
        REQUIRE(message.find(part) != std::string::npos);
    }
}

TrainOptions quiet(TrainOptions o)
{
    o.progress = false;
    o.log = nullptr;
    return o;
}

bool all_finite(const std::vector<float>& v)
{
    for (float x : v)
        if (!std::isfinite(x)) return false;
    return true;
}

} // namespace

TEST_CASE("size products that overflow are errors, not wrapped values", "[cpu][robust]")
{
    const std::size_t big = std::size_t{1} << 62;
    REQUIRE(core::checked_mul(3, 5, "x") == 15);
    require_message(error_message([&] { core::checked_mul(big, 784, "batch x sample size"); }),
                    {"batch x sample size: 4611686018427387904 x 784 does not fit in a 64-bit size"});
    require_message(error_message([&] { core::checked_add(std::numeric_limits<std::size_t>::max(), 1, "sum"); }),
                    {"sum:", "does not fit"});
    require_message(error_message([&] { synthetic_dataset(big, 784, 1, 10, 1); }),
                    {"synthetic_dataset: count x input_size", "does not fit"});

    // The crash: a batch near 2^62 over a small data set.
    const auto set = synthetic_dataset(40, Small::input_shape::size, 1, 3, 2);
    Small model{Device::cpu(), 1};
    SGD opt{{.lr = 0.1f}};
    const auto before = model.parameters();
    for (std::size_t batch : {big, std::size_t{41}}) {
        Trainer trainer{model, opt, quiet({.batch_size = batch, .epochs = 1})};
        require_message(error_message([&] { trainer.fit(set); }),
                        {"global batch of " + std::to_string(batch) + " samples is larger than the training set's 40",
                         "use a batch size of at most 40"});
    }
    REQUIRE(model.parameters() == before);
    DataParallel<Small, SingleThread> pair{{Device::cpu(0), Device::cpu(1)}, 1};
    Trainer weak{pair, opt, quiet({.batch_size = std::size_t{1} << 63, .epochs = 1, .scaling = Scaling::weak})};
    require_message(error_message([&] { weak.fit(set); }), {"global batch (batch size x replicas)", "does not fit"});
    Trainer none{model, opt, quiet({.batch_size = 4, .epochs = 1})};
    Dataset lying = set;
    lying.count = big;
    require_message(error_message([&] { none.fit(lying); }), {"count x input_size", "does not fit"});
    REQUIRE(error_message([&] { Trainer t{model, opt, quiet({.epochs = 0})}; }).find("epochs must be at least 1") !=
            std::string::npos);
}

TEST_CASE("NaN or infinite inputs are refused once, before training", "[cpu][robust]")
{
    auto set = synthetic_dataset(32, Small::input_shape::size, 1, 3, 2);
    Small model{Device::cpu(), 1};
    SGD opt{{.lr = 0.1f}};
    const auto before = model.parameters();
    Trainer trainer{model, opt, quiet({.batch_size = 8, .epochs = 1})};
    auto bad = set;
    bad.inputs[5 * 6 + 2] = std::numeric_limits<float>::infinity();
    require_message(error_message([&] { trainer.fit(bad); }), {"input 2 of sample 5 is inf", "must be a finite number"});
    bad = set;
    bad.inputs[7] = std::nanf("");
    require_message(error_message([&] { trainer.fit(set, bad); }), {"the validation set: input 1 of sample 1 is nan"});
    REQUIRE(model.parameters() == before);
}

TEST_CASE("a diverging run stops with an error naming the step and the causes; its checkpoint stays", "[cpu][robust]")
{
    TempDir dir;
    const fs::path ckpt = dir / "run.ckpt";
    const auto set = synthetic_dataset(64, Small::input_shape::size, 1, 3, 2);
    Small model{Device::cpu(), 1};
    {
        SGD opt{{.lr = 0.05f, .momentum = 0.9f}};
        Trainer good{model, opt, quiet({.batch_size = 16, .epochs = 1, .checkpoint = ckpt})};
        good.fit(set);
    }
    const auto saved = file_bytes(ckpt);
    const auto before = model.parameters();
    REQUIRE(all_finite(before));

    SGD wild{{.lr = 3e38f, .momentum = 0.9f}};
    Trainer trainer{model, wild, quiet({.batch_size = 16, .epochs = 3, .checkpoint = ckpt, .resume = true})};
    const std::string message = error_message([&] { trainer.fit(set); });
    require_message(message, {"training diverged: the loss of step ", "(epoch 2, batch ", "of 4) is ",
                              "a learning rate too high", "NaN or infinite values produced from the inputs",
                              "The last checkpoint, " + ckpt.string() + ", is unchanged", "--skip-nonfinite"});
    REQUIRE(file_bytes(ckpt) == saved);   // the last good checkpoint, byte for byte
    Small reloaded{Device::cpu(), 2};
    load_checkpoint(ckpt, reloaded);
    REQUIRE(reloaded.parameters() == before);
}

TEST_CASE("with skip_nonfinite a batch whose loss is not finite is undone and counted", "[cpu][robust]")
{
    // x in [-1, 1], class 0 when x > 0 (as the weights +-2 already say); one sample of 3e38, which
    // overflows the logits of those weights.
    Dataset set;
    set.count = 16;
    set.input_size = 1;
    for (std::size_t i = 0; i < set.count; ++i) {
        const float x = i == 11 ? 3e38f : float(i) / 8.0f - 1.0f;
        set.inputs.push_back(x);
        set.labels.push_back(x > 0.0f ? 0 : 1);
    }
    auto run = [&](bool skip, History* out) {
        OneFeature model{Device::cpu(), 1};
        model.set_parameters(std::vector<float>{2.0f, -2.0f, 0.0f, 0.0f});
        SGD opt{{.lr = 0.01f, .momentum = 0.5f}};
        Trainer trainer{model, opt, quiet({.batch_size = 4, .epochs = 3, .skip_nonfinite = skip})};
        *out = trainer.fit(set);
        return model.parameters();
    };
    History history;
    const std::string stopped = error_message([&] { run(false, &history); });
    require_message(stopped, {"training diverged: the loss of step ", "(epoch 1, batch "});

    const auto w = run(true, &history);
    CHECK(history.skipped_steps == 3);   // one batch of each epoch holds the sample
    REQUIRE(history.epochs.size() == 3);
    for (const auto& r : history.epochs) CHECK(std::isfinite(r.train_loss));
    REQUIRE(all_finite(w));
    CHECK(w[0] > 1.9f);   // the skipped batches' updates (NaN) were not applied; the others agree with +-2
}

TEST_CASE("a checkpoint is never written with NaN or infinite values", "[cpu][robust]")
{
    TempDir dir;
    const fs::path ckpt = dir / "m.ckpt";
    Small model{Device::cpu(), 1};
    save_checkpoint(ckpt, model, {});
    const auto saved = file_bytes(ckpt);
    auto w = model.parameters();
    w[4] = std::nanf("");
    model.set_parameters(w);
    require_message(error_message([&] { save_checkpoint(ckpt, model, {.epoch = 1}); }),
                    {"not writing checkpoint " + ckpt.string(), "parameter 4 is nan", "training has diverged",
                     "previous checkpoint, if any, is unchanged"});
    REQUIRE(file_bytes(ckpt) == saved);
    REQUIRE(!fs::exists(dir / "m.ckpt.tmp"));
}

TEST_CASE("a checkpoint reader never reads more than the header and the model allow", "[cpu][robust]")
{
    TempDir dir;
    Small model{Device::cpu(), 1};
    const auto before = model.parameters();

    SECTION("/dev/zero") {
        require_message(error_message([&] { load_checkpoint("/dev/zero", model); }),
                        {"/dev/zero is not a replica checkpoint"});
    }
    SECTION("a pipe that never ends, after a valid header") {
        const fs::path saved = dir / "m.ckpt", fifo = dir / "endless";
        save_checkpoint(saved, model, {});
        const auto header = file_bytes(saved);
        REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
        ::signal(SIGPIPE, SIG_IGN);   // the writer learns of the closed reader from write()
        std::thread writer([&] {
            const int fd = ::open(fifo.c_str(), O_WRONLY);
            if (fd < 0) return;
            std::vector<unsigned char> block(1 << 16, 0);
            std::size_t sent = 0;
            bool ok = ::write(fd, header.data(), 88) == 88;
            while (ok && sent < (std::size_t{1} << 32)) {   // 4 GiB at most, if the reader never stopped
                const ssize_t n = ::write(fd, block.data(), block.size());
                ok = n > 0;
                sent += ok ? std::size_t(n) : 0;
            }
            ::close(fd);
        });
        const auto t0 = std::chrono::steady_clock::now();
        const std::string message = error_message([&] { load_checkpoint(fifo, model); });
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        writer.join();
        require_message(message, {fifo.string(), "is corrupt (more than the " +
                                                     std::to_string(88 + 4 * Small::param_count + 4) + " bytes"});
        CHECK(seconds < 5.0);
    }
    SECTION("a header that claims more than any checkpoint holds") {
        const fs::path file = dir / "huge.ckpt";
        save_checkpoint(file, model, {});
        auto bytes = file_bytes(file);
        put_u64(bytes, 60, std::uint64_t{1} << 60);   // history records
        write_bytes(file, bytes);
        require_message(error_message([&] { load_checkpoint(file, model); }),
                        {"is corrupt (its header claims 1152921504606846976 history records"});
        bytes = file_bytes(file);
        put_u64(bytes, 60, 0);
        put_u64(bytes, 28, std::uint64_t{17} * Small::param_count);   // optimizer values
        write_bytes(file, bytes);
        require_message(error_message([&] { load_checkpoint(file, model); }), {"is corrupt (its header claims"});
        put_u64(bytes, 28, 0);
        put_u64(bytes, 20, std::uint64_t{1} << 61);   // parameters
        write_bytes(file, bytes);
        require_message(error_message([&] { load_checkpoint(file, model); }),
                        {"was saved from a different model (2305843009213693952 parameters)"});
    }
    REQUIRE(model.parameters() == before);
}

TEST_CASE("a checkpoint with a valid checksum but nonsense content is refused", "[cpu][robust]")
{
    TempDir dir;
    const fs::path good = dir / "good.ckpt", bad = dir / "bad.ckpt";
    const auto set = synthetic_dataset(32, Small::input_shape::size, 1, 3, 2);
    Small trained{Device::cpu(), 1};
    SGD opt{{.lr = 0.05f, .momentum = 0.9f}};
    Trainer first{trained, opt, quiet({.batch_size = 8, .epochs = 2, .checkpoint = good})};
    first.fit(set);
    const auto bytes = file_bytes(good);
    const std::size_t records = 88, params = 88 + 2 * 40;   // offsets
    REQUIRE(bytes.size() == params + 4 * 2 * Small::param_count + 4);

    Small model{Device::cpu(), 2};
    const auto before = model.parameters();
    auto resume = [&](std::size_t epochs) {
        Trainer t{model, opt, quiet({.batch_size = 8, .epochs = epochs, .checkpoint = bad, .resume = true})};
        return error_message([&] { t.fit(set); });
    };
    auto forged = [&](auto&& edit) {
        auto b = bytes;
        edit(b);
        reseal(b);
        write_bytes(bad, b);
    };

    SECTION("epoch 2^64 - 1") {
        forged([](auto& b) { put_u64(b, 36, ~std::uint64_t{0}); });
        require_message(resume(5), {"was saved after epoch 18446744073709551615, but this run has 5 epochs",
                                    "pass more epochs (--epochs)"});
    }
    SECTION("more epochs than the run") {
        write_bytes(bad, bytes);
        require_message(resume(1), {"was saved after epoch 2, but this run has 1 epochs"});
    }
    SECTION("a step that does not match the epochs") {
        forged([](auto& b) { put_u64(b, 44, 7); });
        require_message(resume(3), {"holds step 7 after epoch 2, but this run takes 4 steps per epoch"});
    }
    SECTION("more history than epochs") {
        forged([](auto& b) { put_u64(b, 36, 1); put_u64(b, 44, 4); });
        require_message(resume(3), {"has a valid checksum but holds 2 history records after 1 epochs"});
    }
    SECTION("a history record out of order") {
        forged([&](auto& b) { put_u64(b, records + 40, 1); });
        require_message(resume(3), {"has a valid checksum but its history record for epoch 1 makes no sense"});
    }
    SECTION("optimizer state of the wrong size") {
        // Twice the state SGD keeps: the header, the sizes and the checksum all agree.
        auto b = bytes;
        const std::vector<unsigned char> state(b.end() - 4 - 4 * Small::param_count, b.end() - 4);
        b.insert(b.end() - 4, state.begin(), state.end());
        put_u64(b, 28, 2 * Small::param_count);
        reseal(b);
        write_bytes(bad, b);
        require_message(resume(3), {"holds " + std::to_string(2 * Small::param_count) + " optimizer values",
                                    "this optimizer keeps 1 per trainable parameter",
                                    "resume with the optimizer that saved it"});
    }
    SECTION("a NaN parameter") {
        forged([&](auto& b) {
            const float nan = std::nanf("");
            std::memcpy(b.data() + params + 4 * 3, &nan, 4);
        });
        require_message(resume(3), {"has a valid checksum but parameter 3 is nan"});
    }
    SECTION("an infinite optimizer value") {
        forged([&](auto& b) {
            const float inf = std::numeric_limits<float>::infinity();
            std::memcpy(b.data() + params + 4 * Small::param_count + 4, &inf, 4);
        });
        require_message(resume(3), {"has a valid checksum but optimizer value 1 is inf"});
    }
    REQUIRE(model.parameters() == before);
    REQUIRE(model.optimizer_state().empty());
}

namespace {

core::TuningKey tuning_key(std::uint64_t n)
{
    return {"convolution", {"NVIDIA H200 sm90 132", "13000 580.95.05", 13000, 91400, 130100, 200}, {n, 3, 224, 224}};
}
core::TuningValue tuning_value(std::uint64_t n) { return {n, n + 1, 0x7ff0000000000000ull}; }

std::size_t lines_of(const std::ostringstream& log)
{
    const std::string s = log.str();
    return std::size_t(std::count(s.begin(), s.end(), '\n'));
}

} // namespace

TEST_CASE("the tuning cache keeps records for a later run, in a folder it makes, and finds only equal keys",
          "[cpu][robust][tuning]")
{
    TempDir dir;
    const fs::path folder = dir / "not" / "yet";
    std::ostringstream log;
    {
        core::TuningCache cache(folder);
        REQUIRE(cache.file() == folder / "tuning.bin");
        CHECK_FALSE(cache.find(tuning_key(1), log));   // no file yet: nothing to say
        cache.record(tuning_key(1), tuning_value(1), log);
        cache.record(tuning_key(2), tuning_value(2), log);
        CHECK(cache.find(tuning_key(2), log) == tuning_value(2));
    }
    REQUIRE(fs::is_regular_file(folder / "tuning.bin"));
    core::TuningCache later(folder);
    CHECK(later.find(tuning_key(1), log) == tuning_value(1));
    CHECK(later.find(tuning_key(2), log) == tuning_value(2));
    CHECK_FALSE(later.find(tuning_key(3), log));
    // Each part of the key: another GPU, driver, library version or shape finds nothing.
    auto changed = [&](auto change) {
        core::TuningKey k = tuning_key(1);
        change(k);
        return later.find(k, log);
    };
    CHECK_FALSE(changed([](core::TuningKey& k) { k.kind = "product"; }));
    CHECK_FALSE(changed([](core::TuningKey& k) { k.environment.device = "NVIDIA H100 80GB HBM3 sm90 132"; }));
    CHECK_FALSE(changed([](core::TuningKey& k) { k.environment.device = "NVIDIA H200 sm90 66"; }));   // a MIG slice
    CHECK_FALSE(changed([](core::TuningKey& k) { k.environment.driver = "13000 580.95.06"; }));
    CHECK_FALSE(changed([](core::TuningKey& k) { k.environment.driver = "13010 580.95.05"; }));
    CHECK_FALSE(changed([](core::TuningKey& k) { k.environment.runtime = 13010; }));
    CHECK_FALSE(changed([](core::TuningKey& k) { k.environment.cudnn = 91500; }));
    CHECK_FALSE(changed([](core::TuningKey& k) { k.environment.cublas = 130200; }));
    CHECK_FALSE(changed([](core::TuningKey& k) { k.environment.library = 201; }));
    CHECK_FALSE(changed([](core::TuningKey& k) { k.shape[3] = 225; }));
    CHECK_FALSE(changed([](core::TuningKey& k) { k.shape.push_back(0); }));
    CHECK(changed([](core::TuningKey&) {}) == tuning_value(1));
    CHECK(log.str().empty());

    // The bytes round-trip whole.
    core::TuningRecords read;
    REQUIRE(core::decode_tuning_records(file_bytes(folder / "tuning.bin"), read) == "");
    CHECK(read == core::TuningRecords{{tuning_key(1), tuning_value(1)}, {tuning_key(2), tuning_value(2)}});
    CHECK(core::encode_tuning_records(read) == file_bytes(folder / "tuning.bin"));
}

TEST_CASE("the tuning cache's folder: the option, else REPLICA_CACHE_DIR, else XDG_CACHE_HOME, else HOME",
          "[cpu][robust][tuning]")
{
    auto saved = [](const char* name) -> std::optional<std::string> {
        const char* v = std::getenv(name);
        return v ? std::optional<std::string>(v) : std::nullopt;
    };
    const auto replica_dir = saved("REPLICA_CACHE_DIR"), xdg = saved("XDG_CACHE_HOME"), home = saved("HOME");
    ::setenv("REPLICA_CACHE_DIR", "/tmp/r", 1);
    ::setenv("XDG_CACHE_HOME", "/tmp/x", 1);
    ::setenv("HOME", "/tmp/h", 1);
    CHECK(core::tuning_cache_folder("/opt/mine") == fs::path("/opt/mine"));
    CHECK(core::tuning_cache_folder() == fs::path("/tmp/r"));
    ::unsetenv("REPLICA_CACHE_DIR");
    CHECK(core::tuning_cache_folder() == fs::path("/tmp/x/replica"));
    ::setenv("XDG_CACHE_HOME", "relative", 1);   // not absolute: ignored, as the XDG specification says
    CHECK(core::tuning_cache_folder() == fs::path("/tmp/h/.cache/replica"));
    ::unsetenv("XDG_CACHE_HOME");
    CHECK(core::tuning_cache_folder() == fs::path("/tmp/h/.cache/replica"));
    ::unsetenv("HOME");
    CHECK(core::tuning_cache_folder().empty());
    auto restore = [](const char* name, const std::optional<std::string>& v) {
        if (v) ::setenv(name, v->c_str(), 1);
        else ::unsetenv(name);
    };
    restore("REPLICA_CACHE_DIR", replica_dir);
    restore("XDG_CACHE_HOME", xdg);
    restore("HOME", home);
}

TEST_CASE("a tuning cache file that is not whole is ignored with one log line, never trusted, and rewritten",
          "[cpu][robust][tuning]")
{
    TempDir dir;
    const fs::path file = dir / "tuning.bin";
    {
        std::ostringstream quiet;
        core::TuningCache cache(dir.path());
        cache.record(tuning_key(1), tuning_value(1), quiet);
        REQUIRE(quiet.str().empty());
    }
    const std::vector<unsigned char> good = file_bytes(file);
    REQUIRE(good.size() > 100);
    auto resealed = [](std::vector<unsigned char> b) {   // a valid checksum over what the bytes now say
        put_u64(b, b.size() - 8, core::detail::fnv1a(std::span(b).first(b.size() - 8)));
        return b;
    };

    // The bytes at `file`: ignored with one line that names why; the next record rewrites the file
    // whole, without a second line, and only what was recorded since is in it.
    auto ignored = [&](const std::vector<unsigned char>& bytes, std::string_view why) {
        write_bytes(file, bytes);
        std::ostringstream log;
        core::TuningCache cache(dir.path());
        CHECK_FALSE(cache.find(tuning_key(1), log));
        CHECK(lines_of(log) == 1);
        CHECK(log.str().rfind("replica: tuning cache " + file.string() + " ignored (", 0) == 0);
        CHECK(log.str().find(why) != std::string::npos);
        cache.record(tuning_key(2), tuning_value(2), log);
        CHECK(lines_of(log) == 1);
        std::ostringstream again;
        core::TuningCache later(dir.path());
        CHECK(later.find(tuning_key(2), again) == tuning_value(2));
        CHECK_FALSE(later.find(tuning_key(1), again));
        CHECK(again.str().empty());
    };
    SECTION("cut short") {
        for (std::size_t size : {std::size_t{0}, std::size_t{5}, std::size_t{19}, good.size() / 2, good.size() - 1}) {
            CAPTURE(size);
            ignored(std::vector<unsigned char>(good.begin(), good.begin() + std::ptrdiff_t(size)), "cut short");
        }
    }
    SECTION("any byte changed") {
        for (std::size_t at = 0; at < good.size(); ++at) {
            CAPTURE(at);
            auto b = good;
            b[at] ^= 0x10;
            ignored(b, "");
        }
    }
    SECTION("the wrong magic") {
        auto b = good;
        b[0] = 'X';
        ignored(b, "it is not a tuning cache");
    }
    SECTION("another format version") {
        auto b = good;
        b[8] = 2;
        ignored(resealed(b), "its format is version 2, this library reads version 1");
    }
    SECTION("garbage") {
        std::vector<unsigned char> b(4096);
        for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<unsigned char>((i * 2654435761u) >> 13);
        ignored(b, "it is not a tuning cache");
        b.assign(good.begin(), good.begin() + 8);   // the magic, then garbage
        b.resize(4096, 0xa5);
        ignored(b, "");
    }
    SECTION("a valid checksum over records that are not there, or bytes after them") {
        auto more = good;
        more[12] = 2;   // two records claimed, one there
        ignored(resealed(more), "record 1 of 2 runs past the end");
        auto huge = good;
        huge[15] = 0x7f;
        ignored(resealed(huge), "records");
        auto longer = good;
        longer.insert(longer.end() - 8, {1, 2, 3});
        ignored(resealed(longer), "3 bytes follow the last record");
        auto length = good;
        length[16] = 0xff;   // the first string's length
        length[17] = 0xff;
        ignored(resealed(length), "record 0 of 1 runs past the end");
    }
    SECTION("a folder where the file should be") {
        fs::remove(file);
        fs::create_directory(file);
        std::ostringstream log;
        core::TuningCache cache(dir.path());
        CHECK_FALSE(cache.find(tuning_key(1), log));
        CHECK(lines_of(log) == 1);
        CHECK(log.str().find("it is not a regular file") != std::string::npos);
        cache.record(tuning_key(2), tuning_value(2), log);   // cannot replace a folder: one more line, no throw
        CHECK(lines_of(log) == 2);
        CHECK(log.str().find(" not written (") != std::string::npos);
        CHECK(cache.find(tuning_key(2), log) == tuning_value(2));
    }
}

TEST_CASE("a tuning cache folder that cannot be written costs one log line, never an exception", "[cpu][robust][tuning]")
{
    TempDir dir;
    write_bytes(dir / "a-file", {1, 2, 3});
    auto unwritable = [](const fs::path& folder) {
        std::ostringstream log;
        core::TuningCache cache(folder);
        for (std::uint64_t i = 0; i < 3; ++i) REQUIRE_NOTHROW(cache.record(tuning_key(i), tuning_value(i), log));
        CHECK(lines_of(log) == 1);
        CHECK(log.str().rfind("replica: tuning cache " + (folder / "tuning.bin").string() + " not written (", 0) == 0);
        CHECK(log.str().find("kept for this process only") != std::string::npos);
        for (std::uint64_t i = 0; i < 3; ++i) CHECK(cache.find(tuning_key(i), log) == tuning_value(i));   // in memory
        CHECK(lines_of(log) == 1);
    };
    unwritable(dir / "a-file" / "cache");   // a file in the way of the folder: root cannot write there either
    if (::geteuid() != 0) {                  // permissions bind everyone but root
        fs::create_directory(dir / "read-only");
        fs::permissions(dir / "read-only", fs::perms::owner_read | fs::perms::owner_exec);
        unwritable(dir / "read-only");
        fs::permissions(dir / "read-only", fs::perms::owner_all);
    }
}

TEST_CASE("two writers of one tuning cache: a reader sees a whole file, each write keeps what it read",
          "[cpu][robust][tuning]")
{
    TempDir dir;
    std::ostringstream log;
    {
        core::TuningCache a(dir.path()), b(dir.path());
        CHECK_FALSE(a.find(tuning_key(1), log));
        CHECK_FALSE(b.find(tuning_key(1), log));   // both read the empty folder first
        a.record(tuning_key(1), tuning_value(1), log);
        b.record(tuning_key(2), tuning_value(2), log);   // reads a's record before it writes
        a.record(tuning_key(3), tuning_value(3), log);
        core::TuningCache c(dir.path());
        for (std::uint64_t i = 1; i <= 3; ++i) CHECK(c.find(tuning_key(i), log) == tuning_value(i));
        CHECK(log.str().empty());
    }

    // Writers at once (as MPI ranks would be), each its own object, and a reader meanwhile: every
    // file a reader opens is whole; the last rename's records stay.
    TempDir shared;
    constexpr std::uint64_t kWriters = 4, kEach = 40;
    std::vector<std::ostringstream> logs(kWriters + 1);
    std::atomic<bool> done{false};
    std::thread reader([&] {
        while (!done) {
            core::TuningCache r(shared.path());
            r.find(tuning_key(0), logs[kWriters]);
        }
    });
    std::vector<std::thread> writers;
    for (std::uint64_t w = 0; w < kWriters; ++w)
        writers.emplace_back([&, w] {
            core::TuningCache cache(shared.path());
            for (std::uint64_t i = 0; i < kEach; ++i) cache.record(tuning_key(w * 1000 + i), tuning_value(w * 1000 + i), logs[w]);
        });
    for (auto& t : writers) t.join();
    done = true;
    reader.join();
    for (const auto& l : logs) CHECK(l.str().empty());
    core::TuningRecords records;
    REQUIRE(core::decode_tuning_records(file_bytes(shared / "tuning.bin"), records) == "");
    CHECK(records.size() >= kEach);   // at least the last writer's, every one of them
    // How many records survive depends on the threads' order: one assertion each, whatever the count,
    // so that every run of the suite counts the same assertions.
    std::size_t wrong = 0, others = 0;
    for (const auto& [key, value] : records) wrong += value == tuning_value(key.shape[0]) ? 0 : 1;
    CHECK(wrong == 0);
    for (const auto& entry : fs::directory_iterator(shared.path()))   // no temporary file left behind
        others += entry.path().filename() == "tuning.bin" ? 0 : 1;
    CHECK(others == 0);
}

} // namespace test_robust
