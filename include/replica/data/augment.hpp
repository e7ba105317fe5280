#pragma once
// Augmentation of images (C, H, W) with values in [0, 1]: a random crop of the image padded with
// zeros, a horizontal flip, then per-channel normalisation (x - mean) / std.
//
// Every random choice is random_bits(seed, Stream::augment, epoch, sample index, k): a pure function
// of (seed, epoch, index), so a run is reproducible and does not depend on how many replicas,
// processes or loader threads share the work.
//
//   auto train = data::augmented(folder.train(), folder.shape(), {.crop_padding = 2, .flip = true});
//   auto validation = data::normalised(folder.validation(), folder.shape(), train.stats);

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "replica/core/config.hpp"
#include "replica/core/error.hpp"
#include "replica/core/rng.hpp"
#include "replica/data/dataset.hpp"
#include "replica/data/source.hpp"

namespace REPLICA_NAMESPACE::data {

// The shape of one image sample: channels x height x width, stored channel by channel (planar).
struct ImageShape {
    std::size_t channels = 0;
    std::size_t height = 0;
    std::size_t width = 0;
    std::size_t size() const { return channels * height * width; }
};

// Per-channel mean and standard deviation of pixel values.
struct ChannelStats {
    std::vector<float> mean;
    std::vector<float> stddev;
};

struct AugmentOptions {
    std::size_t crop_padding = 0;  // pad each side with this many zeros, crop the image's size at a random place; 0: no crop
    bool flip = false;             // mirror left-right with probability 1/2
    ChannelStats stats = {};       // empty: computed from the source (channel_stats), before augmentation
    std::uint64_t seed = 1;
};

// Mean and (population) standard deviation of each channel over every sample of `source` as epoch 0
// reads it. Throws Error when the source's samples are not `shape`, or a channel is constant (its
// standard deviation is 0: normalising it would divide by zero).
inline ChannelStats channel_stats(const SampleSource& source, ImageShape shape)
{
    core::require(shape.size() > 0 && source.input_size == shape.size(),
                  "channel_stats: the samples have " + std::to_string(source.input_size) + " values, not " +
                      std::to_string(shape.channels) + "x" + std::to_string(shape.height) + "x" +
                      std::to_string(shape.width));
    core::require(source.count > 0, "channel_stats: the source has no samples");
    std::vector<double> sum(shape.channels, 0.0), square(shape.channels, 0.0);
    std::vector<float> image(shape.size());
    std::vector<std::int32_t> label(source.label_size);
    const std::size_t plane = shape.height * shape.width;
    for (std::size_t s = 0; s < source.count; ++s) {
        source.read(s, 0, image.data(), label.data());
        for (std::size_t c = 0; c < shape.channels; ++c)
            for (std::size_t p = 0; p < plane; ++p) {
                const double v = image[c * plane + p];
                sum[c] += v;
                square[c] += v * v;
            }
    }
    ChannelStats stats;
    const double n = double(source.count) * double(plane);
    for (std::size_t c = 0; c < shape.channels; ++c) {
        const double mean = sum[c] / n;
        const double stddev = std::sqrt(std::max(0.0, square[c] / n - mean * mean));
        core::require(stddev > 1e-6, "channel " + std::to_string(c) + " has the same value " + std::to_string(mean) +
                                         " in every pixel of every image: give the mean and std to normalise with");
        stats.mean.push_back(float(mean));
        stats.stddev.push_back(float(stddev));
    }
    return stats;
}

// Augments one image at a time; see the top of the file. Copyable, and safe to use from several
// threads at once.
class Augment {
public:
    Augment(ImageShape shape, AugmentOptions options) : shape_(shape), options_(std::move(options))
    {
        core::require(shape.size() > 0, "Augment needs an image shape with no zero dimension");
        const auto& st = options_.stats;
        core::require(st.mean.size() == shape.channels && st.stddev.size() == shape.channels,
                      "Augment: give one mean and one std per channel (" + std::to_string(shape.channels) +
                          "), not " + std::to_string(st.mean.size()) + " and " + std::to_string(st.stddev.size()));
        for (float s : st.stddev)
            core::require(s > 0.0f && std::isfinite(s), "Augment: every channel's std must be > 0, not " + std::to_string(s));
        core::require(options_.crop_padding <= std::min(shape.height, shape.width),
                      "Augment: crop padding " + std::to_string(options_.crop_padding) +
                          " is larger than the image; use at most " + std::to_string(std::min(shape.height, shape.width)));
    }

    const ImageShape& shape() const { return shape_; }
    const ChannelStats& stats() const { return options_.stats; }

    // Augments `image` (shape().size() values, (C, H, W), in [0, 1]) in place, as sample `index` of
    // epoch `epoch`; `scratch` is resized and used as work space.
    void apply(std::span<float> image, std::uint64_t epoch, std::size_t index, std::vector<float>& scratch) const
    {
        const std::size_t h = shape_.height, w = shape_.width, pad = options_.crop_padding;
        bool flip = false;
        std::size_t dy = pad, dx = pad; // where the crop starts in the padded image; pad, pad: the image itself
        if (pad) {
            dy = draw(epoch, index, 0) % (2 * pad + 1);
            dx = draw(epoch, index, 1) % (2 * pad + 1);
        }
        if (options_.flip) flip = draw(epoch, index, 2) & 1u;
        if (pad || flip) {
            scratch.assign(image.begin(), image.end());
            for (std::size_t c = 0; c < shape_.channels; ++c)
                for (std::size_t y = 0; y < h; ++y)
                    for (std::size_t x = 0; x < w; ++x) {
                        // output (y, x) shows padded (y + dy, x' + dx), x' mirrored when flipped
                        const std::size_t xs = flip ? w - 1 - x : x;
                        const std::size_t sy = y + dy, sx = xs + dx; // in the padded image
                        const bool inside = sy >= pad && sy < h + pad && sx >= pad && sx < w + pad;
                        image[(c * h + y) * w + x] = inside ? scratch[(c * h + sy - pad) * w + sx - pad] : 0.0f;
                    }
        }
        normalise(image);
    }

    // (x - mean) / std per channel, in place.
    void normalise(std::span<float> image) const
    {
        const std::size_t plane = shape_.height * shape_.width;
        for (std::size_t c = 0; c < shape_.channels; ++c) {
            const float mean = options_.stats.mean[c], inv = 1.0f / options_.stats.stddev[c];
            for (std::size_t p = 0; p < plane; ++p) image[c * plane + p] = (image[c * plane + p] - mean) * inv;
        }
    }

private:
    std::uint32_t draw(std::uint64_t epoch, std::size_t index, std::uint32_t k) const
    {
        return core::random_bits(options_.seed, core::Stream::augment, std::uint32_t(epoch), index, k);
    }

    ImageShape shape_;
    AugmentOptions options_;
};

// A source whose samples are `base`'s, augmented by epoch and index; stats computed from `base` when
// not given. `base` is copied (what it refers to must outlive the result). The chosen statistics are
// in `.stats`, to normalise the validation set with the same numbers.
struct AugmentedSource : SampleSource {
    ChannelStats stats;
};

inline AugmentedSource augmented(SampleSource base, ImageShape shape, AugmentOptions options = {})
{
    core::require(base.input_size == shape.size(),
                  "augmented: the samples have " + std::to_string(base.input_size) + " values, not " +
                      std::to_string(shape.channels) + "x" + std::to_string(shape.height) + "x" +
                      std::to_string(shape.width));
    if (options.stats.mean.empty() && options.stats.stddev.empty()) options.stats = channel_stats(base, shape);
    Augment augment(shape, std::move(options));
    AugmentedSource out;
    out.count = base.count;
    out.input_size = base.input_size;
    out.label_size = base.label_size;
    out.threads = base.threads;
    out.stats = augment.stats();
    out.read = [base = std::move(base), augment](std::size_t index, std::uint64_t epoch, float* input,
                                                  std::int32_t* label) {
        thread_local std::vector<float> scratch;
        base.read(index, epoch, input, label);
        augment.apply({input, augment.shape().size()}, epoch, index, scratch);
    };
    return out;
}

// `set` (images of `shape`, values in [0, 1]) normalised per channel with `stats`: for validation and
// test sets, which are not augmented.
inline Dataset normalised(Dataset set, ImageShape shape, const ChannelStats& stats)
{
    core::require(set.input_size == shape.size(), "normalised: the samples have " + std::to_string(set.input_size) +
                                                      " values, not " + std::to_string(shape.size()));
    const Augment augment(shape, {.stats = stats});
    for (std::size_t s = 0; s < set.count; ++s) augment.normalise({set.inputs.data() + s * set.input_size, set.input_size});
    return set;
}

} // namespace replica::data
