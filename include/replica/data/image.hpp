#pragma once
// Decoding PNG (libpng) and JPEG (libjpeg-turbo) files, and fitting an image to a model's input:
// grey or RGB, resized or centre-cropped, planar floats in [0, 1].
//
// Needs libpng and libjpeg: link the `replica-images` dependency (Meson) or -lpng -ljpeg. The rest of
// the library does not include this header.

#include <png.h>

#include <csetjmp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

// jpeglib.h needs FILE and size_t declared first.
#include <jpeglib.h>

#include "replica/core/config.hpp"
#include "replica/core/error.hpp"
#include "replica/data/augment.hpp"

namespace REPLICA_NAMESPACE::data {

// 8-bit pixels as decoded: (height, width, channels) interleaved, channels 1 (grey) or 3 (RGB).
struct Image {
    std::size_t width = 0;
    std::size_t height = 0;
    std::size_t channels = 0;
    std::vector<std::uint8_t> pixels;
};

// How an image of another size becomes the model's square input.
enum class Fit {
    resize,       // scale each axis to the size (the aspect ratio changes when the image is not square)
    centre_crop,  // the largest centred square, scaled to the size (keeps the aspect ratio, loses the edges)
};

namespace detail {

struct JpegError {
    jpeg_error_mgr manager;
    std::jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
};

extern "C" inline void jpeg_fail(j_common_ptr info)
{
    auto* error = reinterpret_cast<JpegError*>(info->err);
    (*info->err->format_message)(info, error->message);
    std::longjmp(error->jump, 1);
}

// libjpeg goes on after corrupt data with a warning (level -1) and grey pixels: stop instead.
extern "C" inline void jpeg_message(j_common_ptr info, int level)
{
    if (level < 0) jpeg_fail(info);
}

// Decodes JPEG bytes into `out` (grey or RGB); false with `message` set when they are not a valid JPEG.
// No object with a destructor lives between setjmp and longjmp here.
inline bool decode_jpeg(const std::uint8_t* data, std::size_t size, Image& out, char* message)
{
    jpeg_decompress_struct info;
    JpegError error;
    info.err = jpeg_std_error(&error.manager);
    error.manager.error_exit = jpeg_fail;
    error.manager.emit_message = jpeg_message;
    if (setjmp(error.jump)) {
        std::snprintf(message, JMSG_LENGTH_MAX, "%s", error.message);
        jpeg_destroy_decompress(&info);
        return false;
    }
    jpeg_create_decompress(&info);
    jpeg_mem_src(&info, data, static_cast<unsigned long>(size));
    jpeg_read_header(&info, TRUE);
    info.out_color_space = info.num_components == 1 ? JCS_GRAYSCALE : JCS_RGB;
    jpeg_start_decompress(&info);
    out.width = info.output_width;
    out.height = info.output_height;
    out.channels = std::size_t(info.output_components);
    out.pixels.resize(out.width * out.height * out.channels);
    while (info.output_scanline < info.output_height) {
        JSAMPROW row = out.pixels.data() + std::size_t(info.output_scanline) * out.width * out.channels;
        jpeg_read_scanlines(&info, &row, 1);
    }
    jpeg_finish_decompress(&info);
    jpeg_destroy_decompress(&info);
    return true;
}

inline Image decode_png(const std::vector<std::uint8_t>& bytes, const std::string& name)
{
    png_image image{};
    image.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_memory(&image, bytes.data(), bytes.size()))
        throw Error(name + ": not a valid PNG image (libpng: " + image.message + ")");
    // Grey stays grey; colour (palette, alpha composited on black) becomes RGB.
    const bool colour = image.format & PNG_FORMAT_FLAG_COLOR;
    image.format = colour ? PNG_FORMAT_RGB : PNG_FORMAT_GRAY;
    Image out{image.width, image.height, colour ? 3u : 1u, {}};
    out.pixels.resize(PNG_IMAGE_SIZE(image));
    if (!png_image_finish_read(&image, nullptr, out.pixels.data(), 0, nullptr)) {
        const std::string message = image.message;
        png_image_free(&image);
        throw Error(name + ": corrupt PNG image (libpng: " + message + ")");
    }
    return out;
}

// Weights of a linear (triangle) filter that maps [start, start + length) of an axis of `size`
// pixels onto `out` pixels; widened when shrinking, so that every source pixel counts (no aliasing).
struct Taps {
    std::vector<std::size_t> first;   // per output pixel: its first source pixel
    std::vector<std::size_t> count;   // how many
    std::vector<float> weights;       // out * width, normalised to sum to 1
    std::size_t width = 0;
};

inline Taps taps(std::size_t size, double start, double length, std::size_t out)
{
    const double scale = length / double(out);
    const double support = std::max(scale, 1.0);
    Taps t;
    t.width = std::size_t(std::ceil(support)) * 2 + 2;
    t.first.resize(out);
    t.count.resize(out);
    t.weights.assign(out * t.width, 0.0f);
    for (std::size_t i = 0; i < out; ++i) {
        const double centre = start + (double(i) + 0.5) * scale;
        const auto lo = std::size_t(std::max(0.0, std::floor(centre - support)));
        const auto hi = std::min(size, std::size_t(std::max(0.0, std::ceil(centre + support))));
        double total = 0.0;
        std::size_t n = 0;
        for (std::size_t j = lo; j < hi && n < t.width; ++j, ++n) {
            const double w = std::max(0.0, 1.0 - std::abs((double(j) + 0.5 - centre) / support));
            t.weights[i * t.width + n] = float(w);
            total += w;
        }
        if (total == 0.0) { // a window that falls between pixels: take the nearest one
            t.first[i] = std::min(size - 1, std::size_t(centre));
            t.count[i] = 1;
            t.weights[i * t.width] = 1.0f;
            continue;
        }
        for (std::size_t k = 0; k < n; ++k) t.weights[i * t.width + k] = float(t.weights[i * t.width + k] / total);
        t.first[i] = lo;
        t.count[i] = n;
    }
    return t;
}

} // namespace detail

// Reads a PNG or JPEG file (the content decides, not the name). Throws Error naming the file when it
// cannot be read, is neither, or is corrupt or truncated.
inline Image read_image(const std::filesystem::path& file)
{
    const std::string name = file.string();
    std::ifstream in(file, std::ios::binary);
    if (!in) throw Error("cannot open image " + name + ": it does not exist or is not readable");
    std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) throw Error("cannot read image " + name);
    if (bytes.size() >= 8 && png_sig_cmp(bytes.data(), 0, 8) == 0) return detail::decode_png(bytes, name);
    if (bytes.size() >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF) {
        Image out;
        char message[JMSG_LENGTH_MAX] = {};
        if (!detail::decode_jpeg(bytes.data(), bytes.size(), out, message))
            throw Error(name + ": corrupt JPEG image (libjpeg: " + message + ")");
        return out;
    }
    throw Error(name + " is neither a PNG nor a JPEG image" +
                (bytes.empty() ? std::string(" (the file is empty)") : std::string(" (by its first bytes)")));
}

// `image` as `shape` (1 channel: grey; 3: RGB), planar, values pixel / 255, written to out[0, shape.size()).
// Grey from RGB is 0.299 R + 0.587 G + 0.114 B (ITU-R BT.601, as PIL's "L"); RGB from grey repeats it.
// Sizes differ: resampled with a linear filter, widened when shrinking.
inline void fit_image(const Image& image, ImageShape shape, Fit fit, float* out)
{
    core::require(shape.channels == 1 || shape.channels == 3,
                  "images are fitted to 1 (grey) or 3 (RGB) channels, not " + std::to_string(shape.channels));
    core::require(shape.height > 0 && shape.width > 0, "fit_image: the target size must not be 0");
    core::require(image.width > 0 && image.height > 0 && (image.channels == 1 || image.channels == 3) &&
                      image.pixels.size() == image.width * image.height * image.channels,
                  "fit_image: the image holds no pixels, or not width x height x (1 or 3) of them");
    const std::size_t w0 = image.width, h0 = image.height, c0 = image.channels;

    // Converted to the channels wanted, planar, in [0, 1].
    std::vector<float> planes(shape.channels * w0 * h0);
    const std::size_t plane0 = w0 * h0;
    for (std::size_t p = 0; p < plane0; ++p) {
        const std::uint8_t* px = image.pixels.data() + p * c0;
        if (shape.channels == 1) {
            planes[p] = c0 == 1 ? float(px[0]) / 255.0f
                                : (0.299f * float(px[0]) + 0.587f * float(px[1]) + 0.114f * float(px[2])) / 255.0f;
        } else {
            for (std::size_t c = 0; c < 3; ++c) planes[c * plane0 + p] = float(px[c0 == 1 ? 0 : c]) / 255.0f;
        }
    }

    double x0 = 0.0, y0 = 0.0, cw = double(w0), ch = double(h0); // the region that becomes the image
    if (fit == Fit::centre_crop) {
        // The largest centred region with the target's aspect ratio.
        const double target = double(shape.width) / double(shape.height);
        if (double(w0) / double(h0) > target) cw = double(h0) * target;
        else ch = double(w0) / target;
        x0 = (double(w0) - cw) / 2.0;
        y0 = (double(h0) - ch) / 2.0;
    }
    const detail::Taps tx = detail::taps(w0, x0, cw, shape.width);
    const detail::Taps ty = detail::taps(h0, y0, ch, shape.height);
    std::vector<float> rows(h0 * shape.width); // one channel resampled along x: (h0, width)
    for (std::size_t c = 0; c < shape.channels; ++c) {
        const float* src = planes.data() + c * plane0;
        for (std::size_t y = 0; y < h0; ++y)
            for (std::size_t x = 0; x < shape.width; ++x) {
                float v = 0.0f;
                for (std::size_t k = 0; k < tx.count[x]; ++k)
                    v += tx.weights[x * tx.width + k] * src[y * w0 + tx.first[x] + k];
                rows[y * shape.width + x] = v;
            }
        float* dst = out + c * shape.height * shape.width;
        for (std::size_t y = 0; y < shape.height; ++y)
            for (std::size_t x = 0; x < shape.width; ++x) {
                float v = 0.0f;
                for (std::size_t k = 0; k < ty.count[y]; ++k)
                    v += ty.weights[y * ty.width + k] * rows[(ty.first[y] + k) * shape.width + x];
                dst[y * shape.width + x] = v;
            }
    }
}

} // namespace replica::data
