// Writes the seed corpora of the fuzz targets into the folder given (scripts/fuzz runs it once):
//   idx/         small valid IDX files, plain and gzip-compressed, and a few damaged ones
//   checkpoint/  valid checkpoints of the fuzzed model (with and without history and optimizer state)

#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "replica/layers/activation.hpp"
#include "replica/layers/linear.hpp"
#include "replica/model/input.hpp"
#include "replica/model/sequential.hpp"
#include "replica/train/checkpoint.hpp"
#include "replica/data/idx.hpp"
#include "replica/train/sgd.hpp"
#include "replica/train/step.hpp"

namespace fs = std::filesystem;
using Net = replica::Sequential<replica::Input<4>, replica::Linear<3>, replica::ReLU, replica::Linear<2>>;

static void write(const fs::path& file, const std::vector<char>& bytes)
{
    std::ofstream(file, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

static std::vector<char> read(const fs::path& file)
{
    std::ifstream in(file, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
}

static void gzip(const fs::path& from, const fs::path& to)
{
    const std::vector<char> bytes = read(from);
    gzFile out = gzopen(to.c_str(), "wb");
    gzwrite(out, bytes.data(), unsigned(bytes.size()));
    gzclose(out);
}

int main(int argc, char** argv)
{
    if (argc != 2) {
        std::fprintf(stderr, "usage: make_seeds DIR\n");
        return 2;
    }
    const fs::path root = argv[1];
    fs::create_directories(root / "idx");
    fs::create_directories(root / "checkpoint");

    replica::write_idx(root / "idx" / "labels.idx", {5}, {0, 1, 2, 3, 9});
    std::vector<std::uint8_t> pixels(2 * 3 * 3);
    for (std::size_t i = 0; i < pixels.size(); ++i) pixels[i] = std::uint8_t(i * 13);
    replica::write_idx(root / "idx" / "images.idx", {2, 3, 3}, pixels);
    gzip(root / "idx" / "labels.idx", root / "idx" / "labels.idx.gz");
    gzip(root / "idx" / "images.idx", root / "idx" / "images.idx.gz");
    std::vector<char> cut = read(root / "idx" / "images.idx.gz");
    cut.resize(cut.size() / 2);
    write(root / "idx" / "images-cut.idx.gz", cut);

    Net net{replica::Device::cpu(), 1};
    replica::save_checkpoint(root / "checkpoint" / "fresh.ckpt", net, {});
    replica::SGD opt{{.lr = 0.1f, .momentum = 0.9f}};
    const std::vector<float> inputs = {0.5f, -1.0f, 0.25f, 2.0f, 1.0f, 0.0f, -0.5f, 0.75f};
    const std::vector<std::int32_t> labels = {1, 0};
    replica::train_step(net, opt, replica::Batch{inputs.data(), labels.data(), 2, 0, 1});
    replica::save_checkpoint(root / "checkpoint" / "trained.ckpt", net,
                             {.epoch = 2, .step = 2, .seed = 1,
                              .history = {{1, 0.7, 0.6, 0.5, 0.01}, {2, 0.5, std::nan(""), std::nan(""), 0.01}}});
    replica::save_checkpoint(root / "checkpoint" / "scaled.ckpt", net,   // format 3: with loss scaling's state
                             {.epoch = 2, .step = 2, .seed = 1,
                              .loss_scale = replica::LossScaleState{.scale = 1024.0f, .clean_steps = 5, .skipped_steps = 1}});
    return 0;
}
