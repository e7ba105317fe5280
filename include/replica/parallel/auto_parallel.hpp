#pragma once
// auto_parallel(model, devices): data parallelism without writing DataParallel.
//
//   auto model = auto_parallel(LeNet{});           // every GPU, or the CPU
//
// Returns the model itself, unwrapped (type M), when
//   - it already contains a DataParallel anywhere: the user took control (decided at compile time);
//   - disable_auto_data_parallelism<M> is true:
//       template <> inline constexpr bool disable_auto_data_parallelism<MyNet> = true;
// Otherwise returns AutoParallel<M>: on one device the model itself, on several a DataParallel<M, P>
// with the dispatch policy P that AutoOptions names, or the fastest of all of them when it says
// DispatchChoice::measured; the choice is made once, at construction.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <span>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "replica/backend/backend.hpp"
#include "replica/core/config.hpp"
#include "replica/core/param_kind.hpp"
#include "replica/parallel/data_parallel.hpp"
#include "replica/model/concepts.hpp"

namespace REPLICA_NAMESPACE {
// Opt-out: specialise to true for a model that must never be wrapped automatically.
template <class M>
inline constexpr bool disable_auto_data_parallelism = false;
} // namespace replica

namespace REPLICA_NAMESPACE::parallel {

template <class M>
constexpr bool contains_data_parallel_()
{
    if constexpr (is_data_parallel<M>::value) return true;
    else return M::chain::spans_devices;
}
template <class M>
inline constexpr bool contains_data_parallel = contains_data_parallel_<M>();

template <class M>
inline constexpr bool wraps_automatically = !contains_data_parallel<M> && !disable_auto_data_parallelism<M>;

// How auto_parallel runs replicas: a policy, or `measured`: time a few training steps of every
// candidate (1 device; 2..N devices with each policy) on synthetic data and keep the fastest, in
// samples per second, preferring fewer devices unless more are faster by a margin. With strong
// scaling the 1-device candidate runs the same global batch, so the choice is never slower than one
// device (as far as timing a few steps can tell).
enum class DispatchChoice { single, threaded, measured };

inline DispatchChoice parse_dispatch(std::string_view text)
{
    if (text == "single") return DispatchChoice::single;
    if (text == "threaded") return DispatchChoice::threaded;
    if (text == "auto") return DispatchChoice::measured;
    throw Error("bad dispatch '" + std::string(text) + "': write single, threaded or auto (measure and choose)");
}

struct AutoOptions {
    DispatchChoice dispatch = DispatchChoice::single;
    DataParallelOptions data_parallel = {};
    // For DispatchChoice::measured:
    std::size_t batch_size = 64;      // as the Trainer will use it (global with strong scaling)
    Scaling scaling = Scaling::strong;
    std::size_t steps = 5;            // timed steps per candidate (twice), after two untimed steps
    double margin = 0.05;             // how much faster more devices must be to be chosen
    std::ostream* log = &std::cerr;   // one line: every candidate's speed and the choice
};

// A configuration auto_parallel measures: the first `count` devices, with a dispatch policy.
struct Candidate {
    std::size_t count;
    DispatchChoice dispatch;
    double rate = 0.0;   // samples per second, measured
};

// The index of the chosen candidate (candidates[0] is the 1-device one): the fastest of those that
// beat every candidate with fewer devices by `margin` (and the 1-device one), so more devices are
// taken only when they clearly pay.
inline std::size_t choose(std::span<const Candidate> candidates, double margin)
{
    std::size_t best = 0;
    for (std::size_t i = 1; i < candidates.size(); ++i) {
        double fewer = 0.0;
        for (const auto& c : candidates)
            if (c.count < candidates[i].count) fewer = std::max(fewer, c.rate);
        if (candidates[i].rate > fewer * (1.0 + margin) && candidates[i].rate > candidates[best].rate) best = i;
    }
    return best;
}

namespace detail {
// The update of a timed step: plain gradient descent at a rate too small to matter (the backend's
// SGD kernel: the same passes over memory as SGD without momentum). The caller's own optimizer is
// not known when auto_parallel measures.
struct TimingUpdate {
    static constexpr std::size_t state_per_param = 1;
    template <class Ctx>
    void apply(Ctx& ctx, float* w, const float* g, float* v, std::span<const core::ParamSegment> segments,
               core::GradientAt at = core::GradientAt::params) const
    {
        sgd_update(ctx, w, g, v, segments, at, 1e-6f, 0.0f, 0.0f, false);
    }
};
} // namespace detail

template <class M>
class AutoParallel {
public:
    using replica_type = M;
    using input_shape = typename M::input_shape;
    using input_element = typename M::input_element;
    using output_shape = typename M::output_shape;
    using loss = typename M::loss;
    using Evaluation = model::Evaluation;
    static constexpr std::size_t param_count = M::param_count;
    using param_rule = typename M::param_rule;
    using update_plan = typename M::update_plan;
    static constexpr std::size_t trainable_count = M::trainable_count;
    static constexpr std::size_t statistics_count = M::statistics_count;
    static constexpr std::size_t label_size = M::label_size;

    AutoParallel(M&& model, std::vector<Device> devices, AutoOptions options = {})
        : impl_(make(std::move(model), std::move(devices), options))
    {
        static_assert(model::TrainableModel<AutoParallel>);
    }

    template <class T>
    bool holds() const { return std::holds_alternative<T>(impl_); }
    template <class T>
    T& get() { return std::get<T>(impl_); }

    // Every call goes to the model chosen: the training contract (model/concepts.hpp), as it has it.
    // "cpu:0" or "DataParallel<threaded> over cpu:0,cpu:1"
    std::string description() const { return with([](const auto& m) { return m.description(); }); }
    std::size_t replica_count() const { return with([](const auto& m) { return m.replica_count(); }); }
    // The activation memory of one replica (Sequential::activation_bytes).
    std::size_t activation_bytes() const { return with([](const auto& m) { return m.activation_bytes(); }); }
    std::size_t global_replica_count() const { return with([](const auto& m) { return m.global_replica_count(); }); }
    int process_rank() const { return with([](const auto& m) { return m.process_rank(); }); }
    // The chosen DataParallel's (DataParallelOptions::gradient_reduction); one model reduces nothing: fp32.
    GradientReduction gradient_reduction() const
    {
        return with([](const auto& m) {
            if constexpr (requires { m.gradient_reduction(); }) return m.gradient_reduction();
            else return GradientReduction::fp32;
        });
    }
    // See DataParallel::process_share; one model in one process trains on every sample.
    Share process_share(std::size_t n, std::size_t shard) const
    {
        return with([&](const auto& m) -> Share {
            if constexpr (requires { m.process_share(n, shard); }) return m.process_share(n, shard);
            else return {0, n};
        });
    }

    std::vector<float> parameters() const { return with([](const auto& m) { return m.parameters(); }); }
    std::vector<float> optimizer_state() const { return with([](const auto& m) { return m.optimizer_state(); }); }
    void set_parameters(std::span<const float> w) { with([&](auto& m) { m.set_parameters(w); }); }
    void set_optimizer_state(std::span<const float> s) { with([&](auto& m) { m.set_optimizer_state(s); }); }
    std::vector<float> statistics() const { return with([](const auto& m) { return m.statistics(); }); }
    void set_statistics(std::span<const float> s) { with([&](auto& m) { m.set_statistics(s); }); }

    double forward_backward(const model::Pass& pass, const input_element* x, const std::int32_t* labels, std::size_t n, float scale)
    {
        return with([&](auto& m) { return m.forward_backward(pass, x, labels, n, scale); });
    }
    template <class Opt>
    double step(const model::StepInput<input_element>& in, const Opt& opt, const model::StepInput<input_element>* next = nullptr)
    {
        return with([&](auto& m) { return m.step(in, opt, next); });
    }
    double reproducible_forward_backward(const model::Pass& pass, const input_element* x, const std::int32_t* labels,
                                         std::size_t n, float scale, std::size_t shard)
    {
        return with([&](auto& m) { return m.reproducible_forward_backward(pass, x, labels, n, scale, shard); });
    }
    template <class Opt>
    void update(const Opt& opt) { with([&](auto& m) { m.update(opt); }); }
    Evaluation evaluate(const input_element* x, const std::int32_t* labels, std::size_t n)
    {
        return with([&](auto& m) { return m.evaluate(x, labels, n); });
    }
    void predict(const input_element* x, std::size_t n, float* out) { with([&](auto& m) { m.predict(x, n, out); }); }

private:
    // A model with sync points (BatchNorm over the global batch) has no SingleThread form
    // (parallel/dispatch.hpp): the dispatch it asks for is then Threaded.
    static constexpr bool single_allowed = M::syncs == 0;
    using Single = std::conditional_t<single_allowed, DataParallel<M, SingleThread>, DataParallel<M, Threaded>>;
    using Impl = std::variant<M, Single, DataParallel<M, Threaded>>;

    // The one way a call reaches the model chosen.
    template <class F>
    decltype(auto) with(F&& f) { return std::visit(std::forward<F>(f), impl_); }
    template <class F>
    decltype(auto) with(F&& f) const { return std::visit(std::forward<F>(f), impl_); }

    static Impl make(M&& model, std::vector<Device> devices, AutoOptions o)
    {
        core::require(!devices.empty(), "auto_parallel needs at least one device");
        if (!single_allowed && o.dispatch == DispatchChoice::single) o.dispatch = DispatchChoice::threaded;
        if (o.dispatch == DispatchChoice::measured && o.data_parallel.processes != nullptr) {
            // Every process must make the same choice, and timing them apart would not say what they
            // do together: this process's devices, one thread each.
            if (o.log && o.data_parallel.processes->rank() == 0)
                *o.log << "auto_parallel: several processes, so no measuring: every process's devices, threaded"
                       << std::endl;
            o.dispatch = DispatchChoice::threaded;
        }
        if (o.dispatch == DispatchChoice::measured) {
            const Candidate chosen = measure(model, devices, o);
            devices.erase(devices.begin() + std::ptrdiff_t(chosen.count), devices.end());
            o.dispatch = chosen.dispatch;
        }
        return build(std::move(model), std::move(devices), o);
    }

    static Impl build(M&& model, std::vector<Device> devices, const AutoOptions& o)
    {
        if (devices.size() == 1 && o.data_parallel.processes == nullptr) {
            if (model.device() == devices.front()) return Impl(std::in_place_index<0>, std::move(model));
            M moved{devices.front()};
            moved.set_parameters(model.parameters());
            moved.set_statistics(model.statistics());
            moved.set_optimizer_state(model.optimizer_state());
            return Impl(std::in_place_index<0>, std::move(moved));
        }
        if (o.dispatch == DispatchChoice::threaded)
            return Impl(std::in_place_index<2>, std::move(model), std::move(devices), o.data_parallel);
        return Impl(std::in_place_index<1>, std::move(model), std::move(devices), o.data_parallel);
    }

    // Samples per second of every candidate; returns the chosen one. Every candidate
    // is timed twice, in forward and then in reverse order, and keeps its better figure, so neither the
    // first candidate's cold start nor drift in the machine's speed decides. More devices must beat
    // every candidate with fewer by AutoOptions::margin: when it is close, fewer devices win.
    static Candidate measure(const M& model, const std::vector<Device>& devices, const AutoOptions& o)
    {
        core::require(o.batch_size > 0 && o.steps > 0, "auto_parallel: measuring needs a batch size and steps");
        const auto w = model.parameters();
        const auto stats = model.statistics();
        const std::size_t most = global_batch(o.batch_size, devices.size(), o.scaling);
        std::vector<input_element> x(most * M::input_shape::size);   // token ids: 0
        std::vector<std::int32_t> labels(most * M::label_size);
        if constexpr (!M::reads_tokens)
            for (std::size_t i = 0; i < x.size(); ++i)
                x[i] = 2.0f * core::random_uniform(0, core::Stream::synthetic, 0, i >> 16, std::uint32_t(i & 0xffff)) - 1.0f;
        for (std::size_t i = 0; i < labels.size(); ++i)
            labels[i] = std::int32_t(core::random_bits(0, core::Stream::synthetic, 1, i, 0) %
                                     M::loss::template classes<typename M::output_shape>);

        std::vector<Candidate> candidates{{1, DispatchChoice::single}};
        for (std::size_t k = 2; k <= devices.size(); ++k)
            for (DispatchChoice d : {DispatchChoice::single, DispatchChoice::threaded})
                if (single_allowed || d != DispatchChoice::single) candidates.push_back({.count = k, .dispatch = d});
        auto time = [&](Candidate& c) {
            M copy{devices.front()};
            copy.set_parameters(w);
            copy.set_statistics(stats);
            AutoOptions ok = o;
            ok.dispatch = c.dispatch;
            Impl candidate = build(std::move(copy), {devices.begin(), devices.begin() + std::ptrdiff_t(c.count)}, ok);
            const std::size_t n = global_batch(o.batch_size, c.count, o.scaling);
            c.rate = std::max(c.rate, double(n) / time_steps(candidate, x.data(), labels.data(), n, o.steps));
        };
        if (candidates.size() > 1) {
            for (auto& c : candidates) time(c);
            for (auto c = candidates.rbegin(); c != candidates.rend(); ++c) time(*c);
        }

        const Candidate* best = &candidates[choose(candidates, o.margin)];
        if (candidates.size() == 1) {
            if (o.log) *o.log << "auto_parallel: one device (" << devices.front().name() << "), nothing to measure" << std::endl;
            return *best;
        }
        std::string report = "auto_parallel measured (samples/s):";
        auto name = [](const Candidate& c) {
            return c.count == 1 ? std::string(" device")
                                : std::string(c.dispatch == DispatchChoice::threaded ? " threaded" : " single");
        };
        for (const auto& c : candidates) report += " " + std::to_string(c.count) + name(c) + " " + std::to_string(long(c.rate));
        if (o.log)
            *o.log << report << "; chose " << best->count << (best->count == 1 ? " device" : " devices")
                   << (best->count == 1 ? "" : "," + name(*best))
                   << (best->count > 1 ? "" : " (more devices were not faster by " +
                                                                            std::to_string(int(o.margin * 100)) + "%)")
                   << std::endl;
        return *best;
    }

    // Median seconds of a training step (after two untimed steps), updates included.
    static double time_steps(Impl& m, const input_element* x, const std::int32_t* labels, std::size_t n, std::size_t steps)
    {
        constexpr std::size_t warmup = 2;
        const detail::TimingUpdate opt;
        std::vector<double> t;
        for (std::size_t i = 0; i < warmup + steps; ++i) {
            const auto t0 = std::chrono::steady_clock::now();
            // Each step queues the next one ahead, as train_step with the next batch does.
            const auto input = [&](std::size_t k) {
                return model::StepInput<input_element>{model::Pass{.first_sample = k * n}, x, labels, n, 1.0f / float(n)};
            };
            const model::StepInput<input_element> in = input(i), next = input(i + 1);
            std::visit([&](auto& model) { model.step(in, opt, i + 1 < warmup + steps ? &next : nullptr); }, m);
            if (i >= warmup) t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        std::sort(t.begin(), t.end());
        return t[t.size() / 2];
    }

    Impl impl_;
};

template <class M>
auto auto_parallel(M&& model, std::vector<Device> devices = backend::default_devices(), AutoOptions options = {})
{
    using T = std::remove_cvref_t<M>;
    static_assert(!std::is_lvalue_reference_v<M>,
                  "auto_parallel takes the model by value: pass std::move(model) or a temporary");
    if constexpr (!wraps_automatically<T>) return T(std::move(model));
    else return AutoParallel<T>(std::move(model), std::move(devices), options);
}

} // namespace replica::parallel

namespace REPLICA_NAMESPACE {
using parallel::AutoOptions;
using parallel::AutoParallel;
using parallel::auto_parallel;
using parallel::DispatchChoice;
} // namespace replica
