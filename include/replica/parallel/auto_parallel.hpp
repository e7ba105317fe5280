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
//
// Given a memory budget (AutoOptions::memory_budget, bytes a device), it counts what each layout
// holds on each device (parallel/memory.hpp: parameters, gradients, optimizer state, activations at
// the batch) and keeps to the layouts that fit: data parallelism, then ZeRO-1 over every device (1/N
// of the optimizer state a device), a TensorParallel over 2 devices (attention and MLPs split; float
// models with something to split), a 2-stage Pipeline (1F1B, cut where the parameters halve; models
// without BatchNorm). Measuring, it times those that fit and keeps the fastest; otherwise it takes the
// first that fits, in that order. A model that fits in no layout is refused with every layout's figures.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "replica/backend/backend.hpp"
#include "replica/core/config.hpp"
#include "replica/core/param_kind.hpp"
#include "replica/model/concepts.hpp"
#include "replica/parallel/data_parallel.hpp"
#include "replica/parallel/memory.hpp"
#include "replica/parallel/pipeline.hpp"
#include "replica/parallel/tensor_parallel.hpp"

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
    // Bytes a device may hold for the model (parallel/memory.hpp), 0: no limit. With a limit, the
    // layouts beyond data parallelism are candidates too, and those that do not fit are left out.
    std::size_t memory_budget = 0;
    std::size_t state_per_param = 2;   // the optimizer's state a trainable parameter (AdamW: 2, SGD: 1)
    std::size_t micro_batches = 4;     // a chosen Pipeline's (PipelineOptions)
};

// The layouts auto_parallel chooses among.
enum class Layout { data, sharded, tensor, pipeline };

// A configuration auto_parallel may choose: a layout over the first `count` devices, with a dispatch
// policy (data parallelism), and what it holds on its fullest device.
struct Candidate {
    std::size_t count;
    DispatchChoice dispatch;
    double rate = 0.0;   // samples per second, measured
    Layout layout = Layout::data;
    DeviceMemory memory{};
};

// "data over 2 devices, threaded", "ZeRO-1 over 4 devices", "tensor-parallel over 2 devices", ...
inline std::string candidate_name(const Candidate& c)
{
    const std::string over = " over " + std::to_string(c.count) + (c.count == 1 ? " device" : " devices");
    switch (c.layout) {
    case Layout::sharded: return "ZeRO-1" + over;
    case Layout::tensor: return "tensor-parallel" + over;
    case Layout::pipeline: return "pipeline" + over;
    default: break;
    }
    if (c.count == 1) return "one device";
    return "data" + over + (c.dispatch == DispatchChoice::threaded ? ", threaded" : ", single");
}

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
// The top-level layer before which a 2-stage Pipeline of M cuts: where the larger stage's parameters
// are fewest, among the cuts that keep every tied head with its embedding; 0 where there is none.
template <class M, std::size_t... I>
consteval std::size_t balanced_cut(std::index_sequence<I...>)
{
    constexpr std::size_t n = sizeof...(I);
    const std::size_t home[] = {M::chain::template param_home<I>..., 0};
    std::size_t best = 0, fewest = std::numeric_limits<std::size_t>::max();
    for (std::size_t c = 1; c < n; ++c) {
        bool together = true;
        for (std::size_t i = 0; i < n; ++i) together = together && ((home[i] < c) == (i < c));
        const std::size_t first = M::chain::param_offset[c], larger = std::max(first, M::param_count - first);
        if (together && larger < fewest) best = c, fewest = larger;
    }
    return best;
}
template <class M>
inline constexpr std::size_t pipeline_cut = balanced_cut<M>(std::make_index_sequence<M::chain::param_offset.size() - 1>{});

// A Pipeline of M exists (no statistics over the batch, a place to cut) and a TensorParallel of M
// (float activations, something to split in two).
template <class M>
inline constexpr bool pipelines = M::syncs == 0 && M::statistics_count == 0 && !M::chain::spans_devices && pipeline_cut<M> > 0;
template <class M>
inline constexpr bool splits = tensor_splits<M, 2>;

// std::variant of the types in Done and those of Maybe that are not void (types: tensor_parallel.hpp).
template <class Done, class... Maybe>
struct variant_of;
template <class... Done>
struct variant_of<types<Done...>> {
    using type = std::variant<Done...>;
};
template <class... Done, class T, class... Rest>
struct variant_of<types<Done...>, T, Rest...>
    : variant_of<std::conditional_t<std::is_void_v<T>, types<Done...>, types<Done..., T>>, Rest...> {};

template <class T>
struct owned : std::false_type {};
template <class T>
struct owned<std::unique_ptr<T>> : std::true_type {};

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
        : impl_(make(std::move(model), std::move(devices), options, chosen_))
    {
        static_assert(model::TrainableModel<AutoParallel>);
    }

    template <class T>
    bool holds() const
    {
        if constexpr (alternative<std::unique_ptr<T>>) return std::holds_alternative<std::unique_ptr<T>>(impl_);
        else if constexpr (alternative<T>) return std::holds_alternative<T>(impl_);
        else return false;
    }
    template <class T>
    T& get()
    {
        if constexpr (alternative<std::unique_ptr<T>>) return *std::get<std::unique_ptr<T>>(impl_);
        else return std::get<T>(impl_);
    }
    // The layout chosen, and what it holds on its fullest device (parallel/memory.hpp).
    Layout layout() const { return chosen_.layout; }
    const DeviceMemory& memory() const { return chosen_.memory; }
    // Every layout it may choose over `count` devices under `options` (without measuring them), each
    // with what its fullest device holds.
    static std::vector<Candidate> layouts(std::size_t count, const AutoOptions& options) { return candidates_for(count, options); }

    // Every call goes to the model chosen: the training contract (model/concepts.hpp), as it has it.
    // "cpu:0" or "DataParallel<threaded> over cpu:0,cpu:1"
    std::string description() const { return with([](const auto& m) { return m.description(); }); }
    std::size_t replica_count() const { return with([](const auto& m) { return m.replica_count(); }); }
    // The activation memory of one replica (Sequential::activation_bytes); of a pipeline's or
    // tensor-parallel model's fullest device.
    std::size_t activation_bytes() const
    {
        return with([](const auto& m) -> std::size_t {
            if constexpr (requires { m.activation_bytes().size(); }) {
                std::size_t most = 0;
                for (std::size_t b : m.activation_bytes()) most = std::max(most, b);
                return most;
            } else {
                return m.activation_bytes();
            }
        });
    }
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
        return with([&](auto& m) -> double {
            if constexpr (refuses<std::remove_cvref_t<decltype(m)>, Opt>) refuse_whole_gradient(m.description());
            else return m.step(in, opt, next);
        });
    }
    double reproducible_forward_backward(const model::Pass& pass, const input_element* x, const std::int32_t* labels,
                                         std::size_t n, float scale, std::size_t shard)
    {
        return with([&](auto& m) { return m.reproducible_forward_backward(pass, x, labels, n, scale, shard); });
    }
    template <class Opt>
    void update(const Opt& opt)
    {
        with([&](auto& m) {
            if constexpr (refuses<std::remove_cvref_t<decltype(m)>, Opt>) refuse_whole_gradient(m.description());
            else m.update(opt);
        });
    }
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
    // The layouts beyond data parallelism, where M has them (they do not move: held by pointer).
    using PipelineLayout = Pipeline<M, Cuts<detail::pipeline_cut<M>>, OneFOneB>;
    using TensorLayout = TensorParallel<M, 2>;
    using Impl = typename detail::variant_of<detail::types<M, Single, DataParallel<M, Threaded>>,
                                             std::conditional_t<detail::pipelines<M>, std::unique_ptr<PipelineLayout>, void>,
                                             std::conditional_t<detail::splits<M>, std::unique_ptr<TensorLayout>, void>>::type;

    template <class T>
    static constexpr bool alternative = []<class... A>(std::type_identity<std::variant<A...>>) {
        return (std::is_same_v<T, A> || ...);
    }(std::type_identity<Impl>{});

    // The one way a call reaches the model chosen.
    template <class F>
    decltype(auto) with(F&& f)
    {
        return std::visit([&](auto& m) -> decltype(auto) {
            if constexpr (detail::owned<std::remove_cvref_t<decltype(m)>>::value) return f(*m);
            else return f(m);
        }, impl_);
    }
    template <class F>
    decltype(auto) with(F&& f) const
    {
        return std::visit([&](const auto& m) -> decltype(auto) {
            if constexpr (detail::owned<std::remove_cvref_t<decltype(m)>>::value) return f(std::as_const(*m));
            else return f(m);
        }, impl_);
    }
    // An optimizer that looks at the whole gradient without saying how to look at it in parts (an
    // Accumulate of a LossScale, model::UpdatesInParts) cannot update a Pipeline or TensorParallel
    // yet: an Error at run time there (the other layouts take it), not a compile error for every model.
    template <class L, class Opt>
    static constexpr bool refuses = (is_pipeline<L>::value || is_tensor_parallel<L>::value) &&
                                    !model::UpdatesInParts<Opt, backend::cpu::Context>;
    [[noreturn]] static void refuse_whole_gradient(const std::string& chosen)
    {
        throw Error("auto_parallel chose " + chosen + " to fit its memory budget, which cannot take an optimizer that "
                    "looks at the whole gradient without saying how to look at it in parts (an Accumulate of a "
                    "LossScale) yet: wrap the Accumulate in the LossScale, or give a budget that data parallelism fits");
    }

    static Impl make(M&& model, std::vector<Device> devices, AutoOptions o, Candidate& chosen)
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
        std::vector<Candidate> candidates = candidates_for(devices.size(), o);
        if (o.memory_budget > 0) {
            std::vector<Candidate> fit;
            std::string figures;
            for (const Candidate& c : candidates) {
                figures += (figures.empty() ? "" : "; ") + candidate_name(c) + " " + bytes_text(c.memory.total()) + " (model " +
                           bytes_text(c.memory.model) + ", optimizer " + bytes_text(c.memory.optimizer) + ", activations " +
                           bytes_text(c.memory.activations) + ")";
                if (c.memory.total() <= o.memory_budget) fit.push_back(c);
            }
            core::require(!fit.empty(), "auto_parallel: no layout fits the memory budget of " + bytes_text(o.memory_budget) +
                                            " a device at a batch of " + std::to_string(o.batch_size) + " (" + figures +
                                            "): raise AutoOptions::memory_budget, lower the batch size, or give more devices");
            if (o.log && (o.dispatch != DispatchChoice::measured || fit.size() == 1))
                *o.log << "auto_parallel: a device holds, at most: " << figures << "; budget " << bytes_text(o.memory_budget)
                       << "; chose " << candidate_name(first_of(fit, devices.size(), o)) << std::endl;
            candidates = std::move(fit);
        }
        if (o.dispatch == DispatchChoice::measured) chosen = measure(model, devices, o, candidates);
        else chosen = first_of(candidates, devices.size(), o);
        devices.erase(devices.begin() + std::ptrdiff_t(chosen.count), devices.end());
        if (chosen.layout == Layout::data && chosen.count > 1) o.dispatch = chosen.dispatch;
        return build(std::move(model), std::move(devices), o, chosen);
    }

    // Samples a replica of a candidate trains on, and the replicas it has.
    static std::size_t replicas(const Candidate& c) { return c.layout == Layout::data || c.layout == Layout::sharded ? c.count : 1; }
    static std::size_t replica_batch(const Candidate& c, const AutoOptions& o)
    {
        const std::size_t n = global_batch(o.batch_size, replicas(c), o.scaling), r = replicas(c);
        return (n + r - 1) / r;
    }

    // Every layout auto_parallel may take over up to `count` devices, with what its fullest device
    // holds: data parallelism over 1 .. count devices (each dispatch policy), and with a memory budget
    // ZeRO-1 over every device, then the 2-device tensor-parallel and pipeline layouts M has.
    static std::vector<Candidate> candidates_for(std::size_t count, const AutoOptions& o)
    {
        const std::size_t spp = o.state_per_param, m = std::max<std::size_t>(1, o.micro_batches);
        auto with_memory = [&](Candidate c) {
            const std::size_t n = replica_batch(c, o);
            switch (c.layout) {
            case Layout::data: c.memory = memory_of<M>(n, 1, spp, M::trainable_count); break;
            case Layout::sharded: c.memory = memory_of<M>(n, 1, spp, (M::trainable_count + c.count - 1) / c.count); break;
            case Layout::tensor:
                if constexpr (detail::splits<M>) {
                    using S = typename TensorLayout::shard_type;
                    c.memory = memory_of<S>(n, 1, spp, S::trainable_count);
                }
                break;
            case Layout::pipeline:
                if constexpr (detail::pipelines<M>) {
                    const std::size_t micro = (n + m - 1) / m;
                    core::static_for<2>([&](auto s) {
                        using S = typename PipelineLayout::template stage_type<s>;
                        const DeviceMemory d = memory_of<S>(micro, OneFOneB::slots(s, 2, m), spp, S::trainable_count);
                        if (d.total() > c.memory.total()) c.memory = d;
                    });
                }
                break;
            }
            return c;
        };
        std::vector<Candidate> c{with_memory({1, DispatchChoice::single})};
        for (std::size_t k = 2; k <= count; ++k)
            for (DispatchChoice d : {DispatchChoice::single, DispatchChoice::threaded})
                if (single_allowed || d != DispatchChoice::single) c.push_back(with_memory({.count = k, .dispatch = d}));
        if (o.memory_budget > 0 && count >= 2 && o.data_parallel.processes == nullptr) {
            c.push_back(with_memory({.count = count, .dispatch = DispatchChoice::threaded, .layout = Layout::sharded}));
            if constexpr (detail::splits<M>)
                c.push_back(with_memory({.count = 2, .dispatch = DispatchChoice::threaded, .layout = Layout::tensor}));
            if constexpr (detail::pipelines<M>)
                c.push_back(with_memory({.count = 2, .dispatch = DispatchChoice::threaded, .layout = Layout::pipeline}));
        }
        return c;
    }

    // Without measuring: data parallelism over every device with the dispatch asked for, or else the
    // first layout in the list (data, ZeRO-1, tensor, pipeline) that is in it.
    static Candidate first_of(const std::vector<Candidate>& candidates, std::size_t count, const AutoOptions& o)
    {
        const DispatchChoice asked = count == 1 ? DispatchChoice::single : o.dispatch;
        for (const Candidate& c : candidates)
            if (c.layout == Layout::data && c.count == count && (c.dispatch == asked || count == 1)) return c;
        for (Layout l : {Layout::data, Layout::sharded, Layout::tensor, Layout::pipeline})
            for (const Candidate& c : candidates)
                if (c.layout == l) return c;
        return candidates.front();
    }

    static Impl build(M&& model, std::vector<Device> devices, const AutoOptions& o, const Candidate& c)
    {
        if (c.layout == Layout::sharded) {
            DataParallelOptions sharded = o.data_parallel;
            sharded.shard = Shard::optimizer_state;
            return Impl(std::in_place_index<2>, std::move(model), std::move(devices), sharded);
        }
        if (c.layout == Layout::tensor || c.layout == Layout::pipeline) {
            auto moved = [&](auto layout) {
                layout->set_parameters(model.parameters());
                layout->set_statistics(model.statistics());
                layout->set_optimizer_state(model.optimizer_state());
                return Impl(std::move(layout));
            };
            if constexpr (detail::splits<M>)
                if (c.layout == Layout::tensor) return moved(std::make_unique<TensorLayout>(devices));
            if constexpr (detail::pipelines<M>)
                if (c.layout == Layout::pipeline)
                    return moved(std::make_unique<PipelineLayout>(devices, 0, PipelineOptions{.micro_batches = o.micro_batches}));
            throw Error("auto_parallel: " + candidate_name(c) + " does not exist for this model");
        }
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
    static Candidate measure(const M& model, const std::vector<Device>& devices, const AutoOptions& o,
                             std::vector<Candidate> candidates)
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

        auto time = [&](Candidate& c) {
            M copy{devices.front()};
            copy.set_parameters(w);
            copy.set_statistics(stats);
            AutoOptions ok = o;
            ok.dispatch = c.dispatch;
            Impl candidate = build(std::move(copy), {devices.begin(), devices.begin() + std::ptrdiff_t(c.count)}, ok, c);
            const std::size_t n = global_batch(o.batch_size, replicas(c), o.scaling);
            c.rate = std::max(c.rate, double(n) / time_steps(candidate, x.data(), labels.data(), n, o.steps));
        };
        if (candidates.size() > 1) {
            for (auto& c : candidates) time(c);
            for (auto c = candidates.rbegin(); c != candidates.rend(); ++c) time(*c);
        }

        const Candidate* best = &candidates[choose(candidates, o.margin)];
        if (candidates.size() == 1) {
            if (o.log)
                *o.log << "auto_parallel: " << (best->layout == Layout::data && best->count == 1 ? "one device (" + devices.front().name() + ")"
                                                                                            : candidate_name(*best))
                       << ", nothing to measure" << std::endl;
            return *best;
        }
        // Data parallelism as "2 threaded", the other layouts by name.
        auto name = [](const Candidate& c) {
            if (c.layout != Layout::data) return candidate_name(c);
            return std::to_string(c.count) +
                   (c.count == 1 ? " device" : c.dispatch == DispatchChoice::threaded ? " threaded" : " single");
        };
        std::string report = "auto_parallel measured (samples/s):";
        for (const auto& c : candidates) report += " " + name(c) + " " + std::to_string(long(c.rate));
        if (o.log)
            *o.log << report << "; chose "
                   << (best->layout != Layout::data ? candidate_name(*best)
                                                    : std::to_string(best->count) + (best->count == 1 ? " device" : " devices") +
                                                          (best->count == 1 ? "" : "," + name(*best).substr(1)))
                   << (best->count > 1 || best->layout != Layout::data
                           ? ""
                           : " (more devices were not faster by " + std::to_string(int(o.margin * 100)) + "%)")
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
            std::visit([&](auto& model) {
                if constexpr (detail::owned<std::remove_cvref_t<decltype(model)>>::value)
                    model->step(in, opt, i + 1 < warmup + steps ? &next : nullptr);
                else
                    model.step(in, opt, i + 1 < warmup + steps ? &next : nullptr);
            }, m);
            if (i >= warmup) t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        std::sort(t.begin(), t.end());
        return t[t.size() / 2];
    }

    Candidate chosen_{1, DispatchChoice::single};   // before impl_: make() sets it
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
using parallel::Layout;
} // namespace replica
