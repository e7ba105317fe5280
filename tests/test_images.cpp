// Images: PNG and JPEG decoding, fitting to a model's input, ImageFolder (labels, split, corrupt
// files), CIFAR-10 files, augmentation (determinism, independence from the replica count), and the
// History the Trainer writes as CSV and JSON.

#include <png.h>

#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <jpeglib.h>

#include "catch.hpp"
#include "models.hpp"
#include "replica/data/augment.hpp"
#include "replica/data/cifar.hpp"
#include "replica/data/image_folder.hpp"
#include "replica/train/trainer.hpp"

using namespace replica;
using namespace replica::testing;

namespace {

namespace fs = std::filesystem;

// A fresh folder under the system's temporary one, removed at the end of the test.
struct TempDir {
    fs::path path;
    explicit TempDir(const std::string& name) : path(fs::temp_directory_path() / ("replica-images-" + name))
    {
        fs::remove_all(path);
        fs::create_directories(path);
    }
    ~TempDir() { fs::remove_all(path); }
};

// Pixels (height, width, channels) written with libpng's own writer.
void write_png(const fs::path& file, std::size_t w, std::size_t h, std::size_t c, const std::vector<std::uint8_t>& px)
{
    fs::create_directories(file.parent_path());
    png_image image{};
    image.version = PNG_IMAGE_VERSION;
    image.width = png_uint_32(w);
    image.height = png_uint_32(h);
    image.format = c == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
    REQUIRE(png_image_write_to_file(&image, file.c_str(), 0, px.data(), 0, nullptr) != 0);
}

// Pixels written with libjpeg at quality 100, no chroma subsampling.
void write_jpeg(const fs::path& file, std::size_t w, std::size_t h, std::size_t c, const std::vector<std::uint8_t>& px)
{
    fs::create_directories(file.parent_path());
    FILE* f = std::fopen(file.c_str(), "wb");
    REQUIRE(f != nullptr);
    jpeg_compress_struct info;
    jpeg_error_mgr error;
    info.err = jpeg_std_error(&error);
    jpeg_create_compress(&info);
    jpeg_stdio_dest(&info, f);
    info.image_width = JDIMENSION(w);
    info.image_height = JDIMENSION(h);
    info.input_components = int(c);
    info.in_color_space = c == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_set_defaults(&info);
    jpeg_set_quality(&info, 100, TRUE);
    for (int i = 0; i < info.num_components; ++i) info.comp_info[i].h_samp_factor = info.comp_info[i].v_samp_factor = 1;
    jpeg_start_compress(&info, TRUE);
    while (info.next_scanline < info.image_height) {
        JSAMPROW row = const_cast<std::uint8_t*>(px.data()) + std::size_t(info.next_scanline) * w * c;
        jpeg_write_scanlines(&info, &row, 1);
    }
    jpeg_finish_compress(&info);
    jpeg_destroy_compress(&info);
    std::fclose(f);
}

std::vector<std::uint8_t> file_bytes(const fs::path& file)
{
    std::ifstream in(file, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& file, const std::vector<std::uint8_t>& bytes)
{
    fs::create_directories(file.parent_path());
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

// A grey w x h image whose pixel (y, x) is `value + 10 y + x`.
std::vector<std::uint8_t> ramp(std::size_t w, std::size_t h, int value)
{
    std::vector<std::uint8_t> px(w * h);
    for (std::size_t y = 0; y < h; ++y)
        for (std::size_t x = 0; x < w; ++x) px[y * w + x] = std::uint8_t(value + int(10 * y + x));
    return px;
}

std::string message_of(const std::function<void()>& f)
{
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

} // namespace

TEST_CASE("PNG files decode to their pixels, grey and RGB", "[cpu][images]")
{
    TempDir dir("png");
    const std::vector<std::uint8_t> grey = ramp(5, 3, 7);
    std::vector<std::uint8_t> rgb(4 * 2 * 3);
    for (std::size_t i = 0; i < rgb.size(); ++i) rgb[i] = std::uint8_t(17 * i + 3);
    write_png(dir.path / "grey.png", 5, 3, 1, grey);
    write_png(dir.path / "rgb.png", 4, 2, 3, rgb);
    const data::Image g = data::read_image(dir.path / "grey.png");
    CHECK((g.width == 5 && g.height == 3 && g.channels == 1));
    CHECK(g.pixels == grey);
    const data::Image c = data::read_image(dir.path / "rgb.png");
    CHECK((c.width == 4 && c.height == 2 && c.channels == 3));
    CHECK(c.pixels == rgb);
    // The content decides, not the name: a PNG called .jpg decodes.
    fs::copy_file(dir.path / "rgb.png", dir.path / "really-png.jpg");
    CHECK(data::read_image(dir.path / "really-png.jpg").pixels == rgb);
}

TEST_CASE("JPEG files decode to their pixels, grey and RGB", "[cpu][images]")
{
    TempDir dir("jpeg");
    // Flat 8x8 blocks survive quality-100 JPEG within a step or two.
    std::vector<std::uint8_t> grey(16 * 8), rgb(16 * 8 * 3);
    for (std::size_t y = 0; y < 8; ++y)
        for (std::size_t x = 0; x < 16; ++x) {
            grey[y * 16 + x] = x < 8 ? 40 : 200;
            const std::uint8_t colour[2][3] = {{220, 30, 60}, {20, 140, 250}};
            for (std::size_t k = 0; k < 3; ++k) rgb[(y * 16 + x) * 3 + k] = colour[x < 8 ? 0 : 1][k];
        }
    write_jpeg(dir.path / "grey.jpg", 16, 8, 1, grey);
    write_jpeg(dir.path / "rgb.jpeg", 16, 8, 3, rgb);
    for (auto [name, want, channels] : {std::tuple{"grey.jpg", &grey, 1}, std::tuple{"rgb.jpeg", &rgb, 3}}) {
        CAPTURE(name);
        const data::Image image = data::read_image(dir.path / name);
        REQUIRE((image.width == 16 && image.height == 8 && image.channels == std::size_t(channels)));
        int worst = 0;
        for (std::size_t i = 0; i < want->size(); ++i) worst = std::max(worst, std::abs(int(image.pixels[i]) - int((*want)[i])));
        CHECK(worst <= 3);
    }
}

TEST_CASE("Corrupt, truncated and foreign files are errors that name the file", "[cpu][images]")
{
    TempDir dir("corrupt");
    write_png(dir.path / "ok.png", 8, 8, 1, ramp(8, 8, 0));
    std::vector<std::uint8_t> busy(16 * 16 * 3);   // enough detail that the scan data outweighs the header
    for (std::size_t i = 0; i < busy.size(); ++i) busy[i] = std::uint8_t(i * 7);
    write_jpeg(dir.path / "ok.jpg", 16, 16, 3, busy);
    auto png = file_bytes(dir.path / "ok.png");
    auto jpg = file_bytes(dir.path / "ok.jpg");
    write_bytes(dir.path / "cut.png", {png.begin(), png.begin() + std::ptrdiff_t(png.size() / 2)});
    write_bytes(dir.path / "cut.jpg", {jpg.begin(), jpg.end() - 20});   // inside the scan: libjpeg only warns
    const std::string idat = "IDAT";
    const auto at = std::search(png.begin(), png.end(), idat.begin(), idat.end());
    REQUIRE(at != png.end());
    at[8] ^= 0xFF;   // a flipped byte inside the compressed image data
    write_bytes(dir.path / "flipped.png", png);
    write_bytes(dir.path / "text.png", {'h', 'e', 'l', 'l', 'o'});
    write_bytes(dir.path / "empty.jpg", {});
    for (const char* name : {"cut.png", "cut.jpg", "flipped.png", "text.png", "empty.jpg", "missing.png"}) {
        CAPTURE(name);
        const std::string m = message_of([&] { data::read_image(dir.path / name); });
        CHECK(m.find((dir.path / name).string()) != std::string::npos);
    }
    CHECK(message_of([&] { data::read_image(dir.path / "cut.jpg"); }).find("corrupt JPEG") != std::string::npos);
    CHECK(message_of([&] { data::read_image(dir.path / "text.png"); }).find("neither a PNG nor a JPEG") != std::string::npos);
}

TEST_CASE("Images are fitted to the model's channels and size", "[cpu][images]")
{
    // RGB -> grey is 0.299 R + 0.587 G + 0.114 B; grey -> RGB repeats the value.
    const data::Image rgb{2, 1, 3, {255, 0, 0, 10, 100, 200}};
    float grey[2];
    data::fit_image(rgb, {1, 1, 2}, data::Fit::resize, grey);
    CHECK(grey[0] == Approx(0.299f).epsilon(1e-6));
    CHECK(grey[1] == Approx((0.299 * 10 + 0.587 * 100 + 0.114 * 200) / 255.0).epsilon(1e-6));
    float planar[6];
    data::fit_image(rgb, {3, 1, 2}, data::Fit::resize, planar);   // planar: R R G G B B
    CHECK(std::vector<float>(planar, planar + 6) ==
          std::vector<float>{1.0f, 10 / 255.0f, 0.0f, 100 / 255.0f, 0.0f, 200 / 255.0f});
    const data::Image g{1, 1, 1, {51}};
    float three[3];
    data::fit_image(g, {3, 1, 1}, data::Fit::resize, three);
    CHECK((three[0] == 0.2f && three[1] == 0.2f && three[2] == 0.2f));

    // The same size: the pixels themselves.
    const data::Image r{5, 3, 1, ramp(5, 3, 0)};
    std::vector<float> same(15);
    data::fit_image(r, {1, 3, 5}, data::Fit::resize, same.data());
    for (std::size_t i = 0; i < 15; ++i) CHECK(same[i] == float(r.pixels[i]) / 255.0f);

    // Centre crop of 6 wide x 4 high to 4 x 4: columns 1-4, unscaled.
    const data::Image wide{6, 4, 1, ramp(6, 4, 0)};
    std::vector<float> crop(16);
    data::fit_image(wide, {1, 4, 4}, data::Fit::centre_crop, crop.data());
    for (std::size_t y = 0; y < 4; ++y)
        for (std::size_t x = 0; x < 4; ++x) CHECK(crop[y * 4 + x] * 255.0f == Approx(double(10 * y + x + 1)));

    // Resize 2x2 -> 4x4: pixel centres interpolated linearly, edges held.
    const data::Image small{2, 2, 1, {0, 100, 200, 40}};
    std::vector<float> big(16);
    data::fit_image(small, {1, 4, 4}, data::Fit::resize, big.data());
    const double row0[4] = {0, 25, 75, 100};     // along x at the top row
    for (std::size_t x = 0; x < 4; ++x) CHECK(big[x] * 255.0f == Approx(row0[x]).margin(1e-3));
    CHECK(big[1 * 4 + 0] * 255.0f == Approx(0.75 * 0 + 0.25 * 200).margin(1e-3));
    // Shrinking a constant image keeps it constant; shrinking averages (no sample falls between).
    const data::Image flat{9, 7, 1, std::vector<std::uint8_t>(63, 128)};
    std::vector<float> shrunk(4);
    data::fit_image(flat, {1, 2, 2}, data::Fit::resize, shrunk.data());
    for (float v : shrunk) CHECK(v * 255.0f == Approx(128.0).margin(1e-3));
    // 8 -> 2: each output's triangle spans 4 source pixels either side of its centre (2 and 6), weights
    // 1 - |j + 0.5 - centre| / 4, normalised (they sum to 3.5), so the lit pixels 0 and 4 count.
    const data::Image dots{8, 1, 1, {255, 0, 0, 0, 255, 0, 0, 0}};
    float two[2];
    data::fit_image(dots, {1, 1, 2}, data::Fit::resize, two);
    CHECK(two[0] * 255.0f == Approx(255.0 * (0.625 + 0.375) / 3.5).margin(1e-3));
    CHECK(two[1] * 255.0f == Approx(255.0 * 0.625 / 3.5).margin(1e-3));
}

TEST_CASE("ImageFolder: labels by sorted class name, a split by fraction and seed", "[cpu][images]")
{
    TempDir dir("folder");
    // Classes created out of order; "cat" holds JPEGs. A stray text file and a hidden file are ignored.
    const std::vector<std::string> sorted{"ant", "bee", "cat", "mole", "yak", "zebra"};
    for (const char* c : {"zebra", "yak", "cat", "mole", "bee", "ant"})
        for (int i = 0; i < 10; ++i) {
            const std::vector<std::uint8_t> px(6 * 6, std::uint8_t(c[0] + i));
            if (std::string(c) == "cat") write_jpeg(dir.path / c / ("i" + std::to_string(i) + ".JPG"), 6, 6, 1, px);
            else write_png(dir.path / c / ("i" + std::to_string(i) + ".png"), 6, 6, 1, px);
        }
    write_bytes(dir.path / "ant" / "notes.txt", {'x'});
    write_bytes(dir.path / "ant" / ".hidden.png", {'x'});

    const data::ImageFolder folder(dir.path, {.channels = 1, .image_size = 4, .validation_fraction = 0.3, .seed = 5});
    CHECK(folder.classes() == sorted);
    CHECK(folder.train_files().size() == 42);
    CHECK(folder.validation_files().size() == 18);
    std::set<std::string> seen;
    std::size_t per_class_val[6] = {};
    for (const auto* list : {&folder.train_files(), &folder.validation_files()})
        for (const data::ImageFile& f : *list) {
            CHECK(f.path.parent_path().filename() == folder.classes()[std::size_t(f.label)]);
            seen.insert(f.path.string());
            if (list == &folder.validation_files()) ++per_class_val[f.label];
        }
    CHECK(seen.size() == 60);   // every image once: no overlap, nothing lost
    for (std::size_t c = 0; c < 6; ++c) CHECK(per_class_val[c] == 3);

    auto names = [](const std::vector<data::ImageFile>& files) {
        std::vector<std::string> out;
        for (const auto& f : files) out.push_back(f.path.string());
        return out;
    };
    const data::ImageFolder again(dir.path, {.channels = 1, .image_size = 4, .validation_fraction = 0.3, .seed = 5});
    CHECK(names(again.validation_files()) == names(folder.validation_files()));
    const data::ImageFolder other(dir.path, {.channels = 1, .image_size = 4, .validation_fraction = 0.3, .seed = 6});
    CHECK(names(other.validation_files()) != names(folder.validation_files()));

    // Decoded values and labels: the loader's background thread reads the same as decode_all.
    const Dataset direct = folder.decode_all(folder.train_files());
    const fs::path first = folder.train_files()[0].path;   // ant/iN.png, flat 'a' + N
    CHECK(first.parent_path().filename() == "ant");
    CHECK(direct.inputs[0] == Approx(double('a' + std::stoi(first.stem().string().substr(1))) / 255.0));
    data::Loader loader(folder.train(), 7, 1, /*shuffle=*/false);
    loader.start_epoch(0);
    std::size_t k = 0;
    while (auto b = loader.next()) {
        for (std::size_t i = 0; i < b->size; ++i, ++k) {
            CHECK(b->labels[i] == direct.labels[k]);
            CHECK(std::equal(b->inputs + i * 16, b->inputs + (i + 1) * 16, direct.inputs.begin() + std::ptrdiff_t(k * 16)));
        }
    }
    CHECK(k == 42);

    // Three loader threads decode the same; a file gone since the check is an error naming it.
    const data::ImageFolder threaded(dir.path, {.channels = 1, .image_size = 4, .validation_fraction = 0.3, .seed = 5,
                                                .threads = 3});
    data::Loader three(threaded.train(), 7, 1, /*shuffle=*/false);
    three.start_epoch(0);
    k = 0;
    while (auto b = three.next())
        for (std::size_t i = 0; i < b->size; ++i, ++k)
            CHECK(std::equal(b->inputs + i * 16, b->inputs + (i + 1) * 16, direct.inputs.begin() + std::ptrdiff_t(k * 16)));
    CHECK(k == 42);
    const fs::path gone = threaded.train_files()[5].path;
    fs::remove(gone);
    three.start_epoch(1);
    CHECK(message_of([&] { three.next(); }).find(gone.string()) != std::string::npos);

    CHECK(message_of([&] { data::ImageFolder(dir.path / "nowhere", {.image_size = 4}); }).find("does not exist") !=
          std::string::npos);
    fs::create_directories(dir.path / "empty-class");
    CHECK(message_of([&] { data::ImageFolder(dir.path, {.image_size = 4}); }).find("empty-class") != std::string::npos);
}

TEST_CASE("ImageFolder: a corrupt image is named, then skipped or the load stops", "[cpu][images]")
{
    TempDir dir("folder-corrupt");
    for (const char* c : {"a", "b"})
        for (int i = 0; i < 4; ++i) write_png(dir.path / c / (std::to_string(i) + ".png"), 4, 4, 1, ramp(4, 4, 10 * i));
    auto bytes = file_bytes(dir.path / "b" / "2.png");
    const fs::path bad = dir.path / "b" / "2.png";
    write_bytes(bad, {bytes.begin(), bytes.begin() + 30});

    const std::string stop = message_of([&] { data::ImageFolder(dir.path, {.channels = 1, .image_size = 4}); });
    CHECK(stop.find(bad.string()) != std::string::npos);
    CHECK(stop.find("OnError::skip") != std::string::npos);

    std::ostringstream log;
    const data::ImageFolder folder(dir.path, {.channels = 1, .image_size = 4, .on_error = data::OnError::skip, .log = &log});
    CHECK(folder.skipped() == std::vector<fs::path>{bad});
    CHECK(log.str().find("skipping " + bad.string()) != std::string::npos);
    CHECK(folder.train_files().size() == 7);
    for (const auto& f : folder.train_files()) CHECK(f.path != bad);
}

TEST_CASE("CIFAR-10 binary files: records, planes, truncated and corrupt files", "[cpu][images]")
{
    TempDir dir("cifar");
    // Record r: label r % 10, pixel i = (r + i) % 256.
    auto records = [](std::size_t n, std::size_t first) {
        std::vector<std::uint8_t> out;
        for (std::size_t r = first; r < first + n; ++r) {
            out.push_back(std::uint8_t(r % 10));
            for (std::size_t i = 0; i < 3072; ++i) out.push_back(std::uint8_t((r + i) % 256));
        }
        return out;
    };
    for (int b = 1; b <= 5; ++b) write_bytes(dir.path / ("data_batch_" + std::to_string(b) + ".bin"), records(2, std::size_t(2 * (b - 1))));
    write_bytes(dir.path / "test_batch.bin", records(3, 100));

    const Dataset train = data::load_cifar10(data::Split::train, dir.path);
    REQUIRE(train.count == 10);
    CHECK(train.input_size == 3072);
    for (std::size_t r = 0; r < 10; ++r) {
        CHECK(train.labels[r] == std::int32_t(r % 10));
        CHECK(train.inputs[r * 3072 + 0] == float(r % 256) / 255.0f);              // red (0, 0)
        CHECK(train.inputs[r * 3072 + 1024 + 33] == float((r + 1024 + 33) % 256) / 255.0f);   // green (1, 1)
    }
    const Dataset test = data::load_cifar10(data::Split::test, dir.path);
    CHECK((test.count == 3 && test.labels[0] == 0 && test.labels[2] == 2));

    auto cut = records(2, 0);
    cut.pop_back();
    write_bytes(dir.path / "cut.bin", cut);
    const std::string m = message_of([&] { data::read_cifar10(dir.path / "cut.bin"); });
    CHECK(m.find((dir.path / "cut.bin").string()) != std::string::npos);
    CHECK(m.find("truncated") != std::string::npos);
    auto wrong = records(2, 0);
    wrong[3073] = 12;   // the second record's label
    write_bytes(dir.path / "wrong.bin", wrong);
    CHECK(message_of([&] { data::read_cifar10(dir.path / "wrong.bin"); }).find("record 1 has label 12") != std::string::npos);
    write_bytes(dir.path / "empty.bin", {});
    CHECK(message_of([&] { data::read_cifar10(dir.path / "empty.bin"); }).find("empty") != std::string::npos);
    fs::remove(dir.path / "data_batch_4.bin");
    CHECK(message_of([&] { data::load_cifar10(data::Split::train, dir.path); }).find("data_batch_4.bin") != std::string::npos);
}

TEST_CASE("Augmentation: crop of the padded image, flip, normalisation, keyed on (seed, epoch, index)",
          "[cpu][images]")
{
    const data::ImageShape shape{2, 5, 6};
    Dataset set;
    set.count = 40;
    set.input_size = shape.size();
    for (std::size_t s = 0; s < set.count; ++s) {
        for (std::size_t i = 0; i < shape.size(); ++i) set.inputs.push_back(float((s * 7 + i * 3) % 11) / 10.0f);
        set.labels.push_back(std::int32_t(s % 3));
    }
    const data::ChannelStats stats = data::channel_stats(set, shape);
    // The mean and std of each channel, by hand.
    for (std::size_t c = 0; c < 2; ++c) {
        double sum = 0, sq = 0;
        for (std::size_t s = 0; s < set.count; ++s)
            for (std::size_t p = 0; p < 30; ++p) {
                const double v = set.inputs[s * 60 + c * 30 + p];
                sum += v;
                sq += v * v;
            }
        const double mean = sum / 1200, stddev = std::sqrt(sq / 1200 - mean * mean);
        CHECK(stats.mean[c] == Approx(mean).epsilon(1e-5));
        CHECK(stats.stddev[c] == Approx(stddev).epsilon(1e-5));
    }

    const auto source = data::augmented(set, shape, {.crop_padding = 2, .flip = true, .seed = 9});
    CHECK(source.stats.mean == stats.mean);   // computed from the data when not given
    auto read = [&](const data::SampleSource& src, std::size_t index, std::uint64_t epoch) {
        std::vector<float> x(shape.size());
        std::int32_t label = -1;
        src.read(index, epoch, x.data(), &label);
        CHECK(label == set.labels[index]);
        return x;
    };
    // Every output is the input shifted by (dy, dx) in [-2, 2], maybe mirrored, zeros (normalised)
    // where the shift leaves the image; find which, and check the draws vary and repeat.
    std::set<std::tuple<int, int, bool>> seen;
    for (std::size_t s = 0; s < set.count; ++s) {
        const std::vector<float> got = read(source, s, 3);
        CHECK(got == read(source, s, 3));   // the same key, the same image
        bool found = false;
        for (int dy = -2; dy <= 2 && !found; ++dy)
            for (int dx = -2; dx <= 2 && !found; ++dx)
                for (bool flip : {false, true}) {
                    bool match = true;
                    for (std::size_t c = 0; c < 2 && match; ++c)
                        for (int y = 0; y < 5 && match; ++y)
                            for (int x = 0; x < 6 && match; ++x) {
                                const int sy = y + dy, sx = (flip ? 5 - x : x) + dx;
                                const float raw = sy >= 0 && sy < 5 && sx >= 0 && sx < 6
                                                      ? set.inputs[s * 60 + c * 30 + std::size_t(sy * 6 + sx)] : 0.0f;
                                const float want = (raw - stats.mean[c]) * (1.0f / stats.stddev[c]);
                                match = std::abs(got[c * 30 + std::size_t(y * 6 + x)] - want) < 1e-5f;
                            }
                    if (match) {
                        seen.insert({dy, dx, flip});
                        found = true;
                        break;
                    }
                }
        CHECK(found);
    }
    CHECK(seen.size() > 10);   // 40 draws over 50 choices: many different ones
    const auto flips = std::count_if(seen.begin(), seen.end(), [](const auto& t) { return std::get<2>(t); });
    CHECK((flips > 3 && flips < std::ptrdiff_t(seen.size()) - 3));   // about half mirrored
    std::size_t differs = 0;
    for (std::size_t s = 0; s < set.count; ++s) differs += read(source, s, 3) != read(source, s, 4);
    CHECK(differs > 30);   // another epoch, other crops
    const auto other = data::augmented(set, shape, {.crop_padding = 2, .flip = true, .seed = 10});
    differs = 0;
    for (std::size_t s = 0; s < set.count; ++s) differs += read(source, s, 3) != read(other, s, 3);
    CHECK(differs > 30);   // another seed, other crops

    // Given statistics are used as they are; a constant channel cannot be normalised.
    const auto fixed = data::augmented(set, shape, {.stats = {{0.5f, 0.25f}, {2.0f, 4.0f}}});
    CHECK(read(fixed, 1, 0)[0] == Approx((set.inputs[60] - 0.5) / 2.0));
    CHECK(read(fixed, 1, 0)[30] == Approx((set.inputs[90] - 0.25) / 4.0));
    Dataset flat = set;
    std::fill(flat.inputs.begin(), flat.inputs.end(), 0.5f);
    CHECK(message_of([&] { data::channel_stats(flat, shape); }).find("same value") != std::string::npos);
    CHECK(message_of([&] { data::augmented(set, shape, {.stats = {{0.0f}, {1.0f}}}); }).find("one mean and one std per channel") !=
          std::string::npos);
}

TEST_CASE("Augmented training does not depend on the replica count or the process share", "[cpu][images]")
{
    using Net = Sequential<Input<1, 6, 6>, Conv2d<4, 3>, ReLU, Flatten, Linear<3>>;
    const data::ImageShape shape{1, 6, 6};
    Dataset set;
    set.count = 48;
    set.input_size = shape.size();
    for (std::size_t s = 0; s < set.count; ++s) {
        for (std::size_t i = 0; i < shape.size(); ++i) set.inputs.push_back(float((s * 5 + i * 7) % 13) / 12.0f);
        set.labels.push_back(std::int32_t(s % 3));
    }
    const auto source = data::augmented(set, shape, {.crop_padding = 1, .flip = true, .seed = 4});

    // A loader that gathers only part of each batch (one process's share) writes exactly those rows
    // of the whole batch.
    data::Loader whole(source, 16, 2), part(source, 16, 2);
    part.only([](std::size_t n) { return parallel::Share{n / 4, n / 2}; });
    whole.start_epoch(1);
    part.start_epoch(1);
    for (auto a = whole.next(), b = part.next(); a && b; a = whole.next(), b = part.next())
        CHECK(std::equal(a->inputs + 4 * 36, a->inputs + 12 * 36, b->inputs + 4 * 36));

    auto train = [&](auto& model) {
        SGD opt{{.lr = 0.05f, .momentum = 0.9f}};
        Trainer trainer{model, opt, {.batch_size = 12, .epochs = 2, .seed = 3, .reproducible = true, .micro_shard = 2,
                                     .progress = false, .log = nullptr}};
        trainer.fit(source);
        return parameters(model);
    };
    Net one{Device::cpu(), 1};
    const std::vector<float> expected = train(one);
    DataParallel<Net, Threaded> three{cpus(3), 1};
    CHECK(train(three) == expected);
    Net again{Device::cpu(), 1};
    CHECK(train(again) == expected);
}

TEST_CASE("The Trainer writes its History as CSV and JSON while it trains", "[cpu][images]")
{
    TempDir dir("history");
    using Net = Sequential<Input<1, 4, 4>, Flatten, Linear<3>>;
    const auto set = data::synthetic_dataset(40, 16, 1, 3, 2);
    const auto validation = data::synthetic_dataset(12, 16, 1, 3, 3);
    Net net{Device::cpu(), 1};
    SGD opt{{.lr = 0.1f}};
    // 40 samples in batches of 8: 5 steps an epoch, 15 in all; a step record every 5 steps, so each
    // covers one epoch and its loss is the epoch's.
    Trainer trainer{net, opt, {.batch_size = 8, .epochs = 3, .validate_every = 2, .progress = false, .log = nullptr,
                               .history_csv = dir.path / "h.csv", .history_json = dir.path / "h.json",
                               .history_every = 5}};
    const History h = trainer.fit(set, validation);
    REQUIRE(h.epochs.size() == 3);
    REQUIRE(h.steps.size() == 3);
    for (std::size_t i = 0; i < 3; ++i) {
        CHECK(h.steps[i].step == 5 * (i + 1));
        CHECK(h.steps[i].epoch == Approx(double(i + 1)));
        CHECK(h.steps[i].train_loss == Approx(h.epochs[i].train_loss).epsilon(1e-9));
    }
    CHECK(h.epochs[0].train_loss != h.epochs[2].train_loss);

    std::ifstream csv(dir.path / "h.csv");
    std::vector<std::string> lines;
    for (std::string line; std::getline(csv, line);) lines.push_back(line);
    REQUIRE(lines.size() == 1 + 3 + 3);
    CHECK(lines[0] == "kind,epoch,step,train_loss,validation_loss,validation_accuracy,seconds");
    auto fields = [](const std::string& line) {
        std::vector<std::string> out(1);
        for (char ch : line) {
            if (ch == ',') out.emplace_back();
            else out.back().push_back(ch);
        }
        return out;
    };
    // Rows in the order they happened: step 5, epoch 1, step 10, epoch 2, step 15, epoch 3.
    const std::vector<std::string> kinds{"step", "epoch", "step", "epoch", "step", "epoch"};
    std::size_t e = 0, s = 0;
    for (std::size_t i = 1; i < lines.size(); ++i) {
        const auto f = fields(lines[i]);
        REQUIRE(f.size() == 7);
        CHECK(f[0] == kinds[i - 1]);
        if (f[0] == "step") {
            CHECK(std::stoull(f[2]) == h.steps[s].step);
            CHECK(std::stod(f[3]) == h.steps[s].train_loss);   // shortest round-trip text: exact
            CHECK((f[4].empty() && f[5].empty() && f[6].empty()));
            ++s;
        } else {
            const EpochRecord& r = h.epochs[e];
            CHECK(std::stoull(f[1]) == r.epoch);
            CHECK(std::stoull(f[2]) == 5 * (e + 1));
            CHECK(std::stod(f[3]) == r.train_loss);
            if (e == 0) {
                CHECK((f[4].empty() && f[5].empty()));   // not validated after epoch 1
            } else {
                CHECK(std::stod(f[4]) == r.validation_loss);
                CHECK(std::stod(f[5]) == r.validation_accuracy);
            }
            ++e;
        }
    }

    std::ifstream json_file(dir.path / "h.json");
    const std::string json{std::istreambuf_iterator<char>(json_file), std::istreambuf_iterator<char>()};
    auto text = [](double v) {   // shortest text that reads back exactly, as the writer prints
        char buf[32];
        return std::string(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);
    };
    CHECK(json.find("{\"epoch\": 2, \"step\": 10, \"train_loss\": " + text(h.epochs[1].train_loss) +
                    ", \"validation_loss\": " + text(h.epochs[1].validation_loss)) != std::string::npos);
    CHECK(json.find("\"validation_loss\": null") != std::string::npos);   // epoch 1
    CHECK(json.find("{\"step\": 15, \"epoch\": " + text(h.steps[2].epoch) + ", \"train_loss\": " +
                    text(h.steps[2].train_loss) + "}") != std::string::npos);
    CHECK(json.rfind("]}\n") == json.size() - 3);
    CHECK_FALSE(fs::exists(dir.path / "h.json.tmp"));
}
