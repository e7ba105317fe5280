#pragma once
// Checkpoints: a model's parameters and optimizer state, and where the run stands, in one file.
//
//   save_checkpoint("run/lenet.ckpt", model, {.epoch = 3, .step = 2811, .seed = 1, .history = h}, opt);
//   CheckpointState s = load_checkpoint("run/lenet.ckpt", model, opt);
// Given the optimizer, the file names it (SGD, Adam, AdamW) and holds its step count (Adam's t);
// loading it into another optimizer is refused. Without it the file names no optimizer, and any
// optimizer that keeps as many values per parameter may load it. A LossScale's state (its scale and
// counts, train/loss_scale.hpp) is kept too; a file without it loads into a LossScale as a new run's.
//
// A checkpoint loads on any device count: one saved from DataParallel<M> or AutoParallel<M> loads
// into M and back, since model_signature is that of the replica type M.
//
// File format, every number little-endian:
//   offset  bytes
//   0       8      magic "REPLICA\0"
//   8       4      u32 format version: 3 with loss scaling's state, else 2 (versions 1 and 2 load)
//   12      8      u64 model signature, model_signature<M>()
//   20      8      u64 param_count P
//   28      8      u64 state_count S, optimizer state floats (0 before the first update): state_per_param
//                  for each trainable parameter (model/param_rules.hpp)
//   36      8      u64 epoch
//   44      8      u64 step
//   52      8      u64 seed
//   60      8      u64 history count H
//   68      4      u32 optimizer id: 0 none named, 1 SGD, 2 Adam, 3 AdamW
//   72      8      u64 optimizer step count (the updates Adam and AdamW counted; 0 for SGD)
//   80      8      u64 statistics count T: the model's statistics (BatchNorm's running means and
//                  variances), 0 for a model without them
//   88      20     version 3 only: f32 loss scale, u64 clean steps, u64 skipped steps (LossScaleState)
//   88|108  40 H   H records: u64 epoch, f64 train_loss, f64 validation_loss, f64 validation_accuracy,
//                  f64 seconds
//           4 P    f32 parameters
//           4 S    f32 optimizer state
//           4 T    f32 statistics
//           4      u32 CRC-32 (zlib's crc32) of every byte before it
// Version 1 ends its header at offset 68 (no optimizer id or step count, no statistics); version 2
// at 88, version 3 at 108.
//
// save_checkpoint is atomic: it writes <path>.tmp beside <path>, fsyncs it, renames it over <path> and
// fsyncs the directory, creating missing parent directories first. On failure it removes the temporary
// file and throws Error; a checkpoint already at <path> is untouched.
// save_checkpoint refuses (Error) parameters or optimizer state holding NaN or infinity.
// load_checkpoint reads the header first and then never more bytes than the header and the model allow
// (a pipe or /dev/zero fails at once); it checks the whole file (size, magic, version, checksum, model)
// and then that every field makes sense (finite values, history consistent with the epoch, and with
// CheckpointExpectations the run's epochs, steps and optimizer) before it touches the model; on
// failure it throws Error naming the file and the model is left as it was.

#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cerrno>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "replica/core/atomic_file.hpp"
#include "replica/core/config.hpp"
#include "replica/core/error.hpp"
#include "replica/model/concepts.hpp"
#include "replica/model/param_layout.hpp"
#include "replica/train/history.hpp"
#include "replica/train/loss_scale.hpp"

namespace REPLICA_NAMESPACE::train {

// What a checkpoint holds besides the model.
struct CheckpointState {
    std::uint64_t epoch = 0;            // epochs completed
    std::uint64_t step = 0;             // optimizer steps taken
    std::uint64_t seed = 0;             // the run's seed (shuffling and dropout are keyed on it)
    std::vector<EpochRecord> history = {};   // "= {}": {.epoch = 3} stays warning-free under -Wextra
    std::uint32_t optimizer = 0;        // the optimizer's checkpoint_id (SGD 1, Adam 2, AdamW 3); 0: none named
    std::uint64_t optimizer_steps = 0;  // the updates the optimizer counted (Adam's t)
    std::optional<LossScaleState> loss_scale = {};   // a LossScale's; none: the file is version 2
};

// What the loading run allows, checked after the checksum (defaults: only the checks every file passes).
struct CheckpointExpectations {
    std::uint64_t max_epoch = std::numeric_limits<std::uint64_t>::max();   // the run's epochs
    std::uint64_t steps_per_epoch = 0;     // 0: not checked; else step must be epoch x steps_per_epoch
    std::size_t state_per_param = 0;       // 0: not checked; else the file holds 0 or this many floats per parameter
    std::uint32_t optimizer = 0;           // 0: not checked; else this run's optimizer id: a file naming another is refused
};

// The model's statistics (BatchNorm's running means and variances): state that is not trained, not
// touched by the optimizer, and saved in checkpoints. A model without them has none.
template <class M>
concept HasStatistics = requires(M& m, const M& cm, std::span<const float> values) {
    { M::statistics_count } -> std::convertible_to<std::size_t>;
    { cm.statistics() } -> std::same_as<std::vector<float>>;
    m.set_statistics(values);
};
template <class M>
constexpr std::size_t statistics_count_of()
{
    if constexpr (HasStatistics<M>) return M::statistics_count;
    else return 0;
}

// The name of an optimizer id in a checkpoint, for messages.
inline std::string optimizer_name(std::uint32_t id)
{
    switch (id) {
    case 0: return "none named";
    case 1: return "SGD";
    case 2: return "Adam";
    case 3: return "AdamW";
    }
    return "unknown optimizer id " + std::to_string(id);
}

// A model that can be saved and loaded: a Sequential<Input<...>, ...>, or a DataParallel or
// AutoParallel of one. Its parameter layout is replica_of<M>::type::chain.
template <class M>
concept Checkpointable = requires(M& m, const M& cm, std::span<const float> values) {
    { M::param_count } -> std::convertible_to<std::size_t>;
    { model::replica_of<M>::type::chain::layer_count } -> std::convertible_to<std::uint64_t>;
    { model::replica_of<M>::type::chain::param_offset.size() } -> std::convertible_to<std::size_t>;
    { cm.parameters() } -> std::same_as<std::vector<float>>;
    { cm.optimizer_state() } -> std::same_as<std::vector<float>>;
    m.set_parameters(values);
    m.set_optimizer_state(values);
};

// FNV-1a 64 over the little-endian u64 bytes of: param_count, the chain's layer_count, every entry
// of its param_offset, its shapes, (models with BatchNorm) its statistics layout, its layers' options
// signature where one is not the default (layers/op.hpp), and its ParamRule's plan where the rule is
// not DecayWeights (model/param_layout.hpp). The same for M, DataParallel<M> and
// AutoParallel<M>, on every compiler.
template <class M>
constexpr std::uint64_t model_signature()
{
    static_assert(Checkpointable<M>, "model_signature<M>: M must be a model, a Sequential<Input<...>, ...>, or a "
                                     "DataParallel or AutoParallel of one");
    using chain = typename model::replica_of<M>::type::chain;
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
    // Token ids in: a model of (T) ids and one of (T) floats differ; nothing for float models.
    if constexpr (model::replica_of<M>::type::reads_tokens) mix(0x746f6b656e73ull);
    for (std::size_t d : chain::output_shape::dims) mix(std::uint64_t(d));
    for (std::size_t offset : chain::act_offset) mix(std::uint64_t(offset));
    // Statistics (BatchNorm's) and where each layer's begin; nothing for models without, so that their
    // signatures stay what they were.
    if constexpr (chain::statistics_count > 0) {
        mix(std::uint64_t(chain::statistics_count));
        for (std::size_t offset : chain::statistics_offset) mix(std::uint64_t(offset));
    }
    // Layers' options that the layout does not show (BatchNorm's eps and momentum); nothing where every
    // layer has its defaults.
    if constexpr (model::options_signature_of<chain> != 0) mix(model::options_signature_of<chain>);
    // How the optimizer treats each parameter (the ParamRule's plan: which are frozen and so hold no
    // state, each one's decay and rate); nothing under the default rule, DecayWeights.
    using plan = typename model::replica_of<M>::type::update_plan;
    if constexpr (plan::signature != model::UpdatePlan<chain, model::DecayWeights, 0>::signature) mix(plan::signature);
    return h;
}

namespace detail {

inline constexpr unsigned char checkpoint_magic[8] = {'R', 'E', 'P', 'L', 'I', 'C', 'A', '\0'};
inline constexpr std::uint32_t checkpoint_version = 3;         // the newest this build reads
inline constexpr std::uint32_t checkpoint_version_unscaled = 2;   // written when there is no loss scaling state
inline constexpr std::size_t checkpoint_header_size = 108;     // version 3: up to the loss scaling state
inline constexpr std::size_t checkpoint_v2_header_size = 88;   // version 2: up to the statistics count
inline constexpr std::size_t checkpoint_v1_header_size = 68;   // version 1: up to the history count
inline constexpr std::size_t checkpoint_record_size = 40;
// Bounds a reader trusts a header with: more is a damaged header, never a real checkpoint.
inline constexpr std::uint64_t checkpoint_max_records = std::uint64_t{1} << 20;   // one per epoch
inline constexpr std::uint64_t checkpoint_max_state_per_param = 16;             // SGD keeps 1, Adam 2
inline constexpr std::uint32_t checkpoint_max_optimizer = 3;                     // AdamW
// The optimizer state values per parameter of each optimizer id (0: not named, not checked).
inline constexpr std::size_t checkpoint_state_per_param[] = {0, 1, 2, 2};

inline std::size_t header_size_of(std::uint32_t version)
{
    return version == 1 ? checkpoint_v1_header_size : version == 2 ? checkpoint_v2_header_size : checkpoint_header_size;
}

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

// Writes `bytes` to `path` atomically (core/atomic_file.hpp), creating missing parent directories
// first. Throws Error naming the path and the OS error.
inline void write_file_atomically(const std::filesystem::path& path, std::span<const unsigned char> bytes)
{
    const std::string name = path.string();
    const std::filesystem::path parent = path.parent_path();
    if (!parent.empty()) {
        std::error_code ec;
        std::filesystem::create_directories(parent, ec);
        if (ec)
            throw Error("cannot write checkpoint " + name + ": creating its directory " + parent.string() +
                        " failed: " + ec.message() + ": check that the directory is writable and has free space");
    }
    core::write_file_atomically(path, bytes, "cannot write checkpoint " + name,
                                "the previous checkpoint, if any, is unchanged");
}

// Opens a checkpoint for reading. Throws Error when it is missing or cannot be opened.
class CheckpointFile {
public:
    explicit CheckpointFile(const std::filesystem::path& path) : name_(path.string()), file_(std::fopen(path.c_str(), "rb"))
    {
        if (!file_) {
            if (errno == ENOENT) throw Error("checkpoint " + name_ + " not found: check the path");
            throw Error("cannot read checkpoint " + name_ + ": " + std::strerror(errno));
        }
    }
    ~CheckpointFile() { std::fclose(file_); }
    CheckpointFile(const CheckpointFile&) = delete;
    CheckpointFile& operator=(const CheckpointFile&) = delete;

    // Appends up to n more bytes to out; fewer only at the end of the file. Throws Error on a read error.
    void read(std::vector<unsigned char>& out, std::size_t n)
    {
        unsigned char chunk[1 << 16];
        while (n > 0) {
            const std::size_t want = std::min(n, sizeof chunk);
            const std::size_t got = std::fread(chunk, 1, want, file_);
            out.insert(out.end(), chunk, chunk + got);
            n -= got;
            if (got < want) break;
        }
        if (std::ferror(file_)) throw Error("cannot read checkpoint " + name_ + ": " + std::strerror(errno));
    }

private:
    std::string name_;
    std::FILE* file_;
};

// The size a checkpoint has, from its first bytes (the header, or less when the file is shorter).
// Throws Error when the header is short, not a checkpoint's, of another version, of another
// parameter count, or claims more data than the bounds above.
inline std::uint64_t checkpoint_size_from_header(const std::string& name, std::span<const unsigned char> b,
                                                 std::uint64_t param_count, std::uint64_t statistics_count)
{
    const std::size_t size = b.size();
    std::size_t header = checkpoint_header_size;
    auto truncated = [&] {
        return Error("checkpoint " + name + " is truncated (" + std::to_string(size) + " bytes, expected at least " +
                     std::to_string(header) + "): the write was interrupted; use an earlier checkpoint");
    };
    if (size == 0) throw truncated();
    if (std::memcmp(b.data(), checkpoint_magic, std::min(size, sizeof checkpoint_magic)) != 0)
        throw Error(name + " is not a replica checkpoint (it does not start with \"REPLICA\"): check the path");
    if (size < 12) throw truncated();
    const std::uint32_t version = read_u32(b.data() + 8);
    if (version < 1 || version > checkpoint_version)
        throw Error("checkpoint " + name + " has format version " + std::to_string(version) +
                    "; this build of replica reads versions 1 to " + std::to_string(checkpoint_version) +
                    ": load it with the replica that wrote it");
    header = header_size_of(version);
    if (size < header) throw truncated();

    const std::uint64_t file_params = read_u64(b.data() + 20);
    const std::uint64_t file_states = read_u64(b.data() + 28);
    const std::uint64_t records = read_u64(b.data() + 60);
    if (file_params != param_count)
        throw Error("checkpoint " + name + " was saved from a different model (" + std::to_string(file_params) +
                    " parameters); this model has " + std::to_string(param_count) +
                    " parameters: load it into the model that saved it");
    // (Whether the state fits the trainable parameters depends on the rule, which the signature names:
    // checked after it.)
    if (records > checkpoint_max_records || file_states > checkpoint_max_state_per_param * param_count)
        throw Error("checkpoint " + name + " is corrupt (its header claims " + std::to_string(records) +
                    " history records and " + std::to_string(file_states) + " optimizer values for " +
                    std::to_string(param_count) + " parameters): use an earlier checkpoint");
    const std::uint64_t file_statistics = version == 1 ? 0 : read_u64(b.data() + 80);
    if (file_statistics != statistics_count)
        throw Error("checkpoint " + name + " holds " + std::to_string(file_statistics) +
                    " statistics values (BatchNorm's running means and variances); this model has " +
                    std::to_string(statistics_count) + ": load it into the model that saved it");
    return header + checkpoint_record_size * records + 4 * (file_params + file_states + file_statistics) + 4;
}

// The checkpoint's bytes: the header, then at most what the header says follows, plus one byte to
// tell a longer file. Throws Error as checkpoint_size_from_header does, or when the file cannot be read.
inline std::vector<unsigned char> read_checkpoint_bytes(const std::filesystem::path& path, std::uint64_t param_count,
                                                        std::uint64_t statistics_count)
{
    CheckpointFile file(path);
    std::vector<unsigned char> out;
    file.read(out, checkpoint_header_size);   // a version 1 or 2 file has a shorter header
    const std::uint64_t size = checkpoint_size_from_header(path.string(), out, param_count, statistics_count);
    if (size >= out.size()) file.read(out, std::size_t(size - out.size() + 1));
    return out;
}

inline bool all_finite(std::span<const float> values, std::size_t& first_bad)
{
    for (std::size_t i = 0; i < values.size(); ++i)
        if (!std::isfinite(values[i])) {
            first_bad = i;
            return false;
        }
    return true;
}

struct CheckpointContents {
    CheckpointState state;
    std::vector<float> parameters;
    std::vector<float> optimizer_state;
    std::vector<float> statistics;
};

// Checks a checkpoint file's bytes, in the order a reader would want to hear about problems, and
// decodes them. Throws Error naming the file.
// A checkpoint whose checksum is right but whose content makes no sense was not written by replica
// (or was forged): every field is checked. Throws Error naming the file and the field.
inline void check_sense(const std::string& name, const CheckpointContents& c, std::uint64_t trainable_count,
                        const CheckpointExpectations& expect)
{
    const std::string refused = "checkpoint " + name + " has a valid checksum but ";
    const std::string advice = ": it was not written by this run's replica; use an earlier checkpoint";
    const CheckpointState& s = c.state;
    std::size_t bad = 0;
    if (!all_finite(c.parameters, bad))
        throw Error(refused + "parameter " + std::to_string(bad) + " is " + std::to_string(c.parameters[bad]) + advice);
    if (!all_finite(c.optimizer_state, bad))
        throw Error(refused + "optimizer value " + std::to_string(bad) + " is " +
                    std::to_string(c.optimizer_state[bad]) + advice);
    if (!all_finite(c.statistics, bad))
        throw Error(refused + "statistics value " + std::to_string(bad) + " is " + std::to_string(c.statistics[bad]) +
                    advice);
    if (s.loss_scale && !(std::isfinite(s.loss_scale->scale) && s.loss_scale->scale > 0.0f))
        throw Error(refused + "its loss scale is " + std::to_string(s.loss_scale->scale) + " (it must be finite and > 0)" +
                    advice);
    if (s.history.size() > s.epoch)
        throw Error(refused + "holds " + std::to_string(s.history.size()) + " history records after " +
                    std::to_string(s.epoch) + " epochs (at most one per epoch)" + advice);
    std::uint64_t previous = 0;
    for (const EpochRecord& r : s.history) {
        const bool measured_ok = [](double v) { return std::isfinite(v) || std::isnan(v); }(r.validation_loss) &&
                                 (std::isnan(r.validation_accuracy) ||
                                  (r.validation_accuracy >= 0.0 && r.validation_accuracy <= 1.0));
        if (r.epoch <= previous || r.epoch > s.epoch || !std::isfinite(r.train_loss) || !measured_ok ||
            !std::isfinite(r.seconds) || r.seconds < 0.0)
            throw Error(refused + "its history record for epoch " + std::to_string(r.epoch) +
                        " makes no sense (epochs must rise from 1 to " + std::to_string(s.epoch) +
                        ", losses and times be finite, accuracy in [0, 1])" + advice);
        previous = r.epoch;
    }
    if (s.epoch > expect.max_epoch)
        throw Error("checkpoint " + name + " was saved after epoch " + std::to_string(s.epoch) + ", but this run has " +
                    std::to_string(expect.max_epoch) + " epochs: pass more epochs (--epochs) to train on from it, "
                    "or start a new run without --resume");
    if (expect.steps_per_epoch != 0 &&
        (s.epoch > std::numeric_limits<std::uint64_t>::max() / expect.steps_per_epoch ||
         s.step != s.epoch * expect.steps_per_epoch))
        throw Error("checkpoint " + name + " holds step " + std::to_string(s.step) + " after epoch " +
                    std::to_string(s.epoch) + ", but this run takes " + std::to_string(expect.steps_per_epoch) +
                    " steps per epoch: resume with the batch size, devices and data set that saved it");
    if (expect.optimizer != 0 && s.optimizer != 0 && s.optimizer != expect.optimizer)
        throw Error("checkpoint " + name + " holds the state of the optimizer " + optimizer_name(s.optimizer) +
                    ", but this run's optimizer is " + optimizer_name(expect.optimizer) + ": resume with " +
                    optimizer_name(s.optimizer) + ", or start a new run without --resume");
    if (expect.state_per_param != 0 && !c.optimizer_state.empty() &&
        c.optimizer_state.size() != expect.state_per_param * trainable_count)
        throw Error("checkpoint " + name + " holds " + std::to_string(c.optimizer_state.size()) +
                    " optimizer values, but this optimizer keeps " + std::to_string(expect.state_per_param) +
                    " per trainable parameter (" + std::to_string(expect.state_per_param * trainable_count) +
                    "): resume with the optimizer that saved it");
    if (s.optimizer > checkpoint_max_optimizer)
        throw Error(refused + "names optimizer id " + std::to_string(s.optimizer) + ", which this replica does not know" +
                    advice);
    const std::size_t per = checkpoint_state_per_param[s.optimizer];
    if (per != 0 && !c.optimizer_state.empty() && c.optimizer_state.size() != per * trainable_count)
        throw Error(refused + "holds " + std::to_string(c.optimizer_state.size()) + " values of " +
                    optimizer_name(s.optimizer) + "'s state, which keeps " + std::to_string(per) + " per trainable parameter" +
                    advice);
}

inline CheckpointContents parse_checkpoint(const std::string& name, std::span<const unsigned char> b,
                                           std::uint64_t signature, std::uint64_t param_count,
                                           std::uint64_t statistics_count, std::uint64_t trainable_count,
                                           const CheckpointExpectations& expect = {})
{
    const std::size_t size = b.size();
    const std::uint64_t expected = checkpoint_size_from_header(name, b.first(std::min(size, checkpoint_header_size)),
                                                               param_count, statistics_count);
    const std::uint32_t version = read_u32(b.data() + 8);
    const std::uint64_t file_signature = read_u64(b.data() + 12);
    const std::uint64_t file_params = read_u64(b.data() + 20);
    const std::uint64_t file_states = read_u64(b.data() + 28);
    const std::uint64_t records = read_u64(b.data() + 60);
    if (size < expected)
        throw Error("checkpoint " + name + " is truncated (" + std::to_string(size) + " bytes, expected " +
                    std::to_string(expected) + "): the write was interrupted; use an earlier checkpoint");
    if (size > expected)
        throw Error("checkpoint " + name + " is corrupt (more than the " + std::to_string(expected) +
                    " bytes its header promises): use an earlier checkpoint");

    if (crc32_of(b.data(), size - 4) != read_u32(b.data() + size - 4))
        throw Error("checkpoint " + name + " is corrupt (checksum mismatch): the file was damaged after it was "
                    "written; use an earlier checkpoint");

    if (file_signature != signature)
        throw Error("checkpoint " + name + " was saved from a different model (" + std::to_string(file_params) +
                    " parameters, signature " + hex64(file_signature) + "); this model has " +
                    std::to_string(param_count) + " parameters, signature " + hex64(signature) +
                    ": load it into the model that saved it (the same layers, shapes and layer options, BatchNorm's "
                    "included)");

    CheckpointContents out;
    out.state.epoch = read_u64(b.data() + 36);
    out.state.step = read_u64(b.data() + 44);
    out.state.seed = read_u64(b.data() + 52);
    if (version != 1) {
        out.state.optimizer = read_u32(b.data() + 68);
        out.state.optimizer_steps = read_u64(b.data() + 72);
    }
    if (version >= 3)
        out.state.loss_scale = LossScaleState{.scale = std::bit_cast<float>(read_u32(b.data() + 88)),
                                              .clean_steps = read_u64(b.data() + 92),
                                              .skipped_steps = read_u64(b.data() + 100)};
    const unsigned char* p = b.data() + header_size_of(version);
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
    p += 4 * file_states;
    out.statistics = read_f32s(p, std::size_t(statistics_count));
    check_sense(name, out, trainable_count, expect);
    return out;
}

} // namespace detail

// Writes model's parameters and optimizer state, and `state`, to `path` atomically. Throws Error
// naming the path and the OS error when any step fails, or when a parameter or optimizer value is NaN
// or infinite; a checkpoint already at `path` is then untouched.
template <class M>
void save_checkpoint(const std::filesystem::path& path, const M& model, const CheckpointState& state)
{
    static_assert(Checkpointable<M>, "save_checkpoint: the model must be a Sequential<Input<...>, ...>, or a "
                                     "DataParallel or AutoParallel of one");
    core::require(!state.loss_scale || (std::isfinite(state.loss_scale->scale) && state.loss_scale->scale > 0.0f),
                  "save_checkpoint: the loss scale must be finite and > 0");
    core::require(state.optimizer <= detail::checkpoint_max_optimizer,
                  "save_checkpoint: optimizer id " + std::to_string(state.optimizer) + " is not one of 0 (none named), "
                  "1 (SGD), 2 (Adam), 3 (AdamW)");
    const std::vector<float> w = model.parameters();
    const std::vector<float> s = model.optimizer_state();
    std::vector<float> t;
    if constexpr (HasStatistics<M>) {
        t = model.statistics();
        core::require(t.size() == M::statistics_count, "save_checkpoint: the model's statistics() returned " +
                                                           std::to_string(t.size()) + " values, its statistics_count is " +
                                                           std::to_string(M::statistics_count));
    }
    std::size_t bad = 0;
    const bool finite_w = detail::all_finite(w, bad);
    const bool finite_s = finite_w && detail::all_finite(s, bad);
    if (!finite_s || !detail::all_finite(t, bad))
        throw Error("not writing checkpoint " + path.string() + ": " +
                    (!finite_w ? "parameter " : !finite_s ? "optimizer value " : "statistics value ") +
                    std::to_string(bad) + " is " + std::to_string(!finite_w ? w[bad] : !finite_s ? s[bad] : t[bad]) +
                    "; training has diverged (a learning rate too high, or NaN or infinite inputs). "
                    "The previous checkpoint, if any, is unchanged: resume from it with a smaller learning rate");
    detail::ByteWriter out;
    out.reserve(detail::checkpoint_header_size + detail::checkpoint_record_size * state.history.size() +
                4 * (w.size() + s.size() + t.size()) + 4);
    out.raw(detail::checkpoint_magic, sizeof detail::checkpoint_magic);
    out.u32(state.loss_scale ? detail::checkpoint_version : detail::checkpoint_version_unscaled);
    out.u64(model_signature<M>());
    out.u64(w.size());
    out.u64(s.size());
    out.u64(state.epoch);
    out.u64(state.step);
    out.u64(state.seed);
    out.u64(state.history.size());
    out.u32(state.optimizer);
    out.u64(state.optimizer_steps);
    out.u64(t.size());
    if (state.loss_scale) {
        out.u32(std::bit_cast<std::uint32_t>(state.loss_scale->scale));
        out.u64(state.loss_scale->clean_steps);
        out.u64(state.loss_scale->skipped_steps);
    }
    for (const auto& r : state.history) {
        out.u64(r.epoch);
        out.f64(r.train_loss);
        out.f64(r.validation_loss);
        out.f64(r.validation_accuracy);
        out.f64(r.seconds);
    }
    out.f32s(w);
    out.f32s(s);
    out.f32s(t);
    out.u32(detail::crc32_of(out.bytes().data(), out.bytes().size()));
    detail::write_file_atomically(path, out.bytes());
}

// An optimizer a checkpoint can name: SGD, Adam, AdamW.
template <class Opt>
concept NamedOptimizer = requires {
    { Opt::checkpoint_id } -> std::convertible_to<std::uint32_t>;
    { Opt::state_per_param } -> std::convertible_to<std::size_t>;
};

// The same, naming opt and keeping its step count (Adam's t), if it counts its updates, and a
// LossScale's state.
template <class M, NamedOptimizer Opt>
void save_checkpoint(const std::filesystem::path& path, const M& model, CheckpointState state, const Opt& opt)
{
    state.optimizer = Opt::checkpoint_id;
    if constexpr (requires { opt.step_count(); }) state.optimizer_steps = opt.step_count();
    else state.optimizer_steps = 0;
    if constexpr (requires { opt.scale_state(); }) state.loss_scale = opt.scale_state();
    save_checkpoint(path, model, state);
}

// Loads the checkpoint at `path` into model (parameters, and optimizer state when the file has any)
// and returns the rest. Throws Error naming the file when it is missing, truncated, not a checkpoint,
// of another format version, corrupt, saved from a model of another structure, holds values that make
// no sense (non-finite, history beyond its epoch) or does not fit `expect`; the model is then untouched.
template <class M>
CheckpointState load_checkpoint(const std::filesystem::path& path, M& model, const CheckpointExpectations& expect = {})
{
    static_assert(Checkpointable<M>, "load_checkpoint: the model must be a Sequential<Input<...>, ...>, or a "
                                     "DataParallel or AutoParallel of one");
    constexpr std::size_t statistics = statistics_count_of<M>();
    constexpr std::size_t trainable = model::replica_of<M>::type::trainable_count;
    const std::vector<unsigned char> bytes = detail::read_checkpoint_bytes(path, M::param_count, statistics);
    auto contents = detail::parse_checkpoint(path.string(), bytes, model_signature<M>(), M::param_count, statistics,
                                             trainable, expect);
    model.set_parameters(contents.parameters);
    model.set_optimizer_state(contents.optimizer_state);   // none saved: the run restarts its momentum
    if constexpr (statistics > 0) model.set_statistics(contents.statistics);
    return std::move(contents.state);
}

// The same for the optimizer opt: a file that names another optimizer, or holds another number of
// state values per parameter, is refused (the model and opt untouched); opt takes the file's step
// count, if it counts its updates, and a LossScale the file's state (a file without: init_scale and
// no counts).
template <class M, NamedOptimizer Opt>
CheckpointState load_checkpoint(const std::filesystem::path& path, M& model, Opt& opt, CheckpointExpectations expect = {})
{
    expect.optimizer = Opt::checkpoint_id;
    expect.state_per_param = Opt::state_per_param;
    CheckpointState state = load_checkpoint(path, model, expect);
    if constexpr (requires { opt.set_step_count(state.optimizer_steps); }) opt.set_step_count(state.optimizer_steps);
    if constexpr (requires { opt.set_scale_state(opt.initial_state()); })
        opt.set_scale_state(state.loss_scale ? *state.loss_scale : opt.initial_state());
    return state;
}

} // namespace replica::train

namespace REPLICA_NAMESPACE {
using train::CheckpointExpectations;
using train::CheckpointState;
using train::HasStatistics;
using train::load_checkpoint;
using train::model_signature;
using train::save_checkpoint;
} // namespace replica
