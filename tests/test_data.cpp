// Data: IDX files, Fashion-MNIST, the batch loader, synthetic data sets, byte-level token files.

#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "catch.hpp"
#include "support.hpp"
#include "replica/data/fashion_mnist.hpp"
#include "replica/data/idx.hpp"
#include "replica/data/loader.hpp"
#include "replica/data/synthetic.hpp"
#include "replica/data/token_file.hpp"

// The runner compiles the test files in groups (tests/meson.build): this file's names stay in its own
// namespace.
namespace test_data {

namespace fs = std::filesystem;
using namespace replica;


using replica::testing::TempDir;
using replica::testing::file_bytes;
using replica::testing::write_bytes;

using replica::testing::error_message;

// `expr` throws replica::Error whose message contains `text`.
#define REQUIRE_ERROR(expr, text)                                                                      \
    do {                                                                                               \
        std::string message_ = error_message([&] { (void)(expr); });                                        \
        INFO(message_);                                                                                \
        REQUIRE(message_.find(text) != std::string::npos);                                             \
    } while (0)

namespace {

// A fresh directory under the system temp directory, removed with its files at scope exit.

void write_gz(const fs::path& file, const std::vector<std::uint8_t>& bytes)
{
    gzFile gz = gzopen(file.string().c_str(), "wb");
    REQUIRE(gz != nullptr);
    REQUIRE(gzwrite(gz, bytes.data(), unsigned(bytes.size())) == int(bytes.size()));
    REQUIRE(gzclose(gz) == Z_OK);
}

bool near(float a, float b) { return std::abs(a - b) <= 1e-6f * (1.0f + std::abs(b)); }

std::vector<std::uint8_t> iota_bytes(std::size_t n)
{
    std::vector<std::uint8_t> bytes(n);
    for (std::size_t i = 0; i < n; ++i) bytes[i] = std::uint8_t(i * 7 % 256);
    return bytes;
}

// A Fashion-MNIST split of n images (n, side, side) and `labels` in `dir`, as plain IDX files.
void write_fashion_split(const TempDir& dir, const std::string& prefix, std::size_t n, std::size_t side,
                         const std::vector<std::uint8_t>& labels)
{
    write_idx(dir / (prefix + "-images-idx3-ubyte"), {n, side, side}, iota_bytes(n * side * side));
    write_idx(dir / (prefix + "-labels-idx1-ubyte"), {labels.size()}, labels);
}

} // namespace

TEST_CASE("IDX files round-trip, plain and gzip-compressed", "[cpu][data]")
{
    TempDir dir;
    const std::vector<std::size_t> dims{2, 3, 4};
    const std::vector<std::uint8_t> bytes = iota_bytes(24);
    write_idx(dir / "a-idx3-ubyte", dims, bytes);
    write_gz(dir / "a-idx3-ubyte.gz", file_bytes(dir / "a-idx3-ubyte"));

    for (const char* name : {"a-idx3-ubyte", "a-idx3-ubyte.gz"}) {
        INFO(name);
        IdxArray a = read_idx(dir / name);
        CHECK(a.dims == dims);
        CHECK(a.bytes == bytes);
        CHECK(a.file == dir / name);
    }
    CHECK(fs::file_size(dir / "a-idx3-ubyte") == 4 + 3 * 4 + 24);

    write_idx(dir / "one", {1}, {255});
    CHECK(read_idx(dir / "one").bytes == std::vector<std::uint8_t>{255});
    REQUIRE_ERROR(write_idx(dir / "bad", {2, 2}, {1, 2, 3}), "do not match");
}

TEST_CASE("read_idx refuses broken files with a message naming the file", "[cpu][data]")
{
    TempDir dir;
    write_idx(dir / "good", {10, 5}, iota_bytes(50));
    const std::vector<std::uint8_t> good = file_bytes(dir / "good");

    SECTION("missing file")
    {
        const fs::path missing = dir / "no-such-file-idx1-ubyte.gz";
        REQUIRE_ERROR(read_idx(missing), missing.string());
        REQUIRE_ERROR(read_idx(missing), "not found");
        REQUIRE_ERROR(read_idx(missing), "dataset-fashion-mnist");
    }
    SECTION("truncated data")
    {
        write_bytes(dir / "short", std::vector<std::uint8_t>(good.begin(), good.end() - 5));
        REQUIRE_ERROR(read_idx(dir / "short"), "truncated");
        REQUIRE_ERROR(read_idx(dir / "short"), "promises 50 bytes");
        REQUIRE_ERROR(read_idx(dir / "short"), (dir / "short").string());
    }
    SECTION("truncated header")
    {
        write_bytes(dir / "header", std::vector<std::uint8_t>(good.begin(), good.begin() + 6));
        REQUIRE_ERROR(read_idx(dir / "header"), "truncated");
        write_bytes(dir / "magic", {0, 0});
        REQUIRE_ERROR(read_idx(dir / "magic"), "truncated");
    }
    SECTION("bad magic")
    {
        std::vector<std::uint8_t> bytes = good;
        bytes[0] = 0x50;
        write_bytes(dir / "magic", bytes);
        REQUIRE_ERROR(read_idx(dir / "magic"), "not an IDX file");
        REQUIRE_ERROR(read_idx(dir / "magic"), (dir / "magic").string());
    }
    SECTION("another element type")
    {
        std::vector<std::uint8_t> bytes = good;
        bytes[2] = 0x0D;
        write_bytes(dir / "float", bytes);
        REQUIRE_ERROR(read_idx(dir / "float"), "0x0D (float32)");
        REQUIRE_ERROR(read_idx(dir / "float"), "only unsigned bytes");
    }
    SECTION("no dims")
    {
        write_bytes(dir / "rank0", {0, 0, 8, 0, 1, 2, 3});
        REQUIRE_ERROR(read_idx(dir / "rank0"), "0 dims");
    }
    SECTION("more data than the dims promise")
    {
        std::vector<std::uint8_t> bytes = good;
        bytes.push_back(1);
        write_bytes(dir / "long", bytes);
        REQUIRE_ERROR(read_idx(dir / "long"), "more data");
    }
    SECTION("corrupt gzip stream")
    {
        write_gz(dir / "good.gz", good);
        const std::vector<std::uint8_t> gz = file_bytes(dir / "good.gz");
        REQUIRE(gz.size() > 18);
        write_bytes(dir / "cut.gz", std::vector<std::uint8_t>(gz.begin(), gz.end() - 4));
        REQUIRE_ERROR(read_idx(dir / "cut.gz"), "corrupt gzip stream");
        REQUIRE_ERROR(read_idx(dir / "cut.gz"), (dir / "cut.gz").string());
        std::vector<std::uint8_t> flipped = gz;
        flipped[gz.size() - 6] ^= 0xFF; // in the CRC-32 of the trailer
        write_bytes(dir / "crc.gz", flipped);
        REQUIRE_ERROR(read_idx(dir / "crc.gz"), "corrupt gzip stream");
    }
}

TEST_CASE("make_dataset normalises pixels and checks labels", "[cpu][data]")
{
    IdxArray images{{2, 1, 2}, {0, 255, 51, 102}, {}};
    IdxArray labels{{2}, {3, 0}, {}};
    Dataset set = make_dataset(images, labels, 0.5f, 0.25f, 4);
    CHECK(set.count == 2);
    CHECK(set.input_size == 2);
    CHECK(set.label_size == 1);
    CHECK(set.labels == std::vector<std::int32_t>{3, 0});
    CHECK(near(set.inputs[0], -2.0f));
    CHECK(near(set.inputs[1], 2.0f));
    CHECK(near(set.inputs[2], (0.2f - 0.5f) / 0.25f));
    CHECK(near(set.inputs[3], (0.4f - 0.5f) / 0.25f));

    REQUIRE_ERROR(make_dataset(images, labels, 0.5f, 0.25f, 3), "label 3 at index 0");
    IdxArray three{{3}, {0, 0, 0}, {}};
    REQUIRE_ERROR(make_dataset(images, three, 0.5f, 0.25f, 4), "has 2 images but 3 labels");
    REQUIRE_ERROR(make_dataset(images, labels, 0.5f, 0.0f, 4), "standard deviation");
}

TEST_CASE("load_fashion_mnist reads and validates a directory of IDX files", "[cpu][data]")
{
    TempDir dir;
    const float black = (0.0f - data::fashion_mnist_mean) / data::fashion_mnist_std;

    SECTION("plain files, and .gz preferred when both exist")
    {
        write_fashion_split(dir, "t10k", 3, 28, {9, 0, 4});
        Dataset set = load_fashion_mnist(Split::test, dir.path());
        CHECK(set.count == 3);
        CHECK(set.input_size == 784);
        CHECK(set.label_size == 1);
        CHECK(set.labels == std::vector<std::int32_t>{9, 0, 4});
        CHECK(near(set.inputs[0], black));

        write_gz(dir / "t10k-labels-idx1-ubyte.gz", file_bytes(dir / "t10k-labels-idx1-ubyte"));
        write_idx(dir / "t10k-labels-idx1-ubyte", {3}, {1, 1, 1}); // the plain file now differs
        CHECK(load_fashion_mnist(Split::test, dir.path()).labels == std::vector<std::int32_t>{9, 0, 4});
    }
    SECTION("image and label counts differ")
    {
        write_fashion_split(dir, "train", 3, 28, {1, 2});
        REQUIRE_ERROR(load_fashion_mnist(Split::train, dir.path()), "has 3 images but 2 labels");
    }
    SECTION("label out of range")
    {
        write_fashion_split(dir, "train", 3, 28, {1, 12, 2});
        const std::string labels = (dir / "train-labels-idx1-ubyte").string();
        REQUIRE_ERROR(load_fashion_mnist(Split::train, dir.path()),
                      "label 12 at index 1 in " + labels + " is not a Fashion-MNIST class (0-9)");
    }
    SECTION("images of another size")
    {
        write_fashion_split(dir, "train", 2, 27, {1, 2});
        REQUIRE_ERROR(load_fashion_mnist(Split::train, dir.path()), "(N, 28, 28)");
    }
    SECTION("missing files")
    {
        REQUIRE_ERROR(load_fashion_mnist(Split::train, dir.path()), "train-images-idx3-ubyte.gz");
        REQUIRE_ERROR(load_fashion_mnist(Split::train, dir.path()), "not found");
        REQUIRE_ERROR(load_fashion_mnist(Split::train, dir.path()), dir.path().string());
    }
}

TEST_CASE("REPLICA_FASHION_MNIST_DIR overrides the default directory", "[cpu][data]")
{
    const char* old = std::getenv("REPLICA_FASHION_MNIST_DIR");
    const std::optional<std::string> saved = old ? std::optional<std::string>(old) : std::nullopt;
    struct Restore {
        const std::optional<std::string>& saved;
        ~Restore()
        {
            if (saved) setenv("REPLICA_FASHION_MNIST_DIR", saved->c_str(), 1);
            else unsetenv("REPLICA_FASHION_MNIST_DIR");
        }
    } restore{saved};

    unsetenv("REPLICA_FASHION_MNIST_DIR");
    CHECK(default_fashion_mnist_dir() == fs::path("/usr/share/datasets/fashion-mnist"));
    setenv("REPLICA_FASHION_MNIST_DIR", "/somewhere/else", 1);
    CHECK(default_fashion_mnist_dir() == fs::path("/somewhere/else"));
    setenv("REPLICA_FASHION_MNIST_DIR", "", 1);
    CHECK(default_fashion_mnist_dir() == fs::path("/usr/share/datasets/fashion-mnist"));
}

TEST_CASE("Fashion-MNIST loads with the expected sizes and statistics", "[cpu][data][fashion-mnist]")
{
    const fs::path dir = default_fashion_mnist_dir();
    if (!fs::exists(dir))
        REPLICA_SKIP("Fashion-MNIST not found in " << dir.string()
                                                   << ": install Debian's dataset-fashion-mnist to run this test");

    Dataset train = load_fashion_mnist(Split::train);
    Dataset test = load_fashion_mnist(Split::test, dir);
    CHECK(train.count == 60000);
    CHECK(test.count == 10000);
    for (const Dataset* set : {&train, &test}) {
        CHECK(set->input_size == 784);
        CHECK(set->label_size == 1);
        REQUIRE(set->inputs.size() == set->count * 784);
        REQUIRE(set->labels.size() == set->count);
        std::vector<std::size_t> per_class(10, 0);
        for (std::int32_t label : set->labels) {
            REQUIRE(label >= 0);
            REQUIRE(label < 10);
            ++per_class[std::size_t(label)];
        }
        for (std::size_t n : per_class) CHECK(n == set->count / 10); // the classes are balanced
    }

    double sum = 0, sum_sq = 0;
    for (float x : train.inputs) {
        sum += x;
        sum_sq += double(x) * x;
    }
    const double n = double(train.inputs.size());
    const double mean = sum / n;
    const double stddev = std::sqrt(sum_sq / n - mean * mean);
    CHECK(std::abs(mean) < 0.01);
    CHECK(std::abs(stddev - 1.0) < 0.01);
}

namespace {

// n samples; sample i has inputs (3 i, 3 i + 1, 3 i + 2) and label i, so a batch says which samples it holds.
Dataset numbered_dataset(std::size_t n)
{
    Dataset set;
    set.count = n;
    set.input_size = 3;
    set.label_size = 1;
    for (std::size_t i = 0; i < n; ++i) {
        for (std::size_t e = 0; e < 3; ++e) set.inputs.push_back(float(3 * i + e));
        set.labels.push_back(std::int32_t(i));
    }
    return set;
}

// The samples of one epoch in the order the loader gives them, checking each batch on the way.
std::vector<std::size_t> run_epoch(Loader& loader, const Dataset& set, std::uint64_t epoch, std::uint64_t seed)
{
    loader.start_epoch(epoch);
    std::vector<std::size_t> seen;
    std::size_t k = 0;
    while (std::optional<Batch> batch = loader.next()) {
        INFO("batch " << k);
        CHECK(batch->first_sample == epoch * set.count + k * loader.batch_size());
        CHECK(batch->seed == seed);
        REQUIRE(batch->size > 0);
        REQUIRE(batch->size <= loader.batch_size());
        if (k + 1 < loader.batches_per_epoch()) CHECK(batch->size == loader.batch_size());
        for (std::size_t i = 0; i < batch->size; ++i) {
            const std::size_t sample = std::size_t(batch->labels[i]);
            REQUIRE(sample < set.count);
            for (std::size_t e = 0; e < 3; ++e) REQUIRE(batch->inputs[i * 3 + e] == float(3 * sample + e));
            seen.push_back(sample);
        }
        ++k;
    }
    CHECK(k == loader.batches_per_epoch());
    CHECK(!loader.next()); // and stays at the end
    return seen;
}

std::vector<std::size_t> sorted(std::vector<std::size_t> v)
{
    std::sort(v.begin(), v.end());
    return v;
}

std::vector<std::size_t> iota(std::size_t n)
{
    std::vector<std::size_t> v(n);
    std::iota(v.begin(), v.end(), std::size_t{0});
    return v;
}

} // namespace

TEST_CASE("Loader visits every sample exactly once per epoch", "[cpu][data][loader]")
{
    const Dataset set = numbered_dataset(103);
    for (std::size_t batch_size : {1, 7, 32, 103}) {
        for (bool shuffle : {true, false}) {
            INFO("batch size " << batch_size << ", shuffle " << shuffle);
            Loader loader(set, batch_size, 42, shuffle);
            CHECK(loader.batches_per_epoch() == (103 + batch_size - 1) / batch_size);
            for (std::uint64_t epoch : {0, 1, 5}) {
                std::vector<std::size_t> seen = run_epoch(loader, set, epoch, 42);
                CHECK(sorted(seen) == iota(103));
                if (!shuffle) CHECK(seen == iota(103));
            }
        }
    }
}

TEST_CASE("Loader's last batch holds the rest, or is dropped with drop_last", "[cpu][data][loader]")
{
    const Dataset set = numbered_dataset(103);
    {
        Loader loader(set, 10, 7);
        REQUIRE(loader.batches_per_epoch() == 11);
        loader.start_epoch(2);
        std::optional<Batch> last;
        while (std::optional<Batch> batch = loader.next()) last = batch;
        REQUIRE(last);
        CHECK(last->size == 3);
        CHECK(last->first_sample == 2 * 103 + 100);
    }
    {
        Loader loader(set, 10, 7, true, true);
        REQUIRE(loader.batches_per_epoch() == 10);
        std::vector<std::size_t> seen = run_epoch(loader, set, 2, 7);
        CHECK(seen.size() == 100);
        std::vector<std::size_t> unique = sorted(seen);
        CHECK(std::adjacent_find(unique.begin(), unique.end()) == unique.end());
        // The samples left out are the epoch's last three, so they change with the epoch.
        std::vector<std::size_t> order(103);
        epoch_order(7, 2, order);
        CHECK(seen == std::vector<std::size_t>(order.begin(), order.begin() + 100));
    }
    {
        Loader loader(set, 103, 7, true, true);
        CHECK(loader.batches_per_epoch() == 1);
    }
    REQUIRE_ERROR(Loader(set, 104, 7, true, true), "no batch");
}

TEST_CASE("Loader's order is a function of (seed, epoch) only", "[cpu][data][loader]")
{
    const Dataset set = numbered_dataset(103);
    Loader a(set, 10, 1234);
    Loader b(set, 32, 1234);
    Loader other_seed(set, 10, 4321);

    // a runs epochs 0..3 in turn; b jumps straight to 3 and back to 1, with another batch size.
    std::vector<std::vector<std::size_t>> epochs;
    for (std::uint64_t e = 0; e < 4; ++e) epochs.push_back(run_epoch(a, set, e, 1234));
    CHECK(run_epoch(b, set, 3, 1234) == epochs[3]);
    CHECK(run_epoch(b, set, 1, 1234) == epochs[1]);
    CHECK(run_epoch(a, set, 0, 1234) == epochs[0]);

    std::vector<std::size_t> order(103);
    epoch_order(1234, 3, order);
    CHECK(order == epochs[3]);

    for (std::size_t e = 1; e < epochs.size(); ++e) CHECK(epochs[e] != epochs[0]);
    CHECK(run_epoch(other_seed, set, 0, 4321) != epochs[0]);
    CHECK(epochs[0] != iota(103));

    // An epoch abandoned halfway does not change the next one.
    a.start_epoch(2);
    REQUIRE(a.next());
    REQUIRE(a.next());
    CHECK(run_epoch(a, set, 2, 1234) == epochs[2]);
}

TEST_CASE("Loader refuses bad arguments", "[cpu][data][loader]")
{
    const Dataset set = numbered_dataset(5);
    REQUIRE_ERROR(Loader(set, 0, 1), "batch size > 0");
    REQUIRE_ERROR(Loader(Dataset{}, 4, 1), "empty");
    REQUIRE_ERROR(Loader(set, 6, 1), "batch size 6 is larger than the data set's 5 samples");
    REQUIRE_ERROR(Loader(set, std::size_t{1} << 62, 1), "use a batch size of at most 5");
    Dataset lying = set;
    lying.count = std::size_t{1} << 63;   // count x input_size wraps around
    REQUIRE_ERROR(Loader(lying, 2, 1), "does not fit in a 64-bit size");
    Dataset nan = set;
    nan.inputs[3] = std::nanf("");
    REQUIRE_ERROR(Loader(nan, 2, 1), "is nan; every input must be a finite number");
    Loader loader(set, 2, 1);
    REQUIRE_ERROR(loader.next(), "start_epoch");
}

TEST_CASE("Loader's batch stays valid while the two next ones are fetched and gathered", "[cpu][data][loader]")
{
    const Dataset set = synthetic_dataset(1000, 256, 1, 10, 3);
    Loader loader(set, 100, 9);
    std::vector<std::size_t> order(1000);
    epoch_order(9, 0, order);
    auto intact = [&](const Batch& b, std::size_t k) {
        for (std::size_t i = 0; i < b.size; ++i) {
            const std::size_t s = order[k * 100 + i];
            REQUIRE(std::equal(b.inputs + i * 256, b.inputs + (i + 1) * 256, set.inputs.begin() + s * 256));
            REQUIRE(b.labels[i] == set.labels[s]);
        }
    };
    loader.start_epoch(0);
    std::size_t k = 0;
    std::optional<Batch> previous;
    while (std::optional<Batch> batch = loader.next()) {
        // The worker is now writing batch k + 1 into a third buffer: batches k - 1 and k must be intact.
        if (previous) intact(*previous, k - 1);
        intact(*batch, k);
        previous = batch;
        ++k;
    }
    CHECK(k == 10);
}

TEST_CASE("synthetic_dataset is deterministic and not all zero", "[cpu][data]")
{
    const Dataset a = synthetic_dataset(50, 20, 2, 7, 99);
    const Dataset b = synthetic_dataset(50, 20, 2, 7, 99);
    const Dataset c = synthetic_dataset(50, 20, 2, 7, 100);
    CHECK(a.count == 50);
    CHECK(a.input_size == 20);
    CHECK(a.label_size == 2);
    REQUIRE(a.inputs.size() == 50 * 20);
    REQUIRE(a.labels.size() == 50 * 2);
    CHECK(a.inputs == b.inputs);
    CHECK(a.labels == b.labels);
    CHECK(a.inputs != c.inputs);
    CHECK(a.labels != c.labels);

    CHECK(std::any_of(a.inputs.begin(), a.inputs.end(), [](float x) { return x != 0.0f; }));
    CHECK(std::all_of(a.inputs.begin(), a.inputs.end(), [](float x) { return x >= -1.0f && x < 1.0f; }));
    CHECK(std::all_of(a.labels.begin(), a.labels.end(), [](std::int32_t y) { return y >= 0 && y < 7; }));
    const auto [lo, hi] = std::minmax_element(a.inputs.begin(), a.inputs.end());
    CHECK(*lo < -0.8f); // spread over [-1, 1)
    CHECK(*hi > 0.8f);
    std::vector<std::size_t> per_class(7, 0);
    for (std::int32_t y : a.labels) ++per_class[std::size_t(y)];
    CHECK(std::count(per_class.begin(), per_class.end(), std::size_t{0}) == 0);

    // A prefix of a larger set is the smaller set: sample s depends on (seed, s) only.
    const Dataset more = synthetic_dataset(60, 20, 2, 7, 99);
    CHECK(std::equal(a.inputs.begin(), a.inputs.end(), more.inputs.begin()));

    REQUIRE_ERROR(synthetic_dataset(0, 20, 1, 7, 1), "> 0");
    REQUIRE_ERROR(synthetic_dataset(5, 20, 1, 0, 1), "> 0");
}

TEST_CASE("Loader::only gathers one process's part of each batch, the same samples as the whole", "[cpu][data][loader]")
{
    const Dataset set = numbered_dataset(50);
    Loader whole(set, 16, 3);   // batches of 16, 16, 16 and 2
    std::vector<std::unique_ptr<Loader>> parts;
    for (std::size_t p = 0; p < 3; ++p) {
        parts.push_back(std::make_unique<Loader>(set, 16, 3));
        parts.back()->only([p](std::size_t n) { return parallel::share(n, 3, p); });
    }
    for (std::uint64_t epoch : {0, 1}) {
        whole.start_epoch(epoch);
        for (auto& l : parts) l->start_epoch(epoch);
        while (auto all = whole.next()) {
            for (std::size_t p = 0; p < 3; ++p) {
                const auto mine = parts[p]->next();
                REQUIRE(mine);
                CHECK(mine->size == all->size);
                CHECK(mine->first_sample == all->first_sample);
                const auto s = parallel::share(all->size, 3, p);
                for (std::size_t i = s.offset; i < s.offset + s.count; ++i) {
                    CHECK(mine->labels[i] == all->labels[i]);
                    CHECK(mine->inputs[3 * i + 2] == all->inputs[3 * i + 2]);
                }
            }
        }
        for (auto& l : parts) CHECK(!l->next());
    }
    Loader bad(set, 16, 3);
    bad.only([](std::size_t n) { return parallel::Share{n - 1, 2}; });
    bad.start_epoch(0);
    CHECK(error_message([&] { bad.next(); }).find("outside the batch") != std::string::npos);
}

namespace {

// n distinct bytes (n <= 256): the first input of a window says where it starts.
std::string distinct_text(std::size_t n)
{
    std::string text(n, '\0');
    for (std::size_t i = 0; i < n; ++i) text[i] = char(static_cast<unsigned char>(i * 5 % 256));
    return text;
}

struct Window {
    std::vector<std::int32_t> input, label;
    bool operator==(const Window&) const = default;
};

Window read_window(const TokenSampleSource& source, std::size_t index, std::uint64_t epoch)
{
    Window w{std::vector<std::int32_t>(source.input_size), std::vector<std::int32_t>(source.label_size)};
    source.read(index, epoch, w.input.data(), w.label.data());
    return w;
}

// Bytes [begin, begin + n) of `text` as ids.
std::vector<std::int32_t> ids_of(std::string_view text, std::size_t begin, std::size_t n)
{
    return TokenFile::encode(text.substr(begin, n));
}

} // namespace

TEST_CASE("TokenFile's training windows: labels shifted by one, in the training part, keyed on (seed, epoch, index)",
          "[cpu][data][tokens]")
{
    static_assert(TokenFile::vocabulary == 256);
    const std::string text = distinct_text(50);
    std::optional<TokenSampleSource> source;
    {
        const TokenFile file = TokenFile::from_text(text, {.validation = 0.2});
        REQUIRE(file.train_size() == 40);
        REQUIRE(file.validation_size() == 10);
        source = file.train(4, 2000, 7);
        CHECK(file.window_start(4, 7, 3, 11) == file.window_start(4, 7, 3, 11));
        // Another TokenFile of the same text gives the same samples.
        const TokenSampleSource again = TokenFile::from_text(text, {.validation = 0.2}).train(4, 2000, 7);
        for (std::size_t index : {0, 1, 999, 1999}) {
            INFO("index " << index);
            CHECK(read_window(again, index, 3) == read_window(*source, index, 3));
            const std::size_t p = file.window_start(4, 7, 3, index);
            CHECK(read_window(*source, index, 3).input == ids_of(text, p, 4));
        }
    }
    // The source shares the text: it outlives the TokenFile.
    CHECK(source->count == 2000);
    CHECK(source->input_size == 4);
    CHECK(source->label_size == 4);
    std::vector<std::size_t> hits(50, 0);
    for (std::size_t index = 0; index < source->count; ++index) {
        const Window w = read_window(*source, index, 0);
        const std::size_t p = text.find(char(w.input[0]));
        INFO("index " << index << ", start " << p);
        REQUIRE(p + 4 < 40); // the last label, byte p + 4, lies in the training part
        CHECK(w.input == ids_of(text, p, 4));
        CHECK(w.label == ids_of(text, p + 1, 4));
        ++hits[p];
    }
    // Every start in [0, 40 - 4 - 1] is drawn (2000 draws over 36 starts: each about 56 times).
    for (std::size_t p = 0; p < 36; ++p) CHECK(hits[p] > 20);
    for (std::size_t p = 36; p < 50; ++p) CHECK(hits[p] == 0);

    // The same (seed, epoch, index), the same sample; another epoch or seed, other samples.
    const TokenSampleSource other_seed = TokenFile::from_text(text, {.validation = 0.2}).train(4, 2000, 8);
    std::size_t same_epoch = 0, same_seed = 0;
    for (std::size_t index = 0; index < 100; ++index) {
        CHECK(read_window(*source, index, 5) == read_window(*source, index, 5));
        same_epoch += read_window(*source, index, 5) == read_window(*source, index, 6);
        same_seed += read_window(*source, index, 5) == read_window(other_seed, index, 5);
    }
    CHECK(same_epoch < 15); // about 100 / 36 by chance
    CHECK(same_seed < 15);
}

TEST_CASE("TokenFile's samples are the same whatever the batch size and the processes' share", "[cpu][data][tokens]")
{
    const TokenFile file = TokenFile::from_text(distinct_text(200));
    const TokenSampleSource source = file.train(8, 60, 11);
    for (std::size_t batch_size : {1, 7, 60}) {
        for (std::size_t parts : {1, 3}) {
            INFO("batch size " << batch_size << ", " << parts << " parts");
            std::vector<std::unique_ptr<TokenLoader>> loaders;
            for (std::size_t part = 0; part < parts; ++part) {
                loaders.push_back(std::make_unique<TokenLoader>(source, batch_size, 11));
                loaders.back()->only([part, parts](std::size_t n) { return parallel::share(n, parts, part); });
            }
            for (std::uint64_t epoch : {0, 2}) {
                std::vector<std::size_t> order(60);
                epoch_order(11, epoch, order);
                for (auto& l : loaders) l->start_epoch(epoch);
                for (std::size_t k = 0; k < loaders[0]->batches_per_epoch(); ++k) {
                    for (std::size_t part = 0; part < parts; ++part) {
                        const auto batch = loaders[part]->next();
                        REQUIRE(batch);
                        const auto mine = parallel::share(batch->size, parts, part);
                        for (std::size_t i = mine.offset; i < mine.offset + mine.count; ++i) {
                            const Window w = read_window(source, order[k * batch_size + i], epoch);
                            REQUIRE(std::vector<std::int32_t>(batch->inputs + i * 8, batch->inputs + (i + 1) * 8) == w.input);
                            REQUIRE(std::vector<std::int32_t>(batch->labels + i * 8, batch->labels + (i + 1) * 8) == w.label);
                        }
                    }
                }
            }
        }
    }
}

TEST_CASE("TokenFile's validation windows are consecutive, the same every epoch, and counted right", "[cpu][data][tokens]")
{
    const std::string text = distinct_text(100);
    const TokenFile file = TokenFile::from_text(text, {.validation = 0.25});
    REQUIRE(file.train_size() == 75);
    REQUIRE(file.validation_size() == 25);
    for (std::size_t T : {1, 4, 5, 12, 24}) {
        INFO("T = " << T);
        const TokenDataset set = file.validation(T);
        const TokenSampleSource source = file.validation_source(T);
        REQUIRE(set.count == 24 / T);
        CHECK(source.count == set.count);
        CHECK(set.input_size == T);
        CHECK(set.label_size == T);
        set.check_sizes("the validation set");
        for (std::size_t k = 0; k < set.count; ++k) {
            INFO("window " << k);
            const std::vector<std::int32_t> input(set.inputs.begin() + std::ptrdiff_t(k * T),
                                                  set.inputs.begin() + std::ptrdiff_t((k + 1) * T));
            const std::vector<std::int32_t> label(set.labels.begin() + std::ptrdiff_t(k * T),
                                                  set.labels.begin() + std::ptrdiff_t((k + 1) * T));
            CHECK(input == ids_of(text, 75 + k * T, T));
            CHECK(label == ids_of(text, 76 + k * T, T));
            CHECK(read_window(source, k, 0) == Window{input, label});
            CHECK(read_window(source, k, 9) == Window{input, label});
        }
        const TokenDataset again = file.validation(T);
        CHECK(again.inputs == set.inputs);
        CHECK(again.labels == set.labels);
    }
    REQUIRE_ERROR(file.validation(25), "a window of T + 1 = 25 + 1 bytes does not fit in the validation part's 25 bytes");
}

TEST_CASE("TokenFile reads a file, or several one after another", "[cpu][data][tokens]")
{
    TempDir dir;
    std::vector<std::uint8_t> all(256);
    std::iota(all.begin(), all.end(), std::uint8_t{0});
    write_bytes(dir / "all", all);
    write_bytes(dir / "abc", {'a', 'b', 'c'});
    const TokenFile file(dir / "all", {.validation = 0.5});
    CHECK(file.size() == 256);
    CHECK(TokenFile::encode(file.text()) == std::vector<std::int32_t>(all.begin(), all.end()));
    CHECK(file.train_size() == 128);
    const TokenFile both = TokenFile::from_files({dir / "abc", dir / "all", dir / "abc"}, {.validation = 0.0});
    CHECK(both.size() == 262);
    CHECK(both.text().substr(0, 4) == std::string_view("abc\0", 4));
    CHECK(both.text().substr(258) == "\xff" "abc");
    CHECK(both.validation_size() == 0);
}

TEST_CASE("TokenFile refuses what it cannot train on, saying what to do", "[cpu][data][tokens]")
{
    TempDir dir;
    SECTION("files")
    {
        const fs::path missing = dir / "no-such-text.txt";
        REQUIRE_ERROR(TokenFile(missing), missing.string() + " not found");
        REQUIRE_ERROR(TokenFile(dir.path()), dir.path().string() + " is a directory");
        write_bytes(dir / "empty", {});
        REQUIRE_ERROR(TokenFile(dir / "empty"), (dir / "empty").string() + " is empty");
        REQUIRE_ERROR(TokenFile::from_files({dir / "empty", dir / "empty"}), "all empty");
        REQUIRE_ERROR(TokenFile::from_files({}), "at least one file");
        REQUIRE_ERROR(TokenFile::from_text(""), "the text is empty");
        write_bytes(dir / "long", iota_bytes(100));
        REQUIRE_ERROR(TokenFile(dir / "long", {.max_bytes = 99}), "longer than 99 bytes (TokenFileOptions::max_bytes)");
        CHECK(TokenFile(dir / "long", {.max_bytes = 100}).size() == 100);
        CHECK(TokenFile(dir / "long", {.max_bytes = ~std::uint64_t{0}}).size() == 100);   // no bound
        REQUIRE_ERROR(TokenFile::from_files({dir / "long", dir / "long"}, {.max_bytes = 150}), "longer than 150");
        REQUIRE_ERROR(TokenFile::from_text(std::string(100, 'x'), {.max_bytes = 99}), "more than 99");
        // An endless input is read up to the bound, not forever.
        if (fs::exists("/dev/zero")) REQUIRE_ERROR(TokenFile("/dev/zero", {.max_bytes = 3000000}), "longer than 3000000");
    }
    SECTION("fractions")
    {
        for (double bad : {1.0, -0.1, 1.5, std::nan("")}) {
            INFO(bad);
            REQUIRE_ERROR(TokenFile::from_text("some text", {.validation = bad}), "validation fraction must be in [0, 1)");
        }
        REQUIRE_ERROR(TokenFile::from_text("some text", {.validation = 1.0}), "[0, 1), not 1");
    }
    SECTION("windows that do not fit")
    {
        const TokenFile file = TokenFile::from_text(distinct_text(10), {.validation = 0.5});
        REQUIRE_ERROR(file.train(5, 10, 1), "a window of T + 1 = 5 + 1 bytes does not fit in the training part's 5 bytes "
                                            "(the first of 10 bytes, validation = 0.5): give a longer text, a shorter context T");
        REQUIRE_ERROR(file.validation(5), "the validation part's 5 bytes (the last of 10 bytes");
        REQUIRE_ERROR(file.validation_source(5), "validation part's 5 bytes");
        CHECK(file.train(4, 10, 1).count == 10);
        CHECK(file.validation(4).count == 1);
        REQUIRE_ERROR(file.train(0, 10, 1), "T must be at least 1");
        REQUIRE_ERROR(file.train(4, 0, 1), "samples_per_epoch must be in [1, 2^32], not 0");
        const TokenFile whole = TokenFile::from_text(distinct_text(10), {.validation = 0.0});
        CHECK(whole.train(9, 1, 1).count == 1);
        REQUIRE_ERROR(whole.validation(4), "no validation part (validation = 0 of 10 bytes holds out none)");
        REQUIRE_ERROR(TokenFile::from_text("0123456789", {.validation = 0.04}).validation_source(4),
                      "no validation part (validation = 0.04 of 10 bytes");
    }
}

TEST_CASE("TokenFile's encode and decode round-trip every byte", "[cpu][data][tokens]")
{
    std::string all(256, '\0');
    for (std::size_t i = 0; i < 256; ++i) all[i] = char(static_cast<unsigned char>(i));
    const std::vector<std::int32_t> ids = TokenFile::encode(all);
    REQUIRE(ids.size() == 256);
    for (std::size_t i = 0; i < 256; ++i) CHECK(ids[i] == std::int32_t(i));
    CHECK(TokenFile::decode(ids) == all);
    CHECK(TokenFile::decode(TokenFile::encode("hello, world\n")) == "hello, world\n");
    CHECK(TokenFile::decode({}).empty());
    REQUIRE_ERROR(TokenFile::decode(std::vector<std::int32_t>{104, 256}), "id 256 at position 1 is not a byte");
    REQUIRE_ERROR(TokenFile::decode(std::vector<std::int32_t>{-1}), "id -1 at position 0");
    CHECK(TokenFile::printable("a\\b\n\tc\x01\xff~") == "a\\\\b\\n\\tc\\x01\\xFF~");
}

} // namespace test_data
