#pragma once
// Fashion-MNIST (Xiao, Rasul, Vollgraf 2017): 28x28 grey images of 10 kinds of clothing,
// 60000 to train on and 10000 to test on, as IDX files.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

#include "replica/core/config.hpp"
#include "replica/core/error.hpp"
#include "replica/data/dataset.hpp"
#include "replica/data/idx.hpp"

namespace REPLICA_NAMESPACE::data {

enum class Split { train, test };

inline constexpr float fashion_mnist_mean = 0.2860f; // of pixel / 255 over the training images
inline constexpr float fashion_mnist_std = 0.3530f;
inline constexpr std::size_t fashion_mnist_classes = 10;
inline constexpr std::size_t fashion_mnist_side = 28;

// $REPLICA_FASHION_MNIST_DIR when set and not empty, else /usr/share/datasets/fashion-mnist
// (where Debian's dataset-fashion-mnist installs it).
inline std::filesystem::path default_fashion_mnist_dir()
{
    const char* dir = std::getenv("REPLICA_FASHION_MNIST_DIR");
    return dir && *dir ? std::filesystem::path(dir) : std::filesystem::path("/usr/share/datasets/fashion-mnist");
}

namespace detail {

inline std::string idx_name(const IdxArray& a, const char* fallback)
{
    return a.file.empty() ? std::string(fallback) : a.file.string();
}

// `set_name` ("Fashion-MNIST") makes the messages specific; empty keeps them generic.
inline Dataset make_dataset(const IdxArray& images, const IdxArray& labels, float mean, float stddev,
                            std::size_t classes, const std::string& set_name)
{
    const std::string images_name = idx_name(images, "the images");
    const std::string labels_name = idx_name(labels, "the labels");
    core::require(!images.dims.empty() && !labels.dims.empty(), "make_dataset: images and labels need at least one dim");
    core::require(stddev > 0.0f, "make_dataset: the standard deviation must be > 0, not " + std::to_string(stddev));
    core::require(classes > 0, "make_dataset: a data set needs at least one class");
    std::size_t image_total = 0, label_total = 0;
    core::require(dims_product(images.dims, image_total) && image_total == images.bytes.size(),
                  images_name + ": dims " + dims_text(images.dims) + " do not match its " +
                      std::to_string(images.bytes.size()) + " bytes");
    core::require(dims_product(labels.dims, label_total) && label_total == labels.bytes.size(),
                  labels_name + ": dims " + dims_text(labels.dims) + " do not match its " +
                      std::to_string(labels.bytes.size()) + " bytes");
    const std::size_t n = images.dims[0];
    core::require(n == labels.dims[0], images_name + " has " + std::to_string(n) + " images but " +
                                           std::to_string(labels.dims[0]) + " labels in " + labels_name +
                                           ": the files do not belong together");
    core::require(n > 0, images_name + " holds no images");

    Dataset set;
    set.count = n;
    set.input_size = image_total / n;
    set.label_size = label_total / n;

    const std::string range = "(0-" + std::to_string(classes - 1) + ")";
    set.labels.resize(label_total);
    for (std::size_t i = 0; i < label_total; ++i) {
        std::uint8_t label = labels.bytes[i];
        if (label >= classes) {
            throw Error("label " + std::to_string(label) + " at index " + std::to_string(i) + " in " + labels_name +
                        (set_name.empty() ? " is not a class " + range + ": the file is corrupt or holds other labels"
                                          : " is not a " + set_name + " class " + range +
                                                ": the file is corrupt or not " + set_name));
        }
        set.labels[i] = std::int32_t(label);
    }

    std::array<float, 256> value{};
    for (std::size_t p = 0; p < 256; ++p) value[p] = (float(p) / 255.0f - mean) / stddev;
    set.inputs.resize(image_total);
    for (std::size_t i = 0; i < image_total; ++i) set.inputs[i] = value[images.bytes[i]];
    return set;
}

// dir/name.gz when it exists, else dir/name.
inline std::filesystem::path fashion_mnist_file(const std::filesystem::path& dir, const std::string& name)
{
    std::error_code ec;
    std::filesystem::path gz = dir / (name + ".gz");
    if (std::filesystem::exists(gz, ec)) return gz;
    std::filesystem::path plain = dir / name;
    if (std::filesystem::exists(plain, ec)) return plain;
    throw Error("Fashion-MNIST file " + gz.string() + " (or " + name + ") not found: install Debian's "
                "dataset-fashion-mnist, set REPLICA_FASHION_MNIST_DIR or pass --data DIR");
}

} // namespace detail

// A data set from IDX images (N, ...) and labels (N) or (N, L), both unsigned bytes:
// inputs (pixel / 255 - mean) / std, input_size = product of the image dims after N;
// labels are class indices, label_size = product of the label dims after N.
// Throws Error when the counts differ or a label is not in [0, classes).
inline Dataset make_dataset(const IdxArray& images, const IdxArray& labels, float mean, float stddev,
                            std::size_t classes)
{
    return detail::make_dataset(images, labels, mean, stddev, classes, "");
}

// The train (60000) or test (10000) split from `dir`: inputs (N, 784) = 1x28x28 images normalised
// with Fashion-MNIST's mean and std, labels (N, 1) in [0, 10). Reads <prefix>-images-idx3-ubyte.gz
// and <prefix>-labels-idx1-ubyte.gz (prefix train or t10k), or the same names without .gz.
// Throws Error when a file is missing, corrupt, or not Fashion-MNIST.
inline Dataset load_fashion_mnist(Split split, const std::filesystem::path& dir = default_fashion_mnist_dir())
{
    const std::string prefix = split == Split::train ? "train" : "t10k";
    IdxArray images = read_idx(detail::fashion_mnist_file(dir, prefix + "-images-idx3-ubyte"));
    IdxArray labels = read_idx(detail::fashion_mnist_file(dir, prefix + "-labels-idx1-ubyte"));
    core::require(images.dims.size() == 3 && images.dims[1] == fashion_mnist_side &&
                      images.dims[2] == fashion_mnist_side,
                  images.file.string() + " has dims " + detail::dims_text(images.dims) +
                      "; Fashion-MNIST images are (N, 28, 28): the file is not Fashion-MNIST images");
    core::require(labels.dims.size() == 1, labels.file.string() + " has dims " + detail::dims_text(labels.dims) +
                                               "; Fashion-MNIST labels are (N): the file is not Fashion-MNIST labels");
    return detail::make_dataset(images, labels, fashion_mnist_mean, fashion_mnist_std, fashion_mnist_classes,
                                "Fashion-MNIST");
}

} // namespace replica::data

namespace REPLICA_NAMESPACE {
using data::default_fashion_mnist_dir;
using data::load_fashion_mnist;
using data::make_dataset;
using data::Split;
} // namespace replica
