#pragma once
// IDX files, the format of MNIST and Fashion-MNIST: plain or gzip-compressed, unsigned bytes only.
//
// Layout: magic 0x00 0x00 <type> <rank>, then `rank` big-endian uint32 dims, then product(dims)
// values row-major. Type 0x08 is unsigned byte.

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <system_error>
#include <vector>

#include "replica/core/config.hpp"
#include "replica/core/error.hpp"

namespace REPLICA_NAMESPACE::data {

// An array of unsigned bytes: `bytes` holds product(dims) values, row-major.
struct IdxArray {
    std::vector<std::size_t> dims;
    std::vector<std::uint8_t> bytes;
    std::filesystem::path file; // where it was read from; empty when made in memory
};

namespace detail {

inline std::string hex_byte(std::uint8_t b)
{
    char text[8];
    std::snprintf(text, sizeof text, "0x%02X", unsigned(b));
    return text;
}

inline std::string dims_text(const std::vector<std::size_t>& dims)
{
    std::string text;
    for (std::size_t i = 0; i < dims.size(); ++i) text += (i ? "x" : "") + std::to_string(dims[i]);
    return text.empty() ? "(no dims)" : text;
}

// product(dims), or false when it does not fit in size_t.
inline bool dims_product(const std::vector<std::size_t>& dims, std::size_t& total)
{
    total = 1;
    for (std::size_t d : dims) {
        if (d != 0 && total > std::numeric_limits<std::size_t>::max() / d) return false;
        total *= d;
    }
    return true;
}

// A file read through zlib: gzip-compressed or plain (gzread passes plain files through).
class GzReader {
public:
    explicit GzReader(const std::filesystem::path& file)
        : name_(file.string()), handle_(gzopen(name_.c_str(), "rb"))
    {
        if (!handle_) throw Error("cannot open " + name_ + ": " + std::strerror(errno));
        gzbuffer(handle_, 1u << 15);   // zlib allocates 3x this: small enough for malloc's pools
    }
    ~GzReader() { gzclose(handle_); }
    GzReader(const GzReader&) = delete;
    GzReader& operator=(const GzReader&) = delete;

    // Reads up to n bytes into dst; returns fewer only at the end of the data. Throws Error on a
    // read error or a corrupt gzip stream.
    std::size_t read(void* dst, std::size_t n)
    {
        auto* out = static_cast<unsigned char*>(dst);
        std::size_t done = 0;
        while (done < n) {
            unsigned chunk = unsigned(std::min<std::size_t>(n - done, std::size_t{1} << 30));
            int got = gzread(handle_, out + done, chunk);
            if (got < 0) fail();
            done += std::size_t(got);
            if (unsigned(got) < chunk) break;
        }
        if (done < n) {
            int code = Z_OK;
            gzerror(handle_, &code);
            if (code != Z_OK) fail();
        }
        return done;
    }

private:
    [[noreturn]] void fail()
    {
        int code = Z_OK;
        const char* message = gzerror(handle_, &code);
        if (code == Z_ERRNO) throw Error("cannot read " + name_ + ": " + std::strerror(errno));
        throw Error(name_ + ": corrupt gzip stream (zlib: " + message +
                    "): the file is damaged or truncated; download it again");
    }

    std::string name_;
    gzFile handle_;
};

inline std::string idx_type_name(std::uint8_t type)
{
    switch (type) {
    case 0x08: return "0x08 (unsigned byte)";
    case 0x09: return "0x09 (signed byte)";
    case 0x0B: return "0x0B (int16)";
    case 0x0C: return "0x0C (int32)";
    case 0x0D: return "0x0D (float32)";
    case 0x0E: return "0x0E (float64)";
    default: return hex_byte(type) + " (not an IDX type)";
    }
}

} // namespace detail

// Reads an IDX file of unsigned bytes, plain or gzip-compressed (any name: the content decides).
// Throws Error naming the file when it is missing, is not IDX, holds another type, has no dims,
// holds fewer or more bytes than its dims promise, or is a corrupt gzip stream.
inline IdxArray read_idx(const std::filesystem::path& file)
{
    const std::string name = file.string();
    std::error_code ec;
    core::require(std::filesystem::exists(file, ec),
                  "IDX file " + name + " not found: install Debian's dataset-fashion-mnist or pass --data DIR");
    core::require(!std::filesystem::is_directory(file, ec), name + " is a directory, not an IDX file");

    detail::GzReader in(file);
    std::uint8_t magic[4];
    core::require(in.read(magic, 4) == 4,
                  name + " is truncated: it ends inside the 4-byte IDX magic; download it again");
    core::require(magic[0] == 0 && magic[1] == 0,
                  name + " is not an IDX file: it starts with " + detail::hex_byte(magic[0]) + " " +
                      detail::hex_byte(magic[1]) + " instead of 0x00 0x00; the file is corrupt or in another format");
    core::require(magic[2] == 0x08, name + " holds IDX type " + detail::idx_type_name(magic[2]) +
                                        "; only unsigned bytes (0x08) are supported");
    const std::size_t rank = magic[3];
    core::require(rank >= 1, name + " declares 0 dims; an IDX array has at least one: the file is corrupt");

    std::uint8_t header[4 * 255];
    core::require(in.read(header, 4 * rank) == 4 * rank,
                  name + " is truncated: it ends inside the header of " + std::to_string(rank) +
                      " dims; download it again");
    IdxArray out;
    out.file = file;
    out.dims.resize(rank);
    for (std::size_t i = 0; i < rank; ++i) {
        const std::uint8_t* b = header + 4 * i;
        out.dims[i] = (std::size_t(b[0]) << 24) | (std::size_t(b[1]) << 16) | (std::size_t(b[2]) << 8) | b[3];
    }
    std::size_t total = 0;
    core::require(detail::dims_product(out.dims, total),
                  name + " declares dims " + detail::dims_text(out.dims) + ", too many values: the file is corrupt");

    // Grown geometrically from 64 KiB, so that a header promising more than the file holds costs no
    // more memory than the file's own size (about twice it) before it gives "truncated".
    while (out.bytes.size() < total) {
        std::size_t have = out.bytes.size();
        std::size_t want = std::min(std::clamp(have, std::size_t{1} << 16, std::size_t{1} << 26), total - have);
        out.bytes.resize(have + want);
        std::size_t got = in.read(out.bytes.data() + have, want);
        core::require(got == want, name + " is truncated: its header promises " + std::to_string(total) +
                                       " bytes of data (dims " + detail::dims_text(out.dims) + ") but it holds only " +
                                       std::to_string(have + got) + "; download it again");
    }
    std::uint8_t extra;
    core::require(in.read(&extra, 1) == 0, name + " holds more data than its dims " + detail::dims_text(out.dims) +
                                               " promise: the file is corrupt");
    return out;
}

// Writes `bytes` as a plain (uncompressed) IDX file of unsigned bytes with dims `dims`.
// Throws Error when bytes.size() != product(dims), a dim exceeds 2^32 - 1, or the file cannot be written.
inline void write_idx(const std::filesystem::path& file, const std::vector<std::size_t>& dims,
                      const std::vector<std::uint8_t>& bytes)
{
    const std::string name = file.string();
    core::require(!dims.empty() && dims.size() <= 255,
                  "write_idx(" + name + "): an IDX array has 1 to 255 dims, not " + std::to_string(dims.size()));
    std::size_t total = 0;
    bool fits = detail::dims_product(dims, total);
    for (std::size_t d : dims) fits = fits && d <= std::numeric_limits<std::uint32_t>::max();
    core::require(fits && total == bytes.size(), "write_idx(" + name + "): dims " + detail::dims_text(dims) +
                                                     " do not match the " + std::to_string(bytes.size()) + " bytes given");

    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    core::require(bool(out), "cannot create " + name + ": " + std::strerror(errno));
    char header[4 + 4 * 255] = {0, 0, 0x08, char(dims.size())};
    for (std::size_t i = 0; i < dims.size(); ++i)
        for (int b = 0; b < 4; ++b) header[4 + 4 * i + std::size_t(b)] = char((dims[i] >> (24 - 8 * b)) & 0xFF);
    out.write(header, std::streamsize(4 + 4 * dims.size()));
    out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    out.close();
    core::require(!out.fail(), "cannot write " + name + ": " + std::strerror(errno));
}

} // namespace replica::data

namespace REPLICA_NAMESPACE {
using data::IdxArray;
using data::read_idx;
using data::write_idx;
} // namespace replica
