#pragma once
// ImageFolder: a folder of images sorted by class, as torchvision's ImageFolder reads it.
//
//   photos/cat/001.png, photos/cat/002.jpg, photos/dog/x.jpeg, ...  -> classes {"cat", "dog"}, labels 0, 1
//
//   data::ImageFolder folder{"photos", {.channels = 3, .image_size = 32, .validation_fraction = 0.1}};
//   auto train = data::augmented(folder.train(), folder.shape(), {.crop_padding = 4, .flip = true});
//   Dataset validation = data::normalised(folder.validation(), folder.shape(), train.stats);
//   trainer.fit(train, validation);   // images decoded and augmented on the loader's background thread
//
// Needs libpng and libjpeg (data/image.hpp): link `replica-images`.

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "replica/core/config.hpp"
#include "replica/core/error.hpp"
#include "replica/core/rng.hpp"
#include "replica/data/augment.hpp"
#include "replica/data/dataset.hpp"
#include "replica/data/image.hpp"
#include "replica/data/source.hpp"

namespace REPLICA_NAMESPACE::data {

// What to do with an image that cannot be read or decoded.
enum class OnError {
    stop,  // throw Error naming the file
    skip,  // leave it out, with a line naming the file and the reason in `log`
};

struct ImageFolderOptions {
    std::size_t channels = 3;           // 1: grey, 3: RGB (the model's input channels)
    std::size_t image_size = 0;         // side of the square images the model takes (required)
    Fit fit = Fit::resize;
    double validation_fraction = 0.0;   // of each class's images, in [0, 1)
    std::uint64_t seed = 1;             // which images go to validation
    OnError on_error = OnError::stop;
    std::ostream* log = &std::cerr;     // skipped images are reported here; null: silent
    std::size_t threads = 0;            // that decode: the check at construction, and the loader's; 0: one per core
};

struct ImageFile {
    std::filesystem::path path;
    std::int32_t label = 0;
};

// Lists root/<class>/<file>.{png,jpg,jpeg} (any case; other files and hidden ones are ignored),
// classes in sorted order, files sorted by name. Each class's files are split by `seed`:
// round(fraction x count) go to validation. Every image is decoded once at construction (on
// `threads` threads), so that a corrupt one is found before training: OnError::stop throws Error
// naming it, OnError::skip leaves it out with a line "skipping <path>: <reason>" in `log`. Throws Error when root is not a folder,
// holds no class folders, or a class holds no image.
class ImageFolder {
public:
    ImageFolder(std::filesystem::path root, ImageFolderOptions options)
        : root_(std::move(root)), options_(options)
    {
        const std::string name = root_.string();
        core::require(options_.channels == 1 || options_.channels == 3,
                      "ImageFolder: channels must be 1 (grey) or 3 (RGB), not " + std::to_string(options_.channels));
        core::require(options_.image_size > 0, "ImageFolder: give the image size the model takes (.image_size)");
        core::require(options_.validation_fraction >= 0.0 && options_.validation_fraction < 1.0,
                      "ImageFolder: the validation fraction must be in [0, 1), not " +
                          std::to_string(options_.validation_fraction));
        std::error_code ec;
        core::require(std::filesystem::is_directory(root_, ec),
                      "image folder " + name + " does not exist or is not a folder");

        for (const auto& entry : std::filesystem::directory_iterator(root_)) {
            const std::string dir = entry.path().filename().string();
            if (entry.is_directory() && !dir.starts_with(".")) classes_.push_back(dir);
        }
        std::sort(classes_.begin(), classes_.end());
        core::require(!classes_.empty(), "image folder " + name +
                                             " holds no class folders: put the images in " + name + "/<class>/");

        std::vector<ImageFile> all;
        std::vector<std::pair<std::size_t, std::size_t>> class_range;   // [begin, end) in `all`
        for (std::size_t c = 0; c < classes_.size(); ++c) {
            std::vector<std::filesystem::path> files;
            for (const auto& entry : std::filesystem::directory_iterator(root_ / classes_[c]))
                if (entry.is_regular_file() && is_image_name(entry.path())) files.push_back(entry.path());
            core::require(!files.empty(), "class folder " + (root_ / classes_[c]).string() +
                                              " holds no .png or .jpg images");
            std::sort(files.begin(), files.end());
            const std::size_t begin = all.size();
            for (auto& f : files) all.push_back({std::move(f), std::int32_t(c)});
            class_range.emplace_back(begin, all.size());
        }

        const std::vector<std::string> errors = check(all);
        for (std::size_t c = 0; c < classes_.size(); ++c) {
            // This class's files in an order drawn from the seed; the first round(fraction x n) validate.
            auto [begin, end] = class_range[c];
            std::vector<std::size_t> order(end - begin);
            for (std::size_t i = 0; i < order.size(); ++i) order[i] = begin + i;
            for (std::size_t i = order.size(); i-- > 1;) {
                const std::uint64_t bits = core::random_bits(options_.seed, core::Stream::split, std::uint32_t(c), i, 0);
                std::swap(order[i], order[std::size_t((bits * (i + 1)) >> 32)]);
            }
            const auto n_val = std::size_t(std::llround(options_.validation_fraction * double(order.size())));
            std::sort(order.begin(), order.begin() + std::ptrdiff_t(n_val));
            std::sort(order.begin() + std::ptrdiff_t(n_val), order.end());
            for (std::size_t i = 0; i < order.size(); ++i) {
                const std::size_t f = order[i];
                if (!errors[f].empty()) {
                    skipped_.push_back(all[f].path);
                    continue;
                }
                (i < n_val ? validation_ : train_).push_back(all[f]);
            }
        }
        core::require(!train_.empty(), "image folder " + name + " has no readable training images");
    }

    const std::filesystem::path& root() const { return root_; }
    const std::vector<std::string>& classes() const { return classes_; }
    const std::vector<ImageFile>& train_files() const { return train_; }
    const std::vector<ImageFile>& validation_files() const { return validation_; }
    const std::vector<std::filesystem::path>& skipped() const { return skipped_; }
    ImageShape shape() const { return {options_.channels, options_.image_size, options_.image_size}; }

    // The training images, decoded and fitted when read, by `threads` loader threads: values in [0, 1],
    // not normalised (see augmented()). The ImageFolder must outlive the source. A file that cannot be
    // read any more (changed since the check) throws Error naming it.
    SampleSource train() const { return source(train_); }

    // The validation images, decoded now: inputs (N, shape().size()) in [0, 1], labels (N, 1).
    Dataset validation() const { return decode_all(validation_); }

    // Any list of files decoded now, as above.
    Dataset decode_all(const std::vector<ImageFile>& files) const
    {
        Dataset set;
        set.count = files.size();
        set.input_size = shape().size();
        set.inputs.resize(set.count * set.input_size);
        set.labels.resize(set.count);
        for (std::size_t i = 0; i < files.size(); ++i) {
            fit_image(read_image(files[i].path), shape(), options_.fit, set.inputs.data() + i * set.input_size);
            set.labels[i] = files[i].label;
        }
        return set;
    }

private:
    static bool is_image_name(const std::filesystem::path& file)
    {
        std::string ext = file.extension().string();
        for (char& ch : ext) ch = char(std::tolower(static_cast<unsigned char>(ch)));
        return !file.filename().string().starts_with(".") && (ext == ".png" || ext == ".jpg" || ext == ".jpeg");
    }

    SampleSource source(const std::vector<ImageFile>& files) const
    {
        SampleSource out(files.size(), shape().size(), 1,
                         [this, &files](std::size_t index, std::uint64_t, float* input, std::int32_t* label) {
                             fit_image(read_image(files[index].path), shape(), options_.fit, input);
                             *label = files[index].label;
                         });
        out.threads = threads();
        return out;
    }

    std::size_t threads() const
    {
        return options_.threads ? options_.threads : std::max(1u, std::thread::hardware_concurrency());
    }

    // Decodes every file; returns per file the error ("" when fine). Stops at the first under OnError::stop.
    std::vector<std::string> check(const std::vector<ImageFile>& files) const
    {
        std::vector<std::string> errors(files.size());
        const std::size_t threads = std::min(this->threads(), files.size());
        auto work = [&](std::size_t t) {
            std::vector<float> out(shape().size());
            for (std::size_t i = t; i < files.size(); i += threads) {
                try {
                    fit_image(read_image(files[i].path), shape(), options_.fit, out.data());
                } catch (const std::exception& e) {
                    errors[i] = e.what();
                    const std::string path = files[i].path.string();
                    if (errors[i].find(path) == std::string::npos) errors[i] = path + ": " + errors[i];
                }
            }
        };
        std::vector<std::thread> pool;
        for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(work, t);
        work(0);
        for (auto& th : pool) th.join();
        for (std::size_t i = 0; i < files.size(); ++i) {
            if (errors[i].empty()) continue;
            if (options_.on_error == OnError::stop)
                throw Error(errors[i] + "; remove or replace the file, or leave such images out (OnError::skip)");
            if (options_.log) *options_.log << "skipping " << errors[i] << '\n';
        }
        return errors;
    }

    std::filesystem::path root_;
    ImageFolderOptions options_;
    std::vector<std::string> classes_;
    std::vector<ImageFile> train_, validation_;
    std::vector<std::filesystem::path> skipped_;
};

} // namespace replica::data

namespace REPLICA_NAMESPACE {
using data::ImageFolder;
} // namespace replica
