#pragma once
// TokenFile: a text for a language model, tokenised byte by byte: each byte is a token id in
// [0, 256), so the model's vocabulary must hold at least 256 ids. There is no tokenizer.
//
//   data::TokenFile text{"book.txt", {.validation = 0.1}};   // the last 10% of the bytes held out
//   trainer.fit(text.train(64, 10000, seed), text.validation(64));   // a model with Input<Tokens<64>>
//
// A sample is a window of T + 1 consecutive bytes: the inputs are its first T bytes, the labels its
// last T (the next byte at each position). Training windows start at random places in the training
// part, each drawn from (seed, epoch, index) alone, so the data do not depend on the device count,
// thread count or batch order; validation windows are fixed.

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "replica/core/config.hpp"
#include "replica/core/error.hpp"
#include "replica/core/rng.hpp"
#include "replica/data/dataset.hpp"
#include "replica/data/source.hpp"

namespace REPLICA_NAMESPACE::data {

struct TokenFileOptions {
    double validation = 0.1;                       // the last round(validation x size) bytes, held out; in [0, 1)
    std::uint64_t max_bytes = std::uint64_t{1} << 31;   // a longer text is refused (read with this bound)
};

namespace detail {

inline std::string fraction_text(double fraction)
{
    char text[32];
    std::snprintf(text, sizeof text, "%g", fraction);
    return text;
}

// Appends the bytes of `file` to `text`; throws Error naming the file when it is missing, a
// directory or unreadable, or when `text` would grow past max_bytes. A file that is not regular (a
// pipe, a device) is read up to max_bytes + 1 bytes at most.
inline void append_file(const std::filesystem::path& file, std::uint64_t max_bytes, std::string& text)
{
    const std::string name = file.string();
    std::error_code ec;
    const std::filesystem::file_status status = std::filesystem::status(file, ec);
    core::require(status.type() != std::filesystem::file_type::not_found, "text file " + name + " not found");
    if (ec) throw Error("cannot open " + name + ": " + ec.message());
    core::require(!std::filesystem::is_directory(status),
                  name + " is a directory, not a text file: give a file, or several (TokenFile::from_files)");
    auto too_long = [&] {
        return Error("text file " + name + " makes the text longer than " + std::to_string(max_bytes) +
                     " bytes (TokenFileOptions::max_bytes): cut it, or raise max_bytes if the memory allows");
    };
    if (std::filesystem::is_regular_file(status)) {
        const std::uintmax_t size = std::filesystem::file_size(file, ec);
        if (!ec) {
            if (size > max_bytes - std::min<std::uint64_t>(text.size(), max_bytes)) throw too_long();
            text.reserve(text.size() + std::size_t(size));
        }
    }

    std::unique_ptr<std::FILE, int (*)(std::FILE*)> in(std::fopen(name.c_str(), "rb"), &std::fclose);
    if (!in) throw Error("cannot open " + name + ": " + std::strerror(errno));
    constexpr std::size_t chunk = std::size_t{1} << 20;
    for (;;) {
        const std::size_t have = text.size();
        // At most one byte past the bound, so that an endless input ends in an Error.
        const std::uint64_t room = max_bytes - have;   // have <= max_bytes here
        const std::size_t want = room >= chunk ? chunk : std::size_t(room + 1);
        text.resize(have + want);
        const std::size_t got = std::fread(text.data() + have, 1, want, in.get());
        text.resize(have + got);
        if (text.size() > max_bytes) throw too_long();
        if (got < want) {
            if (std::ferror(in.get())) throw Error("cannot read " + name + ": " + std::strerror(errno));
            return;
        }
    }
}

} // namespace detail

// The bytes of one or more files (or of a string), split into a training part (the first
// size() - validation_size() bytes) and a validation part (the rest), contiguous so that no window
// holds bytes of both. Construction throws Error naming the file when it is missing, a directory,
// unreadable, longer than max_bytes, or when the text is empty or the validation fraction is not in
// [0, 1). The text is shared, never copied, by copies of the TokenFile and by the sample sources it
// makes: a source stays valid on its own, after the TokenFile is gone. Nothing changes the text, so
// any number of threads may read it at once.
class TokenFile {
public:
    static constexpr std::size_t vocabulary = 256;

    explicit TokenFile(const std::filesystem::path& file, TokenFileOptions options = {})
        : TokenFile(Bytes{read({file}, options)}, options)
    {
    }

    // The files' bytes one after another, in the order given (windows may span two files).
    static TokenFile from_files(const std::vector<std::filesystem::path>& files, TokenFileOptions options = {})
    {
        return TokenFile(Bytes{read(files, options)}, options);
    }

    // The bytes of `text`, as if read from a file.
    static TokenFile from_text(std::string text, TokenFileOptions options = {})
    {
        core::require(text.size() <= options.max_bytes,
                      "TokenFile: the text's " + std::to_string(text.size()) + " bytes are more than " +
                          std::to_string(options.max_bytes) + " (TokenFileOptions::max_bytes)");
        return TokenFile(Bytes{std::move(text)}, options);
    }

    std::string_view text() const { return *text_; }
    std::size_t size() const { return text_->size(); }
    std::size_t train_size() const { return train_size_; }
    std::size_t validation_size() const { return text_->size() - train_size_; }

    // `samples_per_epoch` windows of T + 1 bytes of the training part. Sample `index` of epoch `epoch`
    // starts at window_start(T, seed, epoch, index): inputs = bytes [p, p + T), labels = bytes
    // [p + 1, p + T] as token ids. Throws Error when T is 0, the training part is shorter than T + 1
    // bytes, or samples_per_epoch is not in [1, 2^32].
    TokenSampleSource train(std::size_t T, std::size_t samples_per_epoch, std::uint64_t seed) const
    {
        check_window(T, train_size_, "training", "the first");
        core::require(samples_per_epoch > 0 && samples_per_epoch <= (std::uint64_t{1} << 32),
                      "TokenFile::train: samples_per_epoch must be in [1, 2^32], not " + std::to_string(samples_per_epoch));
        const std::uint64_t starts = train_size_ - T;
        return source(samples_per_epoch, T, [text = text_, T, seed, starts](std::size_t index, std::uint64_t epoch,
                                                                             std::int32_t* input, std::int32_t* label) {
            copy_window(*text, start(seed, epoch, index, starts), T, input, label);
        });
    }

    // Where training sample `index` of epoch `epoch` starts: uniform in [0, train_size() - T - 1],
    // ((high << 32) | low) mod (train_size() - T), where low and high are
    // random_bits(seed, Stream::text_window, 0 and 1, epoch, index); the bias is at most
    // (train_size() - T) / 2^64.
    std::size_t window_start(std::size_t T, std::uint64_t seed, std::uint64_t epoch, std::size_t index) const
    {
        check_window(T, train_size_, "training", "the first");
        core::require(index < (std::uint64_t{1} << 32), "TokenFile::window_start: index must be below 2^32");
        return start(seed, epoch, index, train_size_ - T);
    }

    // The validation part as (validation_size() - 1) / T consecutive windows: window k starts at byte
    // train_size() + k T, so their inputs tile the part and each window's last label is the next one's
    // first input. The same in every epoch: the validation loss is a function of the model alone.
    // Held in memory: 8 bytes for each byte of the part. Throws Error when T is 0, or the validation part is empty or shorter than T + 1 bytes.
    TokenDataset validation(std::size_t T) const
    {
        const TokenSampleSource windows = validation_source(T);
        TokenDataset set;
        set.count = windows.count;
        set.input_size = T;
        set.label_size = T;
        set.inputs.resize(windows.count * T);
        set.labels.resize(windows.count * T);
        for (std::size_t k = 0; k < windows.count; ++k)
            windows.read(k, 0, set.inputs.data() + k * T, set.labels.data() + k * T);
        return set;
    }

    // The windows of validation(T), read on demand (for a loader) instead of held in memory.
    TokenSampleSource validation_source(std::size_t T) const
    {
        core::require(validation_size() > 0, "TokenFile: there is no validation part (validation = " +
                                                 detail::fraction_text(options_.validation) + " of " + std::to_string(size()) +
                                                 " bytes holds out none): set TokenFileOptions::validation to the "
                                                 "fraction of the text to hold out, such as 0.1");
        check_window(T, validation_size(), "validation", "the last");
        const std::size_t first = train_size_;
        return source((validation_size() - 1) / T, T,
                      [text = text_, T, first](std::size_t index, std::uint64_t, std::int32_t* input, std::int32_t* label) {
                          copy_window(*text, first + index * T, T, input, label);
                      });
    }

    // The token ids of `text`: its bytes as unsigned values.
    static std::vector<std::int32_t> encode(std::string_view text)
    {
        std::vector<std::int32_t> ids(text.size());
        for (std::size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
        return ids;
    }

    // The bytes that `ids` stand for; throws Error naming the first id outside [0, 256).
    static std::string decode(std::span<const std::int32_t> ids)
    {
        std::string text(ids.size(), '\0');
        for (std::size_t i = 0; i < ids.size(); ++i) {
            core::require(ids[i] >= 0 && ids[i] < std::int32_t(vocabulary),
                          "TokenFile::decode: id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                              " is not a byte: ids of a byte-level text are in [0, 256)");
            text[i] = char(static_cast<unsigned char>(ids[i]));
        }
        return text;
    }

    // `text` on one line, for printing samples: printable ASCII as it is, a backslash as \\, newline
    // and tab as \n and \t, every other byte as \xHH.
    static std::string printable(std::string_view text)
    {
        std::string out;
        out.reserve(text.size());
        for (char ch : text) {
            const auto b = static_cast<unsigned char>(ch);
            if (b == '\\') {
                out += "\\\\";
            } else if (b == '\n') {
                out += "\\n";
            } else if (b == '\t') {
                out += "\\t";
            } else if (b >= 0x20 && b < 0x7F) {
                out += ch;
            } else {
                char hex[8];
                std::snprintf(hex, sizeof hex, "\\x%02X", unsigned(b));
                out += hex;
            }
        }
        return out;
    }

private:
    struct Bytes {   // a type of its own, so that a path given as a string never means the text
        std::string text;
    };

    TokenFile(Bytes bytes, TokenFileOptions options)
        : text_(std::make_shared<const std::string>(std::move(bytes.text))), options_(options)
    {
        core::require(options_.validation >= 0.0 && options_.validation < 1.0,
                      "TokenFile: the validation fraction must be in [0, 1), not " +
                          detail::fraction_text(options_.validation));
        core::require(!text_->empty(), "TokenFile: the text is empty: give a file that holds text");
        const auto held_out = std::size_t(options_.validation * double(text_->size()) + 0.5);
        train_size_ = text_->size() - std::min(held_out, text_->size());
    }

    static std::string read(const std::vector<std::filesystem::path>& files, const TokenFileOptions& options)
    {
        core::require(!files.empty(), "TokenFile::from_files: give at least one file");
        std::string text;
        for (const std::filesystem::path& file : files) detail::append_file(file, options.max_bytes, text);
        core::require(!text.empty(), (files.size() == 1 ? "text file " + files[0].string() + " is empty"
                                                        : std::string("the text files are all empty")) +
                                         ": a language model needs text to learn from");
        return text;
    }

    // Throws Error unless a window of T + 1 bytes fits in `part` (`bytes` long).
    void check_window(std::size_t T, std::size_t bytes, const char* part, const char* where) const
    {
        core::require(T > 0, "TokenFile: the context T must be at least 1 token");
        core::require(bytes > T, "TokenFile: a window of T + 1 = " + std::to_string(T) + " + 1 bytes does not fit in the " +
                                     part + " part's " + std::to_string(bytes) + " bytes (" + where + " of " +
                                     std::to_string(size()) + " bytes, validation = " +
                                     detail::fraction_text(options_.validation) +
                                     "): give a longer text, a shorter context T, or another validation fraction");
    }

    static std::size_t start(std::uint64_t seed, std::uint64_t epoch, std::size_t index, std::uint64_t starts)
    {
        const std::uint64_t low = core::random_bits(seed, core::Stream::text_window, 0, epoch, std::uint32_t(index));
        const std::uint64_t high = core::random_bits(seed, core::Stream::text_window, 1, epoch, std::uint32_t(index));
        return std::size_t(((high << 32) | low) % starts);
    }

    // inputs = bytes [p, p + T), labels = bytes [p + 1, p + T], as ids.
    static void copy_window(const std::string& text, std::size_t p, std::size_t T, std::int32_t* input,
                            std::int32_t* label)
    {
        const auto* bytes = reinterpret_cast<const unsigned char*>(text.data()) + p;
        for (std::size_t i = 0; i < T; ++i) {
            input[i] = bytes[i];
            label[i] = bytes[i + 1];
        }
    }

    // A read is a copy of 2T values: cheaper than the threads the loader would start for each batch.
    template <class Read>
    static TokenSampleSource source(std::size_t count, std::size_t T, Read read)
    {
        TokenSampleSource out(count, T, T, std::move(read));
        out.threads = 1;
        return out;
    }

    std::shared_ptr<const std::string> text_;
    TokenFileOptions options_;
    std::size_t train_size_ = 0;
};

} // namespace replica::data

namespace REPLICA_NAMESPACE {
using data::TokenFile;
using data::TokenFileOptions;
} // namespace replica
