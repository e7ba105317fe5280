#pragma once
// Timed choices kept on disk between runs: the CUDA backend's autotuner (backend/cuda/tuning.hpp)
// records what it chose by timing, and a later run takes it instead of timing again. A record is a
// key, what was timed (its kind and shape) and on what (TuningEnvironment), and a value, what was
// chosen; shape and value are 64-bit words that the caller gives meaning to. A record is found only
// by a key equal in every field, and the caller checks that its value is usable before taking it.
//
// The file is written whole (core/atomic_file.hpp, a temporary name unique to the writer, renamed):
// a reader never sees part of one, and several processes may write it at once; the last rename
// stays, holding what its writer read from the file just before and every record of its own. A file
// that is not a whole tuning cache of this format is ignored with one line to the log, and replaced
// by the next write; a file or folder that cannot be written gets one line too, and the choices stay
// in memory. Nothing here throws for what a file holds. Host-only: tested without a GPU.
//
// The file, <folder>/tuning.bin (tuning_cache_folder), every number little-endian:
//   bytes  what
//   8      magic "RPLTUNE\n"
//   4      u32 format version (1)
//   4      u32 record count
//          each record:
//            string kind, string device, string driver      (a string: u32 length, then its bytes)
//            8 x 4  i64 runtime, cudnn, cublas, library
//            u32 shape word count, then the words (u64 each)
//            u32 value word count, then the words (u64 each)
//   8      u64 FNV-1a (64-bit) of every byte before it

#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <system_error>
#include <tuple>
#include <utility>
#include <vector>

#include "replica/core/atomic_file.hpp"
#include "replica/core/config.hpp"
#include "replica/core/error.hpp"

namespace REPLICA_NAMESPACE::core {

// What a timed choice was made on. A choice is the fastest of the candidates that the libraries
// offered on this GPU, so it holds only where the GPU and every library that offered or ran them is
// the same.
struct TuningEnvironment {
    std::string device;         // the GPU's kind: model, compute capability, multiprocessors
    std::string driver;         // the driver: its CUDA version, and its release where the system says it
    std::int64_t runtime = 0;   // the CUDA runtime's version
    std::int64_t cudnn = 0;     // cuDNN's version
    std::int64_t cublas = 0;    // cuBLASLt's version
    std::int64_t library = 0;   // replica's (REPLICA_VERSION): the product path's kernels are its own

    friend bool operator<(const TuningEnvironment& a, const TuningEnvironment& b)
    {
        return std::tie(a.device, a.driver, a.runtime, a.cudnn, a.cublas, a.library) <
               std::tie(b.device, b.driver, b.runtime, b.cudnn, b.cublas, b.library);
    }
    friend bool operator==(const TuningEnvironment& a, const TuningEnvironment& b)
    {
        return std::tie(a.device, a.driver, a.runtime, a.cudnn, a.cublas, a.library) ==
               std::tie(b.device, b.driver, b.runtime, b.cudnn, b.cublas, b.library);
    }
};

struct TuningKey {
    std::string kind;   // what was timed, e.g. "convolution", "product"
    TuningEnvironment environment;
    std::vector<std::uint64_t> shape;

    friend bool operator<(const TuningKey& a, const TuningKey& b)
    {
        return std::tie(a.kind, a.environment, a.shape) < std::tie(b.kind, b.environment, b.shape);
    }
    friend bool operator==(const TuningKey& a, const TuningKey& b)
    {
        return a.kind == b.kind && a.environment == b.environment && a.shape == b.shape;
    }
};

using TuningValue = std::vector<std::uint64_t>;
using TuningRecords = std::map<TuningKey, TuningValue>;

// The cache's folder: `configured` where it is not empty, else $REPLICA_CACHE_DIR, else
// $XDG_CACHE_HOME/replica (an absolute path only, as the XDG specification asks), else
// $HOME/.cache/replica; empty where none of them is set.
inline std::filesystem::path tuning_cache_folder(const std::string& configured = {})
{
    if (!configured.empty()) return configured;
    auto variable = [](const char* name) {
        const char* v = std::getenv(name);
        return std::string(v ? v : "");
    };
    if (const std::string dir = variable("REPLICA_CACHE_DIR"); !dir.empty()) return dir;
    if (const std::string xdg = variable("XDG_CACHE_HOME"); !xdg.empty() && std::filesystem::path(xdg).is_absolute())
        return std::filesystem::path(xdg) / "replica";
    if (const std::string home = variable("HOME"); !home.empty()) return std::filesystem::path(home) / ".cache" / "replica";
    return {};
}

namespace detail {

inline constexpr char kTuningMagic[8] = {'R', 'P', 'L', 'T', 'U', 'N', 'E', '\n'};
inline constexpr std::uint32_t kTuningFormat = 1;
// Bounds a reader holds every file to (a writer never comes near them).
inline constexpr std::uint32_t kTuningMostRecords = 1u << 20, kTuningMostWords = 1024, kTuningMostString = 1024;
inline constexpr std::uintmax_t kTuningMostBytes = std::uintmax_t{256} << 20;

inline std::uint64_t fnv1a(std::span<const unsigned char> bytes)
{
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char b : bytes) h = (h ^ b) * 0x100000001b3ull;
    return h;
}

class TuningWriter {
public:
    void u32(std::uint32_t v) { put(v, 4); }
    void u64(std::uint64_t v) { put(v, 8); }
    void string(const std::string& s)
    {
        u32(std::uint32_t(s.size()));
        bytes.insert(bytes.end(), s.begin(), s.end());
    }
    void words(const std::vector<std::uint64_t>& w)
    {
        u32(std::uint32_t(w.size()));
        for (std::uint64_t v : w) u64(v);
    }
    std::vector<unsigned char> bytes;

private:
    void put(std::uint64_t v, int n)
    {
        for (int i = 0; i < n; ++i) bytes.push_back(static_cast<unsigned char>(v >> (8 * i)));
    }
};

// Reads from a span, never past its end: each read says whether the bytes were there.
class TuningReader {
public:
    explicit TuningReader(std::span<const unsigned char> bytes) : bytes_(bytes) {}
    bool u32(std::uint32_t& v)
    {
        std::uint64_t w = 0;
        if (!get(w, 4)) return false;
        v = std::uint32_t(w);
        return true;
    }
    bool u64(std::uint64_t& v) { return get(v, 8); }
    bool i64(std::int64_t& v)
    {
        std::uint64_t w = 0;
        if (!get(w, 8)) return false;
        v = std::bit_cast<std::int64_t>(w);
        return true;
    }
    bool string(std::string& s)
    {
        std::uint32_t n = 0;
        if (!u32(n) || n > kTuningMostString || n > left()) return false;
        s.assign(reinterpret_cast<const char*>(bytes_.data() + at_), n);
        at_ += n;
        return true;
    }
    bool words(std::vector<std::uint64_t>& w)
    {
        std::uint32_t n = 0;
        if (!u32(n) || n > kTuningMostWords || std::size_t(n) * 8 > left()) return false;
        w.resize(n);
        for (std::uint64_t& v : w) u64(v);
        return true;
    }
    std::size_t left() const { return bytes_.size() - at_; }

private:
    bool get(std::uint64_t& v, int n)
    {
        if (left() < std::size_t(n)) return false;
        v = 0;
        for (int i = 0; i < n; ++i) v |= std::uint64_t(bytes_[at_ + std::size_t(i)]) << (8 * i);
        at_ += std::size_t(n);
        return true;
    }
    std::span<const unsigned char> bytes_;
    std::size_t at_ = 0;
};

} // namespace detail

// The bytes of a tuning cache file holding `records` (the format above).
inline std::vector<unsigned char> encode_tuning_records(const TuningRecords& records)
{
    detail::TuningWriter w;
    w.bytes.assign(std::begin(detail::kTuningMagic), std::end(detail::kTuningMagic));
    w.u32(detail::kTuningFormat);
    w.u32(std::uint32_t(records.size()));
    for (const auto& [key, value] : records) {
        const TuningEnvironment& e = key.environment;
        w.string(key.kind);
        w.string(e.device);
        w.string(e.driver);
        for (std::int64_t v : {e.runtime, e.cudnn, e.cublas, e.library}) w.u64(std::bit_cast<std::uint64_t>(v));
        w.words(key.shape);
        w.words(value);
    }
    w.u64(detail::fnv1a(w.bytes));
    return std::move(w.bytes);
}

// The records of a tuning cache file's bytes into `out`: "" if they are a whole file of this format,
// else why not (`out` is then empty).
inline std::string decode_tuning_records(std::span<const unsigned char> bytes, TuningRecords& out)
{
    out.clear();
    constexpr std::size_t header = sizeof detail::kTuningMagic + 8, checksum = 8;
    if (bytes.size() < sizeof detail::kTuningMagic) return "it is cut short (" + std::to_string(bytes.size()) + " bytes)";
    if (std::memcmp(bytes.data(), detail::kTuningMagic, sizeof detail::kTuningMagic) != 0)
        return "it is not a tuning cache (no magic bytes)";
    detail::TuningReader r(bytes.subspan(sizeof detail::kTuningMagic));
    std::uint32_t format = 0, count = 0;
    if (bytes.size() < header + checksum || !r.u32(format) || !r.u32(count))
        return "it is cut short (" + std::to_string(bytes.size()) + " bytes)";
    if (format != detail::kTuningFormat)
        return "its format is version " + std::to_string(format) + ", this library reads version " +
               std::to_string(detail::kTuningFormat);
    const std::size_t body = bytes.size() - checksum;
    std::uint64_t sum = 0;
    detail::TuningReader(bytes.subspan(body)).u64(sum);
    if (sum != detail::fnv1a(bytes.first(body))) return "its checksum does not match (cut short or changed)";
    if (count > detail::kTuningMostRecords) return "it claims " + std::to_string(count) + " records";
    detail::TuningReader records(bytes.subspan(header, body - header));
    TuningRecords read;
    for (std::uint32_t i = 0; i < count; ++i) {
        TuningKey key;
        TuningValue value;
        TuningEnvironment& e = key.environment;
        if (!records.string(key.kind) || !records.string(e.device) || !records.string(e.driver) || !records.i64(e.runtime) ||
            !records.i64(e.cudnn) || !records.i64(e.cublas) || !records.i64(e.library) || !records.words(key.shape) ||
            !records.words(value))
            return "record " + std::to_string(i) + " of " + std::to_string(count) + " runs past the end";
        read[std::move(key)] = std::move(value);
    }
    if (records.left() != 0) return std::to_string(records.left()) + " bytes follow the last record";
    out = std::move(read);
    return "";
}

// One tuning cache file, shared by the threads of a process (a mutex guards it). Its records are
// read at the first find(); record() reads the file again, adds what this object recorded and writes
// it whole. `log` gets at most one line about a file that was ignored and one about a file that could
// not be written, each beginning "replica: tuning cache ".
class TuningCache {
public:
    static constexpr const char* file_name = "tuning.bin";

    explicit TuningCache(const std::filesystem::path& folder) : file_(folder / file_name) {}
    TuningCache(const TuningCache&) = delete;
    TuningCache& operator=(const TuningCache&) = delete;

    const std::filesystem::path& file() const { return file_; }

    // The value recorded under a key equal to `key` in every field, if any.
    std::optional<TuningValue> find(const TuningKey& key, std::ostream& log)
    {
        std::lock_guard lock(mutex_);
        if (!loaded_) {
            read(records_, log);
            loaded_ = true;
        }
        const auto it = records_.find(key);
        if (it == records_.end()) return std::nullopt;
        return it->second;
    }

    // Keeps `value` under `key` and rewrites the file: the records it holds now (those of other
    // processes included), with this object's recorded ones over them.
    void record(const TuningKey& key, const TuningValue& value, std::ostream& log)
    {
        std::lock_guard lock(mutex_);
        mine_[key] = value;
        if (unwritable_) {
            records_[key] = value;
            return;
        }
        TuningRecords now;
        if (!read(now, log)) now = records_;   // nothing there, or a file to replace: what we know
        for (const auto& [k, v] : mine_) now[k] = v;
        records_ = std::move(now);
        loaded_ = true;
        const std::filesystem::path folder = file_.parent_path();
        std::error_code ec;
        std::filesystem::create_directories(folder, ec);
        std::string failure = ec ? "creating the folder " + folder.string() + " failed: " + ec.message() : "";
        if (failure.empty() && records_.size() > detail::kTuningMostRecords)
            failure = "it would hold more than " + std::to_string(detail::kTuningMostRecords) + " records";
        if (failure.empty()) {
            try {
                const std::vector<unsigned char> bytes = encode_tuning_records(records_);
                write_file_atomically(file_, bytes, "writing it failed", "the file there, if any, is unchanged",
                                      {.unique_temporary = true, .sync = false});
            } catch (const Error& e) {
                failure = e.what();
            }
        }
        if (!failure.empty()) {
            unwritable_ = true;
            log << "replica: tuning cache " << file_.string() << " not written (" << failure
                << "): the choices timed from now on are kept for this process only" << std::endl;
        }
    }

private:
    // The file's records into `out`: false where there is no file or it was ignored (one line).
    bool read(TuningRecords& out, std::ostream& log)
    {
        out.clear();
        std::error_code ec;
        const auto status = std::filesystem::status(file_, ec);
        if (!std::filesystem::exists(status)) return false;   // a first run: nothing to say
        std::string why;
        // The size from the open file: a writer may rename a new file over the path meanwhile.
        std::ifstream in(file_, std::ios::binary | std::ios::ate);
        const std::streamoff size = in ? std::streamoff(in.tellg()) : -1;
        if (!std::filesystem::is_regular_file(status)) why = "it is not a regular file";
        else if (!in || size < 0) why = "it cannot be opened: " + std::string(std::strerror(errno));
        else if (std::uintmax_t(size) > detail::kTuningMostBytes) why = "it is larger than 256 MiB";
        else {
            std::vector<unsigned char> bytes(std::size_t(size), 0);
            in.seekg(0);
            if (!in.read(reinterpret_cast<char*>(bytes.data()), size) || in.peek() != std::ifstream::traits_type::eof())
                why = "it cannot be read whole";
            else why = decode_tuning_records(bytes, out);
        }
        if (why.empty()) return true;
        out.clear();
        if (!complained_)
            log << "replica: tuning cache " << file_.string() << " ignored (" << why
                << "): its choices are timed again and the file rewritten" << std::endl;
        complained_ = true;
        return false;
    }

    std::mutex mutex_;
    std::filesystem::path file_;
    TuningRecords records_;   // the file's, as last read, and ours
    TuningRecords mine_;      // recorded by this object
    bool loaded_ = false, complained_ = false, unwritable_ = false;
};

} // namespace replica::core
