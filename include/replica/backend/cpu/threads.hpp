#pragma once
// The CPU backend's threads: how many its calls may use, and the loops that split over them.
//
// In builds with oneDNN (REPLICA_ONEDNN) every thread the backend runs is one of OpenMP's team
// (libgomp, which oneDNN runs on): oneDNN's primitives, the products (gemm in ops.hpp: OpenBLAS on one
// thread per part, the parts split over the team) and the backend's own loops (BatchNorm, pooling, the
// elementwise maps). OpenBLAS is kept on one thread there, so its own threads (started when it loads)
// get no work: after a call of theirs they wait spinning for a while, and on a machine with as many
// threads as cores they would take the cores from the team. The runtime is called as `#pragma omp
// parallel` compiles to (GOMP_parallel), so that no translation unit needs -fopenmp. Without oneDNN,
// OpenBLAS threads its products itself and the own loops run on the calling thread.
//
// Each loop is split into ranges of whole rows, each row computed as on one thread, sums included, so
// that the own loops' results never depend on the thread count.

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <type_traits>

#include "replica/core/config.hpp"

#if defined(REPLICA_ONEDNN)
// OpenMP's thread count (set per call by onednn/runtime.hpp) and a team member's place in its team.
// A compiler without OpenMP's header (Clang without libomp-dev) gets them declared as libgomp has them.
#if __has_include(<omp.h>)
#include <omp.h>
#else
extern "C" {
void omp_set_num_threads(int) noexcept;
int omp_get_max_threads() noexcept;
int omp_get_thread_num() noexcept;
int omp_get_num_threads() noexcept;
}
#endif
extern "C" {
// libgomp's entry for a parallel region (what GCC emits for `#pragma omp parallel`; LLVM's libomp has
// it too): runs fn(data) on a team of num_threads threads, the caller one of them, and returns when
// all have.
void GOMP_parallel(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags);
}
#endif

namespace REPLICA_NAMESPACE::backend::cpu {

namespace detail {
inline constexpr bool team_threads =
#if defined(REPLICA_ONEDNN)
    true;
#else
    false;
#endif

// The threads the backend's calls may use; at first OpenBLAS's setting when the program started
// (OPENBLAS_NUM_THREADS, else the cores), which is then set to 1 where the team does the threading.
inline std::atomic<int>& host_threads()
{
    static std::atomic<int> n{[] {
        const int t = std::max(openblas_get_num_threads(), 1);
        if (team_threads) openblas_set_num_threads(1);
        return t;
    }()};
    return n;
}
} // namespace detail

// Threads one call of the CPU backend may use: its products, oneDNN's primitives and its own loops.
// Global to the process (OpenBLAS has no per-call setting): backend::SerialHostKernels sets it to 1 for
// a scope (replicas on their own threads; the reproducible mode).
inline void set_blas_threads(int n)
{
    detail::host_threads() = std::max(n, 1);
    if (!detail::team_threads) openblas_set_num_threads(std::max(n, 1));
}
inline int blas_threads() { return detail::host_threads().load(std::memory_order_relaxed); }

// Below this many values a loop runs on the calling thread: waking the team costs more than it saves.
inline constexpr std::size_t parallel_min_values = 32768;

// Calls f(begin, end) over consecutive ranges covering [0, rows), each on one of up to blas_threads()
// threads (one range a thread); `values`: the values the whole loop reads or writes, by which a small
// loop stays on the calling thread. f must not throw.
template <class F>
void parallel_rows(std::size_t rows, std::size_t values, F&& f)
{
    if (rows == 0) return;
#if defined(REPLICA_ONEDNN)
    const std::size_t by_size = std::max<std::size_t>(values / parallel_min_values, 1);
    const auto threads = static_cast<unsigned>(std::min({std::size_t(blas_threads()), rows, by_size}));
    if (threads > 1) {
        struct Work {
            std::remove_reference_t<F>* f;
            std::size_t rows;
        } work{&f, rows};
        GOMP_parallel(
            [](void* data) {
                const Work& w = *static_cast<const Work*>(data);
                const auto t = std::size_t(omp_get_thread_num()), n = std::size_t(omp_get_num_threads());
                const std::size_t begin = w.rows * t / n, end = w.rows * (t + 1) / n;
                if (begin < end) (*w.f)(begin, end);
            },
            &work, threads, 0);
        return;
    }
#else
    (void)values;
#endif
    f(std::size_t(0), rows);
}

// parallel_rows over the values [0, count) of an elementwise loop, in ranges of whole blocks of 64
// values (whole cache lines): f(begin, end) are value indices.
template <class F>
void parallel_values(std::size_t count, F&& f)
{
    constexpr std::size_t block = 64;
    parallel_rows((count + block - 1) / block, count,
                  [&](std::size_t b0, std::size_t b1) { f(b0 * block, std::min(b1 * block, count)); });
}

} // namespace replica::backend::cpu
