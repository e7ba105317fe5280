#pragma once
// The CPU backend's own loops (BatchNorm, the elementwise maps, pooling, the optimizers) on
// the widest vector instructions that keep their bits, chosen when the program runs: a program built
// for any x86-64 (SSE2, what compilers target unless told -march) runs them with AVX2 on CPUs that
// have it, as PyTorch's CPU kernels are chosen at run time.
//
// vectorized(f) calls f, compiled once more with AVX2 enabled (f and everything it calls inlined into
// a function of that target) where the CPU has AVX2, else as built. The AVX2 form has no FMA: a
// compiler may contract a * b + c into one rounding only where FMA is enabled (GCC does so even under
// -std=c++20, Clang by default), and AVX-512 implies FMA, so neither is used. The loops' orders of
// sums are written out (BatchNorm's lanes), never left to the compiler, which keeps them without
// -ffast-math. So every form gives the same bits as the baseline on the same inputs: the results do
// not depend on the CPU's vector width, and a test checks it (set_isa).
//
// Each wrapped kernel is compiled twice wherever it is instantiated: wrap only kernels whose wide form
// makes a step measurably shorter (docs/design.md).

#include <atomic>
#include <cstdlib>
#include <string>
#include <string_view>

#include "replica/core/config.hpp"
#include "replica/core/error.hpp"

namespace REPLICA_NAMESPACE::backend::cpu {

// The vector instructions vectorized() runs: the build's (baseline), or AVX2.
enum class Isa { baseline, avx2 };

// Only in optimised builds: unoptimised code is not vectorised in either form, and the second form
// would only add to the compile time (a debug build; the CUDA test programs where no GPU runs them).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && defined(__OPTIMIZE__)
#define REPLICA_CPU_AVX2 1
#endif

namespace detail {
// The widest Isa this CPU runs.
inline Isa host_isa()
{
#if defined(REPLICA_CPU_AVX2)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) return Isa::avx2;
#endif
    return Isa::baseline;
}
inline constexpr const char* no_avx2_form =
    "this CPU has no AVX2, or this build no AVX2 form (it needs GCC or Clang on x86-64, optimising)";
inline Isa isa_from_environment()
{
    const char* v = std::getenv("REPLICA_CPU_ISA");
    const std::string_view s = v ? v : "";
    if (s.empty()) return host_isa();
    if (s == "baseline") return Isa::baseline;
    core::require(s == "avx2", "REPLICA_CPU_ISA is '" + std::string(s) + "': say baseline or avx2");
    core::require(host_isa() == Isa::avx2, std::string("REPLICA_CPU_ISA=avx2, but ") + no_avx2_form);
    return Isa::avx2;
}
inline std::atomic<Isa>& isa_setting()
{
    static std::atomic<Isa> isa{isa_from_environment()};
    return isa;
}

#if defined(REPLICA_CPU_AVX2)
template <class F>
[[gnu::target("avx2"), gnu::flatten]] void run_avx2(F& f)
{
    f();
}
#endif
} // namespace detail

// What vectorized() runs now: the widest this CPU has, unless set_isa or the environment variable
// REPLICA_CPU_ISA (baseline, avx2), read at the first call, chose another.
inline Isa isa() { return detail::isa_setting().load(std::memory_order_relaxed); }
inline bool cpu_has(Isa i) { return i == Isa::baseline || detail::host_isa() == Isa::avx2; }
// Process-wide (tests compare the forms): throws where the CPU lacks `i`.
inline void set_isa(Isa i)
{
    core::require(cpu_has(i), std::string("set_isa: ") + detail::no_avx2_form);
    detail::isa_setting() = i;
}

template <class F>
void vectorized(F&& f)
{
#if defined(REPLICA_CPU_AVX2)
    if (isa() == Isa::avx2) {
        detail::run_avx2(f);
        return;
    }
#endif
    f();
}

} // namespace replica::backend::cpu
