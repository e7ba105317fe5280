#pragma once
// The CPU context: everything a replica on the host needs to run layers. Cheap to create.

#include <cblas.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "replica/backend/contract.hpp"
#include "replica/backend/cpu/threads.hpp"
#include "replica/core/config.hpp"
#include "replica/core/device.hpp"
#include "replica/core/event.hpp"
#include "replica/core/tensor.hpp"

#if defined(REPLICA_ONEDNN)
#include "replica/backend/cpu/onednn/runtime.hpp"
#endif

namespace REPLICA_NAMESPACE::backend::cpu {

// Which code runs the CPU's float convolutions (cpu/conv.hpp): `blas`, im2col and OpenBLAS products;
// `onednn`, oneDNN's primitives (builds with REPLICA_ONEDNN); `automatic`, per layer shape by a rule
// that takes the faster where it is clear (the same code, and so the same bits, in every run);
// `timed`, per layer shape and pass whichever was faster when first timed in this process, which may
// differ from run to run (cpu/onednn/choice.hpp). `blas` in a build without oneDNN. Process-wide; the
// default is `automatic`, or what the environment variable REPLICA_CPU_CONV (auto, timed, blas,
// onednn) says when the first convolution runs.
enum class ConvPath { automatic, timed, blas, onednn };

inline constexpr bool has_onednn =
#if defined(REPLICA_ONEDNN)
    true;
#else
    false;
#endif

namespace detail {
inline ConvPath conv_path_from_environment()
{
    const char* v = std::getenv("REPLICA_CPU_CONV");
    const std::string s = v ? v : "auto";
    if (s == "auto" || s.empty()) return ConvPath::automatic;
    if (s == "timed") return ConvPath::timed;
    if (s == "blas") return ConvPath::blas;
    if (s == "onednn") {
        core::require(has_onednn, "REPLICA_CPU_CONV=onednn, but this build has no oneDNN (Meson: -Donednn=enabled)");
        return ConvPath::onednn;
    }
    throw Error("REPLICA_CPU_CONV is '" + s + "': say auto, timed, blas or onednn");
}
inline std::atomic<ConvPath>& conv_path_setting()
{
    static std::atomic<ConvPath> path{conv_path_from_environment()};
    return path;
}
// How many backend::SerialHostKernels scopes are open, in any thread: while any is, choices that
// must not depend on timing (cpu/onednn/choice.hpp) are made by rule.
inline std::atomic<int>& serial_scopes()
{
    static std::atomic<int> scopes{0};
    return scopes;
}
} // namespace detail

inline ConvPath conv_path() { return has_onednn ? detail::conv_path_setting().load() : ConvPath::blas; }
// Throws where `path` is ConvPath::onednn in a build without oneDNN.
inline void set_conv_path(ConvPath path)
{
    core::require(path != ConvPath::onednn || has_onednn,
                  "ConvPath::onednn in a build without oneDNN (Meson: -Donednn=enabled)");
    detail::conv_path_setting() = path;
}

// OpenBLAS picks its kernels by CPU model when it loads; a model newer than the library falls back to
// generic SSE3 kernels, several times slower. Say so once, with the fix.
inline bool check_blas_kernels()
{
    const std::string core = openblas_get_corename();
    const bool generic = core == "Prescott" || core == "Core2" || core == "Penryn" || core == "Nehalem" ||
                         core == "Sandybridge" || core == "unknown";
    const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
    if (generic && std::getenv("OPENBLAS_CORETYPE") == nullptr && __builtin_cpu_supports("avx2"))
        std::fprintf(stderr,
                     "replica: OpenBLAS runs its %s kernels on a CPU with AVX2%s; set OPENBLAS_CORETYPE=%s before "
                     "starting the program for several times the speed (scripts/ do this)\n",
                     core.c_str(), avx512 ? " and AVX-512" : "", avx512 ? "SkylakeX" : "Haswell");
    return generic;
}

class Context {
public:
    explicit Context(Device device = Device::cpu()) : device_(device)
    {
        core::require(device.is_cpu(), "cpu::Context made for " + device.name());
        static const bool checked = check_blas_kernels();
        (void)checked;
    }

    // Host pointers are valid in this context: inputs are read where they are, never copied.
    static constexpr bool host_visible = true;

    const Device& device() const { return device_; }

    // A pointer to `n` host values usable by kernels in this context. Here: the host pointer itself.
    template <class T>
    const T* stage(const T* host, T* /*staging*/, std::size_t /*n*/) const { return host; }

    template <class T>
    core::Buffer<T> allocate(std::size_t n) const { return core::Buffer<T>::host(n); }

    // Host <-> this context's memory. On the CPU both are plain copies.
    template <class T>
    void upload(T* dst, const T* src, std::size_t n) const { if (n) std::memcpy(dst, src, n * sizeof(T)); }
    template <class T>
    void download(T* dst, const T* src, std::size_t n) const { if (n) std::memcpy(dst, src, n * sizeof(T)); }

    // Host memory for a kernel's float copies of bf16 or fp16 values, at least `floats` floats: the
    // largest request so far, reused from call to call (no allocation once warm), valid until the next
    // call. Shared by copies of this context, which run on one thread.
    float* workspace(std::size_t floats) const
    {
        if (workspace_->size() < floats) *workspace_ = core::Buffer<float>::host(floats);
        return workspace_->data();
    }

#if defined(REPLICA_ONEDNN)
    // The oneDNN engine and the primitives made in this context (and its copies) so far.
    onednn::Runtime& onednn() const
    {
        if (!*onednn_) *onednn_ = std::make_unique<onednn::Runtime>();
        return **onednn_;
    }
#endif

    void synchronize() const {}
    void activate() const {}
    // Work is finished when a call returns: nothing to order.
    core::Event mark() const { return {}; }
    void wait(core::Event) const {}
    core::Event mark_for_host(int) const { return {}; }
    void synchronize(core::Event) const {}

private:
    Device device_;
    std::shared_ptr<core::Buffer<float>> workspace_ = std::make_shared<core::Buffer<float>>();
#if defined(REPLICA_ONEDNN)
    // Made at the first oneDNN call, so that contexts that never run one stay cheap.
    std::shared_ptr<std::unique_ptr<onednn::Runtime>> onednn_ = std::make_shared<std::unique_ptr<onednn::Runtime>>();
#endif
};
static_assert(backend::Context<Context>);

} // namespace replica::backend::cpu
