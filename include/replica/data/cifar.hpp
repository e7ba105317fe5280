#pragma once
// CIFAR-10 (Krizhevsky 2009), binary version: 32x32 RGB images of 10 classes, 50000 to train on in
// data_batch_1.bin ... data_batch_5.bin and 10000 to test on in test_batch.bin. Users download it
// themselves ("CIFAR-10 binary version") and pass the folder that holds the .bin files.
//
// A record is 1 label byte (0-9) then 3072 pixel bytes: the red plane, then green, then blue, each
// 32x32 row by row. A file is a whole number of records.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

#include "replica/core/config.hpp"
#include "replica/core/error.hpp"
#include "replica/data/augment.hpp"
#include "replica/data/dataset.hpp"
#include "replica/data/fashion_mnist.hpp"

namespace REPLICA_NAMESPACE::data {

inline constexpr std::size_t cifar10_classes = 10;
inline constexpr ImageShape cifar10_shape{3, 32, 32};
inline constexpr std::size_t cifar10_record = 1 + 3 * 32 * 32;
inline const char* const cifar10_class_names[cifar10_classes] = {
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"};

// The records of one CIFAR-10 binary file: inputs (N, 3072) = 3x32x32 planar, pixel / 255 in [0, 1]
// (normalise with augmented() or normalised()), labels (N, 1). Throws Error naming the file when it
// is missing, empty, not a whole number of records (truncated), or holds a label that is not 0-9.
inline Dataset read_cifar10(const std::filesystem::path& file)
{
    const std::string name = file.string();
    std::error_code ec;
    core::require(std::filesystem::is_regular_file(file, ec),
                  "CIFAR-10 file " + name + " not found: download the CIFAR-10 binary version and pass its folder");
    const auto size = std::size_t(std::filesystem::file_size(file, ec));
    core::require(!ec, "cannot read the size of " + name + ": " + ec.message());
    core::require(size > 0, name + " is empty: download it again");
    core::require(size % cifar10_record == 0,
                  name + " holds " + std::to_string(size) + " bytes, not a whole number of " +
                      std::to_string(cifar10_record) + "-byte CIFAR-10 records (" + std::to_string(size / cifar10_record) +
                      " and " + std::to_string(size % cifar10_record) +
                      " bytes more): it is truncated or not the binary version; download it again");
    std::ifstream in(file, std::ios::binary);
    core::require(bool(in), "cannot open " + name);
    std::vector<std::uint8_t> bytes(size);
    in.read(reinterpret_cast<char*>(bytes.data()), std::streamsize(size));
    core::require(std::size_t(in.gcount()) == size, "cannot read " + name + ": it ended early");

    Dataset set;
    set.count = size / cifar10_record;
    set.input_size = cifar10_shape.size();
    set.inputs.resize(set.count * set.input_size);
    set.labels.resize(set.count);
    for (std::size_t r = 0; r < set.count; ++r) {
        const std::uint8_t* record = bytes.data() + r * cifar10_record;
        core::require(record[0] < cifar10_classes,
                      name + ": record " + std::to_string(r) + " has label " + std::to_string(record[0]) +
                          ", not a CIFAR-10 class (0-9): the file is corrupt or not CIFAR-10 (CIFAR-100 has two label bytes)");
        set.labels[r] = record[0];
        for (std::size_t i = 0; i < set.input_size; ++i)
            set.inputs[r * set.input_size + i] = float(record[1 + i]) / 255.0f;
    }
    return set;
}

// The train split (data_batch_1.bin ... data_batch_5.bin, in order) or the test split (test_batch.bin)
// from `dir`; see read_cifar10.
inline Dataset load_cifar10(Split split, const std::filesystem::path& dir)
{
    if (split == Split::test) return read_cifar10(dir / "test_batch.bin");
    Dataset all;
    for (int b = 1; b <= 5; ++b) {
        Dataset part = read_cifar10(dir / ("data_batch_" + std::to_string(b) + ".bin"));
        all.inputs.insert(all.inputs.end(), part.inputs.begin(), part.inputs.end());
        all.labels.insert(all.labels.end(), part.labels.begin(), part.labels.end());
        all.count += part.count;
        all.input_size = part.input_size;
    }
    return all;
}

} // namespace replica::data

namespace REPLICA_NAMESPACE {
using data::load_cifar10;
using data::read_cifar10;
} // namespace replica
