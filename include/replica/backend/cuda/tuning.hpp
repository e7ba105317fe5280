#pragma once
// The autotuner's timed choices kept on disk (Options::tuning_cache; the file and its format:
// core/tuning_cache.hpp): what a record's key says about the machine, which file a context's options
// name, and how many choices this process timed and took from it. The autotuners build the keys and
// values and check a value before they take it (conv/autotune.hpp, linear.hpp). Only under nvcc.

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>

#include "replica/backend/cuda/check.hpp"
#include "replica/backend/cuda/context.hpp"
#include "replica/core/config.hpp"
#include "replica/core/tuning_cache.hpp"
#include "replica/version.hpp"

namespace REPLICA_NAMESPACE::backend::cuda {

// What the autotuner of this process did so far (Options::benchmark): candidates timed (each of
// cuDNN's and cuBLASLt's candidates, each pass of a convolution's product path), choices taken from
// the tuning cache instead, and records found there whose algorithms the libraries no longer list
// (timed again). For tests and the benchmark; counts only grow.
struct TuningCounts {
    std::size_t candidates_timed = 0, choices_cached = 0, records_refused = 0;
};

namespace detail {
struct TuningCounters {
    std::atomic<std::size_t> timed{0}, cached{0}, refused{0};
};
inline TuningCounters& tuning_counters()
{
    static TuningCounters c;
    return c;
}
} // namespace detail

inline TuningCounts tuning_counts()
{
    const detail::TuningCounters& c = detail::tuning_counters();
    return {c.timed.load(), c.cached.load(), c.refused.load()};
}

namespace detail {

// The driver: the CUDA version it supports and, where the system says it (Linux's
// /proc/driver/nvidia/version), its release: "13000 580.95.05". Read once.
inline const std::string& driver_version()
{
    static const std::string version = [] {
        int cuda = 0;
        REPLICA_CHECK(cudaDriverGetVersion(&cuda));
        std::string out = std::to_string(cuda), line;
        std::ifstream in("/proc/driver/nvidia/version");
        std::getline(in, line);   // "NVRM version: NVIDIA UNIX ... Kernel Module ...  580.95.05  Release Build ..."
        std::istringstream words(line);
        for (std::string w; words >> w;)
            if (w.find('.') != std::string::npos && w.front() >= '0' && w.front() <= '9' &&
                w.find_first_not_of("0123456789.") == std::string::npos) {
                out += " " + w;
                break;
            }
        return out;
    }();
    return version;
}

// What a choice timed on ctx's device holds for: the GPU's kind (model, compute capability,
// multiprocessors), the driver, the CUDA runtime, cuDNN and cuBLASLt (whose candidates were timed),
// and replica (whose product path was timed against cuDNN).
inline core::TuningEnvironment tuning_environment(const Context& ctx)
{
    int runtime = 0;
    REPLICA_CHECK(cudaRuntimeGetVersion(&runtime));
    return {ctx.device_kind(), driver_version(), runtime, std::int64_t(cudnnGetVersion()),
            std::int64_t(cublasLtGetVersion()), REPLICA_VERSION};
}

// The process's tuning caches, one a folder, each read from its file once.
struct TuningCaches {
    std::mutex mutex;
    std::map<std::filesystem::path, std::unique_ptr<core::TuningCache>> by_folder;
};
inline TuningCaches& tuning_caches()
{
    static TuningCaches c;
    return c;
}

// The tuning cache that ctx's options name; nullptr where none is used: Options::tuning_cache off,
// nothing timed (benchmark off, or deterministic), or no folder (core::tuning_cache_folder).
inline core::TuningCache* tuning_cache(const Context& ctx)
{
    const Options& o = ctx.options();
    if (!o.tuning_cache || !o.benchmark || o.deterministic) return nullptr;
    const std::filesystem::path folder = core::tuning_cache_folder(o.tuning_cache_dir);
    if (folder.empty()) return nullptr;
    TuningCaches& caches = tuning_caches();
    std::lock_guard lock(caches.mutex);
    std::unique_ptr<core::TuningCache>& cache = caches.by_folder[folder];
    if (!cache) cache = std::make_unique<core::TuningCache>(folder);
    return cache.get();
}

// Where the tuning cache's lines go: Options::log, else std::cerr.
inline std::ostream& tuning_log(const Context& ctx) { return ctx.options().log ? *ctx.options().log : std::cerr; }

// A record whose value the libraries refuse now (its algorithm is not among their candidates): one
// line a process, then the choice is timed again and the record replaced.
inline void refuse_record(const Context& ctx, const core::TuningCache& cache, const char* what)
{
    ++tuning_counters().refused;
    static std::atomic<bool> said{false};
    if (!said.exchange(true))
        tuning_log(ctx) << "replica: tuning cache " << cache.file().string() << ": a " << what
                        << " record's choice is not among the libraries' candidates now: such records are timed again"
                        << std::endl;
}

// Forgets the tuning caches read, so that the next choice reads its file again as a new process
// would (for tests; conv/autotune.hpp's forget_timed_choices). Not while a context chooses.
inline void forget_tuning_caches()
{
    TuningCaches& caches = tuning_caches();
    std::lock_guard lock(caches.mutex);
    caches.by_folder.clear();
}

} // namespace detail

} // namespace replica::backend::cuda
