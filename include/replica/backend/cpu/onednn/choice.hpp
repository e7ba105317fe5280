#pragma once
// Which code runs a convolution's pass on the CPU (REPLICA_ONEDNN builds): cpu/conv.hpp calls
// conv_forward / conv_backward here first for float and bf16 convolutions, and runs its im2col +
// OpenBLAS code where they return false. bf16 runs on oneDNN only where the CPU has bf16 products
// (native_bf16()): elsewhere oneDNN would emulate them, and the library's path is kept.
//
// ConvPath::onednn runs oneDNN wherever it has a primitive for the shape. ConvPath::automatic
// chooses by rule_prefers_onednn: what runs, and with it every bit of the results, depends only on
// the shape, never on the timings of a run, the replica count or the machine's load (a run resumed
// from a checkpoint continues bit for bit). ConvPath::timed chooses per pass (forward; the gradients
// together) by shape, batch, thread count and whether dx is wanted, one choice for a layer with or
// without bias or fused ReLU (so that such variants, which give the same values, give the same bits):
// - outside backend::SerialHostKernels scopes, by timing: the first call of a key runs each
//   candidate once untimed, then twice more, in turns, and keeps the faster by its better time (in
//   turns and the better of two, so that a moment of load on a shared machine rarely decides),
//   process-wide (every context and replica of the process then runs the same code for that key);
// - inside one (replicas on their own threads, the reproducible mode), by the rule, as automatic.

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

#include "replica/backend/cpu/context.hpp"
#include "replica/backend/cpu/onednn/conv.hpp"
#include "replica/backend/cpu/onednn/runtime.hpp"
#include "replica/core/config.hpp"
#include "replica/core/number.hpp"
#include "replica/core/window.hpp"

namespace REPLICA_NAMESPACE::backend::cpu::onednn {

// The rule: oneDNN for windows larger than one pixel with at least 16 output channels (a transposed
// convolution's input channels: its key's cout), except for the gradients of a layer whose input
// channels fill no whole block of 8 (oneDNN's unit) on an image under 64 x 64 (LeNet's two layers,
// ResNet-20's first): 1x1 windows, few-filter layers and those gradients stay with im2col, which is
// as fast or faster there in float. In bf16 oneDNN's products take half the bytes and, on a CPU with
// bf16 products, a fraction of the time, where im2col converts its operands to float first: every
// convolution.
inline bool rule_prefers_onednn(const ConvKey& k, bool backward)
{
    if (k.bf16) return true;
    if (k.kh * k.kw == 1 || k.cout < 16) return false;
    return !(backward && k.c % 8 != 0 && k.h * k.w < 64 * 64);
}

namespace detail {
struct ChoiceKey {
    ConvKey conv;   // bias and relu false
    bool backward;
    auto operator<=>(const ChoiceKey&) const = default;
};
inline ChoiceKey choice_key(ConvKey k, bool backward)
{
    k.bias = k.relu = false;
    return {k, backward};
}
struct Choices {
    std::mutex mutex;
    std::map<ChoiceKey, bool> onednn;   // timed choices
};
inline Choices& choices()
{
    static Choices c;
    return c;
}

template <class F>
double seconds(F&& run)
{
    const auto t0 = std::chrono::steady_clock::now();
    run();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Whether oneDNN runs this pass: by the setting, the rule or the timing (run_blas and run_onednn
// compute the pass each way; `restore` puts back what a run changed that the pass reads).
template <class Blas, class Onednn, class Restore>
bool prefers_onednn(const ChoiceKey& key, Blas&& run_blas, Onednn&& run_onednn, Restore&& restore)
{
    const ConvPath path = conv_path();
    if (path == ConvPath::onednn) return true;
    if (path == ConvPath::automatic || cpu::detail::serial_scopes() > 0) return rule_prefers_onednn(key.conv, key.backward);
    Choices& c = choices();
    {
        const std::lock_guard lock(c.mutex);
        if (auto it = c.onednn.find(key); it != c.onednn.end()) return it->second;
    }
    auto blas_once = [&] { restore(); run_blas(); };
    auto onednn_once = [&] { restore(); run_onednn(); };
    blas_once();
    onednn_once();
    double blas = seconds(blas_once), onednn = seconds(onednn_once);
    blas = std::min(blas, seconds(blas_once));
    onednn = std::min(onednn, seconds(onednn_once));
    restore();
    const std::lock_guard lock(c.mutex);
    return c.onednn.emplace(key, onednn < blas).first->second;
}

// The plan for `key` in `rt`, made the first time with the thread count set; null where oneDNN has no
// primitive for the shape.
template <class Plan>
Plan* plan_for(Runtime& rt, const ConvKey& key)
{
    use_threads(key.threads);
    return rt.plan<Plan>(key, [&](const dnnl::engine& e) -> std::unique_ptr<Plan> {
        try {
            return std::make_unique<Plan>(e, key);
        } catch (const dnnl::error&) {
            return nullptr;
        }
    });
}
} // namespace detail

// Whether oneDNN may run a convolution of T (float, or bf16 on a CPU with bf16 products).
template <class T>
bool takes()
{
    if constexpr (std::is_same_v<T, float>) return conv_path() != ConvPath::blas;
    else if constexpr (std::is_same_v<T, core::bf16>) return conv_path() != ConvPath::blas && native_bf16();
    else return false;
}

// Runs the forward pass of a float or bf16 convolution (cpu/conv.hpp's conv_forward) through oneDNN
// where it is chosen, and says whether it did; `run_blas` computes the same pass with im2col.
// `transposed`: conv_transpose_forward's pass (g and cout as it has them: cout its input channels).
template <class T, class Blas>
bool conv_forward(Runtime& rt, const core::Window& g, int cout, const T* w, const float* b, const T* x, T* y,
                  std::size_t n, bool relu, Blas&& run_blas, bool transposed = false)
{
    if (!takes<T>()) return false;
    const ConvKey key =
        conv_key(g, cout, n, b != nullptr, relu, false, blas_threads(), !std::is_same_v<T, float>, transposed);
    ConvForward* plan = detail::plan_for<ConvForward>(rt, key);
    if (plan == nullptr) return false;
    auto run_onednn = [&] { plan->run(rt.stream(), w, b, x, y); };
    if (!detail::prefers_onednn(detail::choice_key(key, false), run_blas, run_onednn, [] {})) return false;
    use_threads(key.threads);
    run_onednn();
    return true;
}

// The same for the backward pass (conv_backward): dw, db assigned; dx (may be null) assigned or, with
// `accumulate`, added to.
template <class T, class Blas>
bool conv_backward(Runtime& rt, const core::Window& g, int cout, const T* w, const T* x, const T* dy, T* dx, float* dw,
                   float* db, std::size_t n, bool accumulate, Blas&& run_blas, bool transposed = false)
{
    if (!takes<T>()) return false;
    const ConvKey key = conv_key(g, cout, n, db != nullptr, false, dx != nullptr, blas_threads(),
                                 !std::is_same_v<T, float>, transposed);
    ConvBackward* plan = detail::plan_for<ConvBackward>(rt, key);
    if (plan == nullptr) return false;
    auto run_onednn = [&] { plan->run(rt.stream(), w, x, dy, dx, dw, db, accumulate); };
    std::vector<T> dx_before;   // made only where a key is timed and dx is added to
    const std::size_t dx_count = n * (transposed ? std::size_t(cout) * g.out_pixels() : std::size_t(g.in_size()));
    auto restore = [&] {
        if (!accumulate || dx == nullptr) return;
        if (dx_before.empty()) dx_before.assign(dx, dx + dx_count);
        else std::memcpy(dx, dx_before.data(), dx_count * sizeof(T));
    };
    if (!detail::prefers_onednn(detail::choice_key(key, true), run_blas, run_onednn, restore)) return false;
    use_threads(key.threads);
    run_onednn();
    return true;
}

} // namespace replica::backend::cpu::onednn
