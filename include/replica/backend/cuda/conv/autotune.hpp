#pragma once
// The one autotuner of convolutions: for each layer (window, filters, batch size, element type and
// what the plan is for) it makes the plan that says which candidate (conv/candidate.hpp) runs each pass, forward
// and backward (the two gradients), and with which algorithms:
// - cuDNN's algorithms for each pass: its heuristic choice, or, with Options::benchmark (and not
//   deterministic), its candidates timed as a step runs them (conv/cudnn.hpp, timing.hpp);
// - for a plain convolution, by ConvPath: the products (conv/products.hpp) for a pass where they
//   are at least 3% faster than cuDNN's timed algorithms (`timed`), or where the path says so. For
//   channels-last activations the products are timed only where the input channels are not a
//   multiple of 8 (weighs_products), and their backward takes cuDNN's input gradient with it;
// - the direct kernels (conv/direct.hpp) by a rule on the shape (detail::direct_conv), not timed.
// A candidate that cannot run or be captured in a CUDA graph is timed as CallTimer::never and so
// never chosen. Deterministic mode keeps cuDNN's heuristic choice (deterministic algorithms) and
// never the products' timed choice. Timed choices are kept process-wide per kind of GPU and shape
// (measured_mutex guards them): a model's replicas on identical GPUs run the same algorithms, and a
// second model reuses the times. They are kept in the tuning cache too (Options::tuning_cache,
// tuning.hpp), from which a later run takes a layer's choice where cuDNN still lists its algorithms,
// instead of timing. Options::log receives a line per choice as it is made or taken. Only under nvcc.

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <ostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/conv/candidate.hpp"
#include "replica/backend/cuda/conv/cudnn.hpp"
#include "replica/backend/cuda/conv/direct.hpp"
#include "replica/backend/cuda/conv/products.hpp"
#include "replica/backend/cuda/linear.hpp"
#include "replica/backend/cuda/timing.hpp"
#include "replica/backend/cuda/tuning.hpp"
#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::backend::cuda::detail {

// Timed choices (Options::benchmark), process-wide: by kind of GPU, shape and the options that
// change what is timed.
struct MeasuredConvKey {
    std::string device;   // device_kind()
    ConvKey conv;
    bool tf32, graphs, channels_last;
    friend bool operator<(const MeasuredConvKey& a, const MeasuredConvKey& b)
    {
        if (a.device != b.device) return a.device < b.device;
        if (a.conv < b.conv) return true;
        if (b.conv < a.conv) return false;
        return std::tie(a.tf32, a.graphs, a.channels_last) < std::tie(b.tf32, b.graphs, b.channels_last);
    }
};
// What was timed for one key and what was chosen: cuDNN's algorithms (with their seconds) and, for
// ConvPath::timed, the products' seconds and the passes they take; not timed yet while
// `products_timed` is false.
struct ConvAlgorithms {
    CudnnAlgorithms cudnn;
    PassSeconds products;
    bool products_timed = false, gemm_forward = false, gemm_backward = false;
};

// What the products' backward is weighed against: cuDNN's two gradients, or on channels-last
// activations, where the products leave the input gradient to cuDNN's algorithm, its filter gradient.
inline double products_rival(const CudnnAlgorithms& cudnn, bool channels_last)
{
    const bool apart = channels_last && cudnn.data_seconds < CallTimer::never;
    return apart ? cudnn.seconds.backward - cudnn.data_seconds : cudnn.seconds.backward;
}

// One line of Options::log: a timed choice, the layer named input -> output (a transposed
// convolution's window maps its output to its input: CudnnConvTranspose). The algorithms are
// those of the cuDNN convolution; a transposed layer runs its forward pass by backward data.
// `cached`: taken from the tuning cache (the times are those it was chosen by).
inline void log_choice(std::ostream& out, const MeasuredConvKey& measured, const ConvAlgorithms& a, bool cached = false)
{
    const ConvKey& key = measured.conv;
    const std::string& device = measured.device;
    const core::Window& g = key.g;
    auto us = [](double s) { return s >= CallTimer::never ? std::string("-") : std::to_string(int(s * 1e6 + 0.5)) + " us"; };
    const std::string conv_in = std::to_string(g.c) + "x" + std::to_string(g.h) + "x" + std::to_string(g.w),
                      conv_out = std::to_string(key.cout) + "x" + std::to_string(g.oh) + "x" + std::to_string(g.ow);
    const bool transposed = key.use == ConvKey::transposed;
    out << "replica: " << device << (transposed ? ": transposed convolution " : ": convolution ")
        << (transposed ? conv_out : conv_in) << " -> " << (transposed ? conv_in : conv_out) << " (" << g.kh << "x" << g.kw
        << ", stride " << g.sh << "x" << g.sw << ", pad " << g.ph << "x" << g.pw << "), batch " << key.n
        << (key.storage == StorageId::fp32 ? "" : std::string(", ") + storage_name(key.storage))
        << (measured.channels_last ? ", channels-last" : "") << ": cuDNN forward algorithm " << int(a.cudnn.fwd) << " " << us(a.cudnn.seconds.forward) << ", gradients (data "
        << int(a.cudnn.bwd_data) << ", filter " << int(a.cudnn.bwd_filter) << ") " << us(a.cudnn.seconds.backward);
    if (a.products_timed && measured.channels_last)
        out << "; products forward " << us(a.products.forward) << ", filter gradient " << us(a.products.backward)
            << " (cuDNN's " << us(products_rival(a.cudnn, true)) << "): forward by " << (a.gemm_forward ? "products" : "cuDNN")
            << ", filter gradient by " << (a.gemm_backward ? "products" : "cuDNN");
    else if (a.products_timed)
        out << "; products forward " << us(a.products.forward) << ", gradients " << us(a.products.backward) << ": forward by "
            << (a.gemm_forward ? "products" : "cuDNN") << ", gradients by " << (a.gemm_backward ? "products" : "cuDNN");
    out << (cached ? " (from the tuning cache)" : "") << std::endl;
}
inline std::map<MeasuredConvKey, ConvAlgorithms>& measured_conv_choices()
{
    static std::map<MeasuredConvKey, ConvAlgorithms> choices;
    return choices;
}

// Forgets every timed choice of the process, convolutions' and products' (linear.hpp), and the tuning
// caches read, as a new process would start: for tests. Plans already made keep their algorithms.
// Not while a context chooses.
inline void forget_timed_choices()
{
    std::lock_guard lock(measured_mutex());
    measured_conv_choices().clear();
    measured_gemm_choices().clear();
    forget_tuning_caches();
}

// A convolution's record in the tuning cache. Key: the ConvKey (what the plan is for, element type,
// window, filters, batch) and the options that change what is timed. Value: cuDNN's three algorithms,
// whether the products were timed and which passes they take, then the seconds of cuDNN's forward,
// its two gradients and its input gradient alone, and the products' two passes (as doubles' bits).
inline core::TuningKey conv_tuning_key(const Context& ctx, const MeasuredConvKey& m)
{
    const ConvKey& k = m.conv;
    const core::Window& g = k.g;
    std::vector<std::uint64_t> shape{std::uint64_t(k.use), std::uint64_t(k.storage), m.tf32, m.graphs, m.channels_last, k.n};
    for (int v : {g.c, g.h, g.w, g.kh, g.kw, g.sh, g.sw, g.ph, g.pw, g.oh, g.ow, k.cout}) shape.push_back(std::uint64_t(v));
    return {"convolution", tuning_environment(ctx), std::move(shape)};
}
inline core::TuningValue conv_tuning_value(const ConvAlgorithms& a)
{
    core::TuningValue v{std::uint64_t(a.cudnn.fwd), std::uint64_t(a.cudnn.bwd_data), std::uint64_t(a.cudnn.bwd_filter),
                        a.products_timed, a.gemm_forward, a.gemm_backward};
    for (double s : {a.cudnn.seconds.forward, a.cudnn.seconds.backward, a.cudnn.data_seconds, a.products.forward,
                     a.products.backward})
        v.push_back(std::bit_cast<std::uint64_t>(s));
    return v;
}

// Whether cuDNN lists `algo` among the candidates that can run (its status says so).
template <class Perf>
bool listed(const Perf* perf, int count, std::uint64_t algo)
{
    for (int i = 0; i < count; ++i)
        if (perf[i].status == CUDNN_STATUS_SUCCESS && std::uint64_t(perf[i].algo) == algo) return true;
    return false;
}

// The choice the tuning cache holds for this convolution, if it has one that cuDNN can run now: each
// algorithm among the candidates it lists (`candidates`), every flag 0 or 1, every time a number of
// seconds from 0 to CallTimer::never. A record that is there but fails is refused (refuse_record).
inline std::optional<ConvAlgorithms> cached_conv_choice(const Context& ctx, core::TuningCache& cache,
                                                        const MeasuredConvKey& measured, const CudnnCandidates& candidates)
{
    const std::optional<core::TuningValue> found = cache.find(conv_tuning_key(ctx, measured), tuning_log(ctx));
    if (!found) return std::nullopt;
    const core::TuningValue& v = *found;
    bool usable = v.size() == 11 && v[3] <= 1 && v[4] <= 1 && v[5] <= 1 && listed(candidates.forward, candidates.forward_count, v[0]) &&
                  listed(candidates.data, candidates.data_count, v[1]) && listed(candidates.filter, candidates.filter_count, v[2]);
    double seconds[5] = {};
    for (std::size_t i = 0; usable && i < 5; ++i) {
        seconds[i] = std::bit_cast<double>(v[6 + i]);
        usable = seconds[i] >= 0.0 && seconds[i] <= CallTimer::never;   // NaN fails too
    }
    if (!usable) {
        refuse_record(ctx, cache, "convolution");
        return std::nullopt;
    }
    ConvAlgorithms a;
    a.cudnn.fwd = cudnnConvolutionFwdAlgo_t(v[0]);
    a.cudnn.bwd_data = cudnnConvolutionBwdDataAlgo_t(v[1]);
    a.cudnn.bwd_filter = cudnnConvolutionBwdFilterAlgo_t(v[2]);
    a.products_timed = v[3] != 0;
    a.gemm_forward = v[4] != 0;
    a.gemm_backward = v[5] != 0;
    a.cudnn.seconds = {seconds[0], seconds[1]};
    a.cudnn.data_seconds = seconds[2];
    a.products = {seconds[3], seconds[4]};
    ++tuning_counters().cached;
    return a;
}


// Whether the products are a candidate for a plain convolution of window g in element type T: on
// (channels, pixels) activations always; on channels-last ones where a path forces them, and for
// the timed choice where the input channels are not a multiple of 8. cuDNN's channels-last kernels
// pad those channels to 8 and run on mostly zero filters (an image's 3 channels: 8 x 7 x 7 of them),
// whereas elsewhere they read the activations as they are and the rows would only multiply the
// traffic.
template <core::Storage T>
bool weighs_products(const Context& ctx, const core::Window& g)
{
    return !channels_last<T>(ctx) || ctx.options().conv_path != ConvPath::timed || g.c % 8 != 0;
}

// Which passes of a plain convolution run as products (ConvPath), into p; true if the products were
// timed by this call (to be logged). `timed`: cuDNN's algorithms were timed (ConvPath::timed needs
// that, else cuDNN everywhere).
inline bool choose_products(const Context& ctx, ConvPlan& p, const MeasuredConvKey& measured, bool timed, int cout,
                            std::size_t n, PassSeconds (*products_seconds)(const Context&, int, std::size_t))
{
    const ConvPath path = ctx.options().conv_path;
    if (path != ConvPath::timed || !timed) {
        p.gemm_forward = path == ConvPath::gemm || path == ConvPath::gemm_forward;
        p.gemm_backward = path == ConvPath::gemm || path == ConvPath::gemm_backward;
        return false;
    }
    auto take_choice = [&] {   // the process-wide choice into this plan; false while not timed yet
        std::lock_guard lock(measured_mutex());
        const ConvAlgorithms& a = measured_conv_choices().at(measured);
        p.gemm_forward = a.gemm_forward;
        p.gemm_backward = a.gemm_backward;
        return a.products_timed;
    };
    if (take_choice()) return false;
    // Not under the lock: the products are planned (and timed) under it first. Products that cannot
    // run here (no cuBLASLt algorithm, no memory) are not chosen.
    PassSeconds t{CallTimer::never, CallTimer::never};
    try {
        t = products_seconds(ctx, cout, n);
    } catch (const Error&) {
        cudaGetLastError();
    }
    bool fresh = false;
    {
        std::lock_guard lock(measured_mutex());
        ConvAlgorithms& a = measured_conv_choices().at(measured);
        if (!a.products_timed) {   // each pass on its own; near ties stay with cuDNN, as in CallTimer
            a.products = t;
            a.gemm_forward = CallTimer::clearly_faster(t.forward, a.cudnn.seconds.forward);
            a.gemm_backward = CallTimer::clearly_faster(t.backward, products_rival(a.cudnn, measured.channels_last));
            a.products_timed = true;
            fresh = true;
        }
    }
    take_choice();
    return fresh;
}

// The plan for a convolution of window g with `cout` filters over n samples in element type T, kept
// in the context's plan cache: x (n, g.c, g.h, g.w), w (cout, g.c, g.kh, g.kw), y (n, cout, g.oh,
// g.ow). For a plain convolution (use), products_seconds times its products' passes
// (ProductConv<g>::time<T>), so that ConvPath::timed can choose them. The workspace is grown here,
// not inside a step.
template <core::Storage T = float>
const ConvPlan& conv_plan(const Context& ctx, const core::Window& g, int cout, std::size_t n,
                          ConvKey::Use use = ConvKey::convolution,
                          PassSeconds (*products_seconds)(const Context&, int, std::size_t) = nullptr)
{
    auto& plans = ctx.plan_cache().conv_plans;
    const ConvKey key{g, cout, n, use, storage_of<T>};
    if (auto it = plans.find(key); it != plans.end()) return it->second;

    ConvPlan p;
    describe<T>(ctx, p, g, cout, n);
    const CudnnCandidates candidates(ctx, p);
    const bool det = ctx.options().deterministic;
    // Deterministic mode: cuDNN's choice, the same in every context and every run.
    const bool timed = ctx.options().benchmark && !det;
    const MeasuredConvKey measured{device_kind(ctx), key, ctx.options().allow_tf32, ctx.options().graphs,
                                   channels_last<T>(ctx)};
    core::TuningCache* disk = timed ? tuning_cache(ctx) : nullptr;
    bool fresh = false;    // this call timed something (Options::log, the tuning cache)
    bool cached = false;   // this call took the choice from the tuning cache
    CudnnAlgorithms chosen;
    if (!timed) {
        chosen = cudnn_heuristic(candidates, det);
    } else {
        std::lock_guard lock(measured_mutex());
        auto& choices = measured_conv_choices();
        auto it = choices.find(measured);
        if (it == choices.end()) {
            std::optional<ConvAlgorithms> a = disk ? cached_conv_choice(ctx, *disk, measured, candidates) : std::nullopt;
            cached = a.has_value();
            if (!cached) {
                a.emplace();
                a->cudnn = cudnn_timed(ctx, p, candidates, g, cout, n);
                fresh = true;
            }
            it = choices.emplace(measured, *a).first;
        }
        chosen = it->second.cudnn;
    }
    p.fwd = chosen.fwd;
    p.bwd_data = chosen.bwd_data;
    p.bwd_filter = chosen.bwd_filter;
    if (use == ConvKey::convolution && products_seconds && weighs_products<T>(ctx, g))
        fresh = choose_products(ctx, p, measured, timed, cout, n, products_seconds) || fresh;
    p.workspace = std::max(cudnn_workspace(ctx, p),
                           p.gemm_forward || p.gemm_backward ? gemm_workspace<T>(g, cout, n, channels_last<T>(ctx)) : 0);
    if (fresh && disk) {
        std::lock_guard lock(measured_mutex());
        disk->record(conv_tuning_key(ctx, measured), conv_tuning_value(measured_conv_choices().at(measured)), tuning_log(ctx));
    }
    if ((fresh || cached) && ctx.options().log) {
        std::lock_guard lock(measured_mutex());
        log_choice(*ctx.options().log, measured, measured_conv_choices().at(measured), !fresh);
    }
    ctx.workspace(p.workspace);   // grow now, not inside a step
    return plans.emplace(key, std::move(p)).first->second;
}

// The plan of a convolution layer (conv.hpp) in element type T: for the direct kernels' shapes, the
// cuDNN plan their input gradient (and a forward pass too large for them) uses; otherwise cuDNN's and
// the products'.
template <core::Window g, core::Storage T = float>
const ConvPlan& plan_of(const Context& ctx, int cout, std::size_t n)
{
    if constexpr (direct_conv<g>) return conv_plan<T>(ctx, g, cout, n, ConvKey::direct);
    else return conv_plan<T>(ctx, g, cout, n, ConvKey::convolution, &ProductConv<g>::template time<T>);
}

} // namespace replica::backend::cuda::detail
