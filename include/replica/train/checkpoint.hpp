#pragma once
// Checkpoints: a model's parameters and optimizer state, and where the run stands, in one file.
//
//   save_checkpoint("run/lenet.ckpt", model, {.epoch = 3, .step = 2811, .seed = 1, .history = h});
//   CheckpointState s = load_checkpoint("run/lenet.ckpt", model);
//
// A checkpoint loads on any device count: one saved from DataParallel<M> or AutoParallel<M> loads
// into M and back, since model_signature is that of the replica type M.
//
// File format, every number little-endian:
//   offset  bytes
//   0       8      magic "REPLICA\0"
//   8       4      u32 format version, 1
//   12      8      u64 model signature, model_signature<M>()
//   20      8      u64 param_count P
//   28      8      u64 state_count S, optimizer state floats (0 before the first update)
//   36      8      u64 epoch
//   44      8      u64 step
//   52      8      u64 seed
//   60      8      u64 history count H
//   68      40 H   H records: u64 epoch, f64 train_loss, f64 validation_loss, f64 validation_accuracy,
//                  f64 seconds
//           4 P    f32 parameters
//           4 S    f32 optimizer state
//           4      u32 CRC-32 (zlib's crc32) of every byte before it
//
// save_checkpoint is atomic: it writes <path>.tmp beside <path>, fsyncs it, renames it over <path> and
// fsyncs the directory, creating missing parent directories first. On failure it removes the temporary
// file and throws Error; a checkpoint already at <path> is untouched.
// load_checkpoint checks the whole file (size, magic, version, checksum, model) before it touches the
// model; on failure it throws Error naming the file and the model is left as it was.

#include <zlib.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "replica/core/error.hpp"
#include "replica/train/history.hpp"

namespace replica::train {

// What a checkpoint holds besides the model.
struct CheckpointState {
    std::uint64_t epoch = 0;            // epochs completed
    std::uint64_t step = 0;             // optimizer steps taken
    std::uint64_t seed = 0;             // the run's seed (shuffling and dropout are keyed on it)
    std::vector<EpochRecord> history = {};   // "= {}": {.epoch = 3} stays warning-free under -Wextra
};

namespace detail {

// The model type a checkpoint describes: M::replica_type for DataParallel and AutoParallel, else M.
template <class M>
struct replica_of {
    using type = M;
};
template <class M>
    requires requires { typename M::replica_type; }
struct replica_of<M> {
    using type = typename M::replica_type;
};

} // namespace detail

// A model that can be saved and loaded: a Sequential<Input<...>, ...>, or a DataParallel or
// AutoParallel of one. Its parameter layout is replica_of<M>::type::chain.
template <class M>
concept Checkpointable = requires(M& m, const M& cm, std::span<const float> values) {
    { M::param_count } -> std::convertible_to<std::size_t>;
    { detail::replica_of<M>::type::chain::layer_count } -> std::convertible_to<std::uint64_t>;
    { detail::replica_of<M>::type::chain::param_offset.size() } -> std::convertible_to<std::size_t>;
    { cm.parameters() } -> std::same_as<std::vector<float>>;
    { cm.optimizer_state() } -> std::same_as<std::vector<float>>;
    m.set_parameters(values);
    m.set_optimizer_state(values);
};

// FNV-1a 64 over the little-endian u64 bytes of: param_count, the chain's layer_count, and every
// entry of its param_offset. The same for M, DataParallel<M> and AutoParallel<M>, on every compiler.
template <class M>
constexpr std::uint64_t model_signature()
{
    static_assert(Checkpointable<M>, "model_signature<M>: M must be a model, a Sequential<Input<...>, ...>, or a "
                                     "DataParallel or AutoParallel of one");
    using chain = typename detail::replica_of<M>::type::chain;
    std::uint64_t h = 0xcbf29ce484222325ull;
    auto mix = [&h](std::uint64_t v) {
        for (int i = 0; i < 8; ++i) {
            h ^= (v >> (8 * i)) & 0xffu;
            h *= 0x100000001b3ull;
        }
    };
    mix(std::uint64_t(M::param_count));
    mix(std::uint64_t(chain::layer_count));
    for (std::size_t offset : chain::param_offset) mix(std::uint64_t(offset));
    // Shapes too: the input, the output and every layer's output size.
    for (std::size_t d : chain::input_shape::dims) mix(std::uint64_t(d));
    for (std::size_t d : chain::output_shape::dims) mix(std::uint64_t(d));
    for (std::size_t offset : chain::act_offset) mix(std::uint64_t(offset));
    return h;
}

namespace detail {

inline constexpr unsigned char checkpoint_magic[8] = {'R', 'E', 'P', 'L', 'I', 'C', 'A', '\0'};
inline constexpr std::uint32_t checkpoint_version = 1;
inline constexpr std::size_t checkpoint_header_size = 68;   // up to and including the history count
inline constexpr std::size_t checkpoint_record_size = 40;

class ByteWriter {
public:
    void reserve(std::size_t n) { bytes_.reserve(n); }
    void raw(const unsigned char* p, std::size_t n) { bytes_.insert(bytes_.end(), p, p + n); }
    void u32(std::uint32_t v)
    {
        for (int i = 0; i < 4; ++i) bytes_.push_back(static_cast<unsigned char>(v >> (8 * i)));
    }
    void u64(std::uint64_t v)
    {
        for (int i = 0; i < 8; ++i) bytes_.push_back(static_cast<unsigned char>(v >> (8 * i)));
    }
    void f64(double v) { u64(std::bit_cast<std::uint64_t>(v)); }
    void f32s(std::span<const float> values)
    {
        for (float v : values) u32(std::bit_cast<std::uint32_t>(v));
    }
    const std::vector<unsigned char>& bytes() const { return bytes_; }

private:
    std::vector<unsigned char> bytes_;
};

inline std::uint32_t read_u32(const unsigned char* p)
{
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= std::uint32_t(p[i]) << (8 * i);
    return v;
}
inline std::uint64_t read_u64(const unsigned char* p)
{
    std::uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= std::uint64_t(p[i]) << (8 * i);
    return v;
}
inline std::vector<float> read_f32s(const unsigned char* p, std::size_t count)
{
    std::vector<float> out(count);
    for (std::size_t i = 0; i < count; ++i) out[i] = std::bit_cast<float>(read_u32(p + 4 * i));
    return out;
}

// zlib's crc32 over any length (its own length argument is 32 bits).
inline std::uint32_t crc32_of(const unsigned char* p, std::size_t n)
{
    uLong crc = crc32(0L, Z_NULL, 0);
    while (n > 0) {
        const uInt chunk = uInt(std::min<std::size_t>(n, std::size_t{1} << 30));
        crc = crc32(crc, p, chunk);
        p += chunk;
        n -= chunk;
    }
    return std::uint32_t(crc);
}

inline std::string hex64(std::uint64_t v)
{
    char text[24];
    std::snprintf(text, sizeof text, "0x%016llx", static_cast<unsigned long long>(v));
    return text;
}

// Writes `bytes` to `path` atomically (see the file comment). Throws Error naming the path and the OS error.
inline void write_file_atomically(const std::filesystem::path& path, std::span<const unsigned char> bytes)
{
    namespace fs = std::filesystem;
    const std::string name = path.string();
    const std::string advice = ": check that the directory is writable and has free space";
    const fs::path parent = path.parent_path();
    if (!parent.empty()) {
        std::error_code ec;
        fs::create_directories(parent, ec);
        if (ec)
            throw Error("cannot write checkpoint " + name + ": creating its directory " + parent.string() +
                        " failed: " + ec.message() + advice);
    }

    fs::path tmp = path;
    tmp += ".tmp";
    std::FILE* file = std::fopen(tmp.c_str(), "wb");
    if (!file)
        throw Error("cannot write checkpoint " + name + ": creating " + tmp.string() + " failed: " +
                    std::strerror(errno) + "; the previous checkpoint, if any, is unchanged" + advice);
    // Takes errno first: closing and removing may change it.
    auto fail = [&](const std::string& step) {
        const int err = errno;
        if (file) std::fclose(file);
        std::error_code ignored;
        fs::remove(tmp, ignored);
        throw Error("cannot write checkpoint " + name + ": " + step + " failed: " + std::strerror(err) +
                    "; the previous checkpoint, if any, is unchanged" + advice);
    };
    errno = 0;
    if (std::fwrite(bytes.data(), 1, bytes.size(), file) != bytes.size()) fail("writing " + tmp.string());
    if (std::fflush(file) != 0) fail("flushing " + tmp.string());
    if (::fsync(::fileno(file)) != 0) fail("syncing " + tmp.string());
    const int closed = std::fclose(file);
    file = nullptr;
    if (closed != 0) fail("closing " + tmp.string());
    if (std::rename(tmp.c_str(), path.c_str()) != 0) fail("renaming " + tmp.string() + " to " + name);

    const fs::path dir = parent.empty() ? fs::path(".") : parent;
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
    if (fd < 0 || ::fsync(fd) != 0) {
        const int err = errno;
        if (fd >= 0) ::close(fd);
        throw Error("checkpoint " + name + " was written, but syncing its directory " + dir.string() +
                    " failed: " + std::strerror(err) + "; it may not survive a power loss" + advice);
    }
    ::close(fd);
}

// The whole file. Throws Error when it is missing or cannot be read.
inline std::vector<unsigned char> read_file(const std::filesystem::path& path)
{
    const std::string name = path.string();
    std::FILE* file = std::fopen(path.c_str(), "rb");
    if (!file) {
        if (errno == ENOENT) throw Error("checkpoint " + name + " not found: check the path");
        throw Error("cannot read checkpoint " + name + ": " + std::strerror(errno));
    }
    std::vector<unsigned char> out;
    unsigned char chunk[1 << 16];
    for (;;) {
        const std::size_t got = std::fread(chunk, 1, sizeof chunk, file);
        out.insert(out.end(), chunk, chunk + got);
        if (got < sizeof chunk) break;
    }
    const int err = errno;
    const bool failed = std::ferror(file) != 0;
    std::fclose(file);
    if (failed) throw Error("cannot read checkpoint " + name + ": " + std::strerror(err));
    return out;
}

struct CheckpointContents {
    CheckpointState state;
    std::vector<float> parameters;
    std::vector<float> optimizer_state;
};

// Checks a checkpoint file's bytes, in the order a reader would want to hear about problems, and
// decodes them. Throws Error naming the file.
inline CheckpointContents parse_checkpoint(const std::string& name, std::span<const unsigned char> b,
                                           std::uint64_t signature, std::uint64_t param_count)
{
    const std::size_t size = b.size();
    auto truncated = [&](const std::string& expected) {
        return Error("checkpoint " + name + " is truncated (" + std::to_string(size) + " bytes, expected " + expected +
                     "): the write was interrupted; use an earlier checkpoint");
    };
    if (size == 0) throw truncated("at least " + std::to_string(checkpoint_header_size));
    if (std::memcmp(b.data(), checkpoint_magic, std::min(size, sizeof checkpoint_magic)) != 0)
        throw Error(name + " is not a replica checkpoint (it does not start with \"REPLICA\"): check the path");
    if (size < 12) throw truncated("at least " + std::to_string(checkpoint_header_size));
    const std::uint32_t version = read_u32(b.data() + 8);
    if (version != checkpoint_version)
        throw Error("checkpoint " + name + " has format version " + std::to_string(version) +
                    "; this build of replica reads version " + std::to_string(checkpoint_version) +
                    ": load it with the replica that wrote it");
    if (size < checkpoint_header_size) throw truncated("at least " + std::to_string(checkpoint_header_size));

    const std::uint64_t file_signature = read_u64(b.data() + 12);
    const std::uint64_t file_params = read_u64(b.data() + 20);
    const std::uint64_t file_states = read_u64(b.data() + 28);
    const std::uint64_t records = read_u64(b.data() + 60);

    // header + 40 H + 4 (P + S) + 4, unless it overflows (only a damaged header claims that much).
    constexpr std::uint64_t max = std::numeric_limits<std::uint64_t>::max();
    std::uint64_t expected = checkpoint_header_size + 4;
    bool fits = records <= (max - expected) / checkpoint_record_size;
    if (fits) expected += records * checkpoint_record_size;
    fits = fits && file_params <= (max - expected) / 4;
    if (fits) expected += file_params * 4;
    fits = fits && file_states <= (max - expected) / 4;
    if (fits) expected += file_states * 4;
    if (!fits)
        throw Error("checkpoint " + name + " is corrupt (its header claims more data than a file can hold): "
                    "use an earlier checkpoint");
    if (size < expected) throw truncated(std::to_string(expected));
    if (size > expected)
        throw Error("checkpoint " + name + " is corrupt (" + std::to_string(size) + " bytes, expected " +
                    std::to_string(expected) + "): use an earlier checkpoint");

    if (crc32_of(b.data(), size - 4) != read_u32(b.data() + size - 4))
        throw Error("checkpoint " + name + " is corrupt (checksum mismatch): the file was damaged after it was "
                    "written; use an earlier checkpoint");

    if (file_signature != signature || file_params != param_count)
        throw Error("checkpoint " + name + " was saved from a different model (" + std::to_string(file_params) +
                    " parameters, signature " + hex64(file_signature) + "); this model has " +
                    std::to_string(param_count) + " parameters, signature " + hex64(signature) +
                    ": load it into the model that saved it");
    if (param_count != 0 && file_states % param_count != 0)
        throw Error("checkpoint " + name + " holds " + std::to_string(file_states) + " optimizer values, not a whole "
                    "number per parameter: it was not written by replica; use an earlier checkpoint");

    CheckpointContents out;
    out.state.epoch = read_u64(b.data() + 36);
    out.state.step = read_u64(b.data() + 44);
    out.state.seed = read_u64(b.data() + 52);
    const unsigned char* p = b.data() + checkpoint_header_size;
    out.state.history.resize(std::size_t(records));
    for (auto& r : out.state.history) {
        r.epoch = read_u64(p);
        r.train_loss = std::bit_cast<double>(read_u64(p + 8));
        r.validation_loss = std::bit_cast<double>(read_u64(p + 16));
        r.validation_accuracy = std::bit_cast<double>(read_u64(p + 24));
        r.seconds = std::bit_cast<double>(read_u64(p + 32));
        p += checkpoint_record_size;
    }
    out.parameters = read_f32s(p, std::size_t(file_params));
    p += 4 * file_params;
    out.optimizer_state = read_f32s(p, std::size_t(file_states));
    return out;
}

} // namespace detail

// Writes model's parameters and optimizer state, and `state`, to `path` atomically. Throws Error
// naming the path and the OS error when any step fails; a checkpoint already at `path` is then untouched.
template <class M>
void save_checkpoint(const std::filesystem::path& path, const M& model, const CheckpointState& state)
{
    static_assert(Checkpointable<M>, "save_checkpoint: the model must be a Sequential<Input<...>, ...>, or a "
                                     "DataParallel or AutoParallel of one");
    const std::vector<float> w = model.parameters();
    const std::vector<float> s = model.optimizer_state();
    detail::ByteWriter out;
    out.reserve(detail::checkpoint_header_size + detail::checkpoint_record_size * state.history.size() +
                4 * (w.size() + s.size()) + 4);
    out.raw(detail::checkpoint_magic, sizeof detail::checkpoint_magic);
    out.u32(detail::checkpoint_version);
    out.u64(model_signature<M>());
    out.u64(w.size());
    out.u64(s.size());
    out.u64(state.epoch);
    out.u64(state.step);
    out.u64(state.seed);
    out.u64(state.history.size());
    for (const auto& r : state.history) {
        out.u64(r.epoch);
        out.f64(r.train_loss);
        out.f64(r.validation_loss);
        out.f64(r.validation_accuracy);
        out.f64(r.seconds);
    }
    out.f32s(w);
    out.f32s(s);
    out.u32(detail::crc32_of(out.bytes().data(), out.bytes().size()));
    detail::write_file_atomically(path, out.bytes());
}

// Loads the checkpoint at `path` into model (parameters, and optimizer state when the file has any)
// and returns the rest. Throws Error naming the file when it is missing, truncated, not a checkpoint,
// of another format version, corrupt, or saved from a model of another structure; the model is then
// untouched.
template <class M>
CheckpointState load_checkpoint(const std::filesystem::path& path, M& model)
{
    static_assert(Checkpointable<M>, "load_checkpoint: the model must be a Sequential<Input<...>, ...>, or a "
                                     "DataParallel or AutoParallel of one");
    const std::vector<unsigned char> bytes = detail::read_file(path);
    auto contents = detail::parse_checkpoint(path.string(), bytes, model_signature<M>(), M::param_count);
    model.set_parameters(contents.parameters);
    model.set_optimizer_state(contents.optimizer_state);   // none saved: the run restarts its momentum
    return std::move(contents.state);
}

} // namespace replica::train

namespace replica {
using train::CheckpointState;
using train::load_checkpoint;
using train::model_signature;
using train::save_checkpoint;
} // namespace replica
