#pragma once
// Pipeline<M, Cuts<I...>, Schedule>: model M (a Sequential) cut before its top-level layers I... into
// consecutive stages, stage s on devices[s], trained as one model.
//
//   using Piped = Pipeline<models::CharGPT, Cuts<4>, OneFOneB>;     // layers 0-3 | 4-
//   Piped model{{Device::cpu(0), Device::cpu(1)}, 0, {.micro_batches = 8}};
//   float loss = train_step(model, opt, batch);                      // same API as M
//
// Each step cuts the batch into micro-batches (PipelineOptions::micro_batches, uneven splits allowed).
// Stage s is a Stage (model/stage.hpp) of M's layers between two cuts, with M's layer ids, so that it
// starts from M's parameters and draws M's random numbers (dropout is keyed on the global sample). A
// stage runs on a thread of its own through its schedule: the forward of micro-batch i (F i) after
// the stage before it has handed over i's activations, the backward (B i) after the stage after it
// has handed back their gradient; the hand-off is a copy on the stage's own device (from the host, another
// GPU or a GPU shared with other stages), ordered after the producer's work by an event. A stage's
// micro-batch gradients are summed into its gradient in micro-batch order, so the result equals M's
// up to float summation order, on any devices.
//
// The schedules (which F and B each stage runs, in what order; how many micro-batches each keeps in
// flight, i.e. its activation slots):
//   GPipe     every F, then every B: m slots a stage.
//   OneFOneB  stage s runs p - s - 1 F first, then alternates F and B, then the remaining B: at most
//             p - s slots, so the activation memory does not grow with m. Same bubble as GPipe,
//             (p - 1) / (m + p - 1) of a step.
//
// Parameters, optimizer state and checkpoints are M's: parameters() is the stages' concatenation,
// M's flat vector. An optimizer that looks at the whole gradient looks at the stages' parts
// (model::update_in_parts): ClipGradNorm's norm is summed over the stages on the host, LossScale
// skips every stage's update when any stage's gradient is not finite, an Accumulate of a ClipGradNorm
// clips each window's mean by the norm over the stages. Not yet: BatchNorm (its statistics are over
// the batch, not a micro-batch), an Accumulate of a LossScale, the reproducible mode, and a tied head
// cut away from its embedding; each is refused with a message.

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <mutex>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "replica/backend/backend.hpp"
#include "replica/core/config.hpp"
#include "replica/core/error.hpp"
#include "replica/core/event.hpp"
#include "replica/core/loss_slot.hpp"
#include "replica/core/meta.hpp"
#include "replica/model/concepts.hpp"
#include "replica/model/sequential.hpp"
#include "replica/model/state_planes.hpp"
#include "replica/parallel/layout.hpp"
#include "replica/parallel/scaling.hpp"
#include "replica/parallel/worker_pool.hpp"

namespace REPLICA_NAMESPACE::parallel {

// Where a Pipeline cuts its model: before each of these top-level layers (indices after Input).
template <std::size_t... I>
struct Cuts {};

// One step of a stage's schedule: the forward or the backward of micro-batch `micro`.
struct PipelineTask {
    bool backward;
    std::size_t micro;
};

struct GPipe {
    static constexpr const char* name = "GPipe";
    // Stage s of p over m micro-batches: its tasks in order, and how many activation slots it needs.
    static std::vector<PipelineTask> tasks(std::size_t /*s*/, std::size_t /*p*/, std::size_t m)
    {
        std::vector<PipelineTask> t;
        for (std::size_t i = 0; i < m; ++i) t.push_back({false, i});
        for (std::size_t i = 0; i < m; ++i) t.push_back({true, i});
        return t;
    }
    static std::size_t slots(std::size_t /*s*/, std::size_t /*p*/, std::size_t m) { return m; }
};

struct OneFOneB {
    static constexpr const char* name = "1F1B";
    static std::vector<PipelineTask> tasks(std::size_t s, std::size_t p, std::size_t m)
    {
        std::vector<PipelineTask> t;
        const std::size_t warmup = std::min(m, p - s - 1);
        std::size_t f = 0, b = 0;
        for (; f < warmup; ++f) t.push_back({false, f});
        for (; f < m; ++f, ++b) {
            t.push_back({false, f});
            t.push_back({true, b});
        }
        for (; b < m; ++b) t.push_back({true, b});
        return t;
    }
    static std::size_t slots(std::size_t s, std::size_t p, std::size_t m) { return std::min(m, p - s); }
};

template <class S>
concept PipelineSchedule = requires(std::size_t n) {
    { S::name } -> std::convertible_to<const char*>;
    { S::tasks(n, n, n) } -> std::same_as<std::vector<PipelineTask>>;
    { S::slots(n, n, n) } -> std::convertible_to<std::size_t>;
};

// The last step's time, and the part of it each stage spent computing (CPU devices) or queueing its
// work (GPUs: the host's part, not the device's); idle_fraction() is the bubble: 1 - the stages' busy
// time over stage_count x the step's.
struct PipelineTimes {
    double step_seconds = 0.0;
    std::vector<double> busy_seconds;   // one a stage
    double idle_fraction() const
    {
        double busy = 0.0;
        for (double b : busy_seconds) busy += b;
        return busy_seconds.empty() || step_seconds <= 0.0 ? 0.0 : 1.0 - busy / (double(busy_seconds.size()) * step_seconds);
    }
};

struct PipelineOptions {
    // Micro-batches a step (fewer when the batch has fewer samples).
    std::size_t micro_batches = 4;
};

namespace detail {
template <class... Ts>
struct list {};

template <std::size_t B, std::size_t E, class L, class Done = list<>, std::size_t I = 0>
struct slice_of;
template <std::size_t B, std::size_t E, class... Done, std::size_t I>
struct slice_of<B, E, list<>, list<Done...>, I> {
    using type = list<Done...>;
};
template <std::size_t B, std::size_t E, class L, class... Ls, class... Done, std::size_t I>
struct slice_of<B, E, list<L, Ls...>, list<Done...>, I>
    : slice_of<B, E, list<Ls...>, std::conditional_t<(I >= B && I < E), list<Done..., L>, list<Done...>>, I + 1> {};

template <class S>
struct input_of_shape;
template <std::size_t... D>
struct input_of_shape<Shape<D...>> {
    using type = model::Input<D...>;
};

template <class M>
struct entries_of;
template <class... E>
struct entries_of<model::Sequential<E...>> {
    using type = model::detail::entries<E...>;
};

template <class Storage, class Rule, class In, class Layers, class Loss, bool Last>
struct stage_model;
template <class Storage, class Rule, class In, class... Ls, class Loss, bool Last>
struct stage_model<Storage, Rule, In, list<Ls...>, Loss, Last> {
    using plain = std::conditional_t<Last, model::Sequential<model::ParamRule<Rule>, In, Ls..., Loss>,
                                     model::Sequential<model::ParamRule<Rule>, In, Ls...>>;
    using type = model::with_precision<plain, Storage>;
};

// Where stage S begins among Total layers cut before Cut...: 0, Cut..., Total.
template <std::size_t S, std::size_t Total, std::size_t... Cut>
inline constexpr std::size_t bound = std::array<std::size_t, sizeof...(Cut) + 2>{0, Cut..., Total}[S];

template <class L>
struct size_of_list;
template <class... Ls>
struct size_of_list<list<Ls...>> : std::integral_constant<std::size_t, sizeof...(Ls)> {};

template <class T>
struct as_list;
template <class... Ls>
struct as_list<model::detail::type_list<Ls...>> {
    using type = list<Ls...>;
};
} // namespace detail

template <class M, class C, PipelineSchedule Schedule = OneFOneB>
class Pipeline;

template <class M, std::size_t... Cut, PipelineSchedule Schedule>
class Pipeline<M, Cuts<Cut...>, Schedule> : public LayoutOf<M, Pipeline<M, Cuts<Cut...>, Schedule>> {
    static_assert(model::is_sequential<M>::value, "Pipeline<M, Cuts<...>>: M must be a model, a Sequential<Input<...>, ...>");
    using entries = typename detail::entries_of<M>::type;
    using layers = typename detail::as_list<typename entries::layers>::type;
    static constexpr std::size_t layer_total = detail::size_of_list<layers>::value;
    static constexpr std::size_t P = sizeof...(Cut) + 1;
    static constexpr std::array<std::size_t, P + 1> bounds{0, Cut..., layer_total};
    static_assert(sizeof...(Cut) > 0, "a Pipeline needs at least one cut: Pipeline<M, Cuts<I>> cuts M before layer I");
    static_assert([] {
        for (std::size_t s = 0; s < P; ++s)
            if (bounds[s] >= bounds[s + 1]) return false;
        return true;
    }(), "Pipeline<M, Cuts<I...>>: the cuts must increase, and lie between 1 and the number of M's layers - 1, "
         "so that every stage has a layer");
    static_assert(M::syncs == 0 && M::statistics_count == 0,
                  "a Pipeline cannot hold BatchNorm yet: its statistics are over the batch, which a pipeline cuts "
                  "into micro-batches; use LayerNorm, or DataParallel");
    static_assert(!M::chain::spans_devices, "a Pipeline's model cannot hold a nested DataParallel");
    static constexpr std::size_t stage_of(std::size_t layer)
    {
        std::size_t s = 0;
        while (s + 1 < P && bounds[s + 1] <= layer) ++s;
        return s;
    }
    static_assert([]<std::size_t... I>(std::index_sequence<I...>) {
        return ((stage_of(M::chain::template param_home<I>) == stage_of(I)) && ...);
    }(std::make_index_sequence<layer_total>{}), "a Pipeline cannot cut a tied head (TiedHead<E>) away from its "
                                                "Embedding E yet: put both in one stage, cutting elsewhere");

    using chain = typename M::chain;
    template <std::size_t S>
    static constexpr std::size_t bound = detail::bound<S, layer_total, Cut...>;
    template <std::size_t S>
    using stage_input = std::conditional_t<S == 0, typename entries::input,
                                           typename detail::input_of_shape<
                                               typename chain::template shape_before<detail::bound<S, layer_total, Cut...>>>::type>;

public:
    template <std::size_t S>
    using stage_type = typename detail::stage_model<typename M::storage, typename M::param_rule, stage_input<S>,
                                                    typename detail::slice_of<detail::bound<S, layer_total, Cut...>,
                                                                              detail::bound<S + 1, layer_total, Cut...>, layers>::type,
                                                    typename M::loss, S + 1 == P>::type;

private:
    template <class Seq>
    struct stages_of;
    template <std::size_t... S>
    struct stages_of<std::index_sequence<S...>> {
        using type = std::tuple<stage_type<S>...>;
    };
    using stages = typename stages_of<std::make_index_sequence<P>>::type;
    template <std::size_t S>
    static constexpr std::uint32_t first_id = std::uint32_t(chain::id_offset[bound<S>]);
    template <std::size_t S>
    static constexpr std::size_t param_begin = chain::param_offset[bound<S>];

public:
    // M runs, in stages: its parameter layout is this model's (parallel/layout.hpp).
    using base = LayoutOf<M, Pipeline>;
    using typename base::input_element, typename base::input_shape, typename base::output_shape, typename base::loss,
        typename base::storage, typename base::param_rule, typename base::Evaluation;
    using base::param_count, base::trainable_count, base::label_size;
    using schedule = Schedule;
    static constexpr std::size_t stage_count = P;

    // Stage s on devices[s], M's parameters from `seed`.
    explicit Pipeline(std::vector<Device> devices, std::uint64_t seed = 0, PipelineOptions options = {})
        : devices_(check_devices(std::move(devices))), options_(check_options(options)),
          stages_(make_stages(seed, std::make_index_sequence<P>{})), pool_(P)
    {
        static_assert(model::TrainableModel<Pipeline>);
        check_layout();
    }

    std::size_t replica_count() const { return 1; }
    std::size_t global_replica_count() const { return 1; }
    int process_rank() const { return 0; }
    std::span<const Device> devices() const { return devices_; }
    const Device& device() const { return devices_.front(); }
    const PipelineOptions& options() const { return options_; }
    // "Pipeline<1F1B> over cpu:0,cpu:1"
    std::string description() const
    {
        std::string s = std::string("Pipeline<") + Schedule::name + "> over ";
        for (std::size_t i = 0; i < P; ++i) s += (i ? "," : "") + devices_[i].name();
        return s;
    }
    template <std::size_t S>
    stage_type<S>& stage() { return std::get<S>(stages_); }
    // How long the last training step took, and each stage's busy part of it.
    const PipelineTimes& last_step_times() const { return times_; }
    // Bytes of activation memory each stage holds for the largest micro-batch seen, every slot.
    std::vector<std::size_t> activation_bytes() const
    {
        std::vector<std::size_t> b;
        core::static_for<P>([&](auto s) { b.push_back(std::get<s>(stages_).activation_bytes()); });
        return b;
    }

    std::vector<float> parameters() const
    {
        return gather([](const auto& st) { return st.parameters(); });
    }
    std::vector<float> gradients() const
    {
        return gather([](const auto& st) { return st.gradients(); });
    }
    // M's layout (model/state_planes.hpp): the stages' planes joined plane by plane.
    std::vector<float> optimizer_state() const
    {
        if (!state_.kept().empty()) return state_.kept();
        std::vector<float> all;   // parameter-major, where the stages' slices follow one another
        core::static_for<P>([&](auto s) {
            const auto part = state_.parameter_major(std::get<s>(stages_).optimizer_state(), trainable_of<s>);
            all.insert(all.end(), part.begin(), part.end());
        });
        return state_.plane_major(all, trainable_count);
    }
    void set_parameters(std::span<const float> w)
    {
        core::require(w.size() == param_count, "set_parameters: got " + std::to_string(w.size()) +
                                                   " values, the model has " + std::to_string(param_count));
        core::static_for<P>([&](auto s) {
            auto& st = std::get<s>(stages_);
            st.set_parameters(w.subspan(param_begin<s>, st.param_count));
        });
    }
    // M's layout, as optimizer_state() gives it. Before the first update, which says how the state is
    // laid out in planes, it is kept whole and handed to the stages then.
    void set_optimizer_state(std::span<const float> state)
    {
        core::require(trainable_count > 0 ? state.size() % trainable_count == 0 : state.empty(),
                      "set_optimizer_state: " + std::to_string(state.size()) +
                          " values is not a whole number for each of the " + std::to_string(trainable_count) +
                          " trainable parameters");
        if (state_.known()) hand_state(state);
        else state_.keep(state);
    }
    std::vector<float> statistics() const { return {}; }
    void set_statistics(std::span<const float> s)
    {
        core::require(s.empty(), "set_statistics: a Pipeline's model has no statistics, got " + std::to_string(s.size()));
    }

    // ---- the training contract (model/concepts.hpp) ----

    double forward_backward(const model::Pass& pass, const input_element* x, const std::int32_t* labels, std::size_t n,
                            float loss_scale)
    {
        M::check_inputs(x, n);
        run_step(pass, x, labels, n, loss_scale);
        double total = 0.0;
        for (std::size_t i = 0; i < micro_count_; ++i) total += loss::template finish<output_shape>(losses_[i]);
        return total;
    }

    double reproducible_forward_backward(const model::Pass&, const input_element*, const std::int32_t*, std::size_t,
                                         float, std::size_t)
    {
        throw Error("the reproducible mode does not run over a Pipeline yet: train the plain model, or a DataParallel, "
                    "in that mode");
    }

    // An optimizer that looks at the whole gradient (ClipGradNorm, LossScale, an Accumulate of a
    // ClipGradNorm) looks at it over the stages (model::update_in_parts): each stage's answer (its
    // sum of squares, whether its gradient is finite) waited for, and combined on the host in stage
    // order; then every stage applies the optimizer to its slice.
    template <class Opt>
    void update(const Opt& opt)
    {
        static_assert(model::UpdatesInParts<Opt, backend::cpu::Context>,
                      "an optimizer that looks at the whole gradient without saying how to look at it in parts "
                      "(update_in_parts: an Accumulate of a LossScale, an optimizer of your own) cannot update a "
                      "Pipeline yet: wrap the Accumulate in the LossScale, or train the plain model");
        if constexpr (model::UpdatesInParts<Opt, backend::cpu::Context>) {
            if (state_.adopt<Opt>()) hand_state(state_.take());
            Stages parts{*this};
            model::update_in_parts(opt, parts);
        }
    }

    // Loss sum and correct predictions over n samples, a micro-batch's worth at a time through the stages.
    Evaluation evaluate(const input_element* x, const std::int32_t* labels, std::size_t n)
    {
        M::check_inputs(x, n);
        Evaluation total{};
        through_stages(x, n, [&](auto& last, std::size_t offset, std::size_t count) {
            const Evaluation e = last.evaluate_outputs(labels + offset * label_size, count, 0);
            total.loss_sum += e.loss_sum;
            total.correct += e.correct;
        });
        return total;
    }

    void predict(const input_element* x, std::size_t n, float* out)
    {
        M::check_inputs(x, n);
        through_stages(x, n, [&](auto& last, std::size_t offset, std::size_t count) {
            last.outputs(0, count, out + offset * output_shape::size);
        });
    }

private:
    template <std::size_t S>
    using stage_plan = model::UpdatePlan<typename stage_type<S>::chain, param_rule, first_id<S>>;

    // The stages as a gradient in parts (model::GradientPartsContract), in stage order.
    struct Stages {
        using context = backend::cpu::Context;
        Pipeline& p;

        bool unscale(float inv_scale)
        {
            bool finite = true;
            core::static_for<P>([&](auto s) {
                finite = std::get<s>(p.stages_).template unscale<param_rule, first_id<s>>(inv_scale) && finite;
            });
            return finite;
        }
        double squares(core::GradientAt at = core::GradientAt::params)
        {
            double total = 0.0;
            core::static_for<P>([&](auto s) {
                auto& st = std::get<s>(p.stages_);
                const std::pair<std::size_t, std::size_t> all{
                    0, at == core::GradientAt::params ? st.param_count : stage_plan<s>::trainable};
                total += st.template gradient_squares<param_rule, first_id<s>>(std::span(&all, 1), at);
            });
            return total;
        }
        void clip(double squares, float max_norm, core::GradientAt at = core::GradientAt::params)
        {
            core::static_for<P>([&](auto s) {
                std::get<s>(p.stages_).template clip_gradient<param_rule, first_id<s>>(squares, max_norm, at);
            });
        }
        template <class O>
        void apply(const O& o)
        {
            core::static_for<P>([&](auto s) { std::get<s>(p.stages_).template update_part<param_rule, first_id<s>>(o); });
        }
    };

    static std::vector<Device> check_devices(std::vector<Device> d)
    {
        core::require(d.size() == P, "a Pipeline of " + std::to_string(P) + " stages needs " + std::to_string(P) +
                                         " devices, one a stage; got " + std::to_string(d.size()));
        for (std::size_t i = 0; i < d.size(); ++i)
            for (std::size_t j = 0; j < i; ++j)
                core::require(!(d[i] == d[j]) || d[i].is_cuda(),
                              "device " + d[i].name() + " appears twice in the Pipeline's device list: number CPU "
                              "devices cpu:0, cpu:1, ...");
        return d;
    }
    static PipelineOptions check_options(PipelineOptions o)
    {
        core::require(o.micro_batches > 0, "PipelineOptions::micro_batches must be at least 1");
        return o;
    }
    template <std::size_t... S>
    stages make_stages(std::uint64_t seed, std::index_sequence<S...>)
    {
        return stages{stage_type<S>(std::vector<Device>{devices_[S]}, seed, first_id<S>)...};
    }
    // The stages' parameters are M's, in M's order.
    static void check_layout()
    {
        core::static_for<P>([&](auto s) {
            static_assert(stage_type<s>::param_count == param_begin<s + 1> - param_begin<s>,
                          "a Pipeline stage's parameters are not M's between its cuts: a tied head (TiedHead) must "
                          "stay in the stage of its Embedding; cut elsewhere");
        });
    }
    // Stage s's trainable parameters.
    template <std::size_t S>
    static constexpr std::size_t trainable_of = stage_plan<S>::trainable;
    // M's optimizer state (its planes) to the stages, each its slice in its own planes.
    void hand_state(std::span<const float> state)
    {
        const std::size_t per = trainable_count ? state.size() / trainable_count : 0;
        const std::vector<float> by_parameter = state_.parameter_major(state, trainable_count);
        std::size_t at = 0;
        core::static_for<P>([&](auto s) {
            const std::span<const float> mine(by_parameter.data() + at, trainable_of<s> * per);
            std::get<s>(stages_).template set_optimizer_state_with<param_rule, first_id<s>>(
                state_.plane_major(mine, trainable_of<s>));
            at += trainable_of<s> * per;
        });
    }
    template <class F>
    std::vector<float> gather(F&& f) const
    {
        std::vector<float> all;
        core::static_for<P>([&](auto s) {
            const auto part = f(std::get<s>(stages_));
            all.insert(all.end(), part.begin(), part.end());
        });
        return all;
    }

    // A hand-off between stage b and b + 1: how many micro-batches have crossed, and the event each
    // crossing's producer marked. A stage waits for the count, then orders its device after the event.
    struct Channel {
        std::atomic<std::size_t> count{0};
        std::vector<core::Event> events;
    };

    static constexpr std::size_t aborted = std::numeric_limits<std::size_t>::max();
    struct Stopped {};   // thrown in a stage that waits on another that failed

    static double seconds_since(std::chrono::steady_clock::time_point t)
    {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
    }
    // Waits until `c` has passed micro-batch i (or a stage failed: then throws); adds the time it
    // waited to `waited`.
    static void await(Channel& c, std::size_t i, double& waited)
    {
        std::size_t seen = c.count.load(std::memory_order_acquire);
        if (seen != aborted && seen > i) return;
        const auto start = std::chrono::steady_clock::now();
        for (;; seen = c.count.load(std::memory_order_acquire)) {
            if (seen == aborted) throw Stopped{};
            if (seen > i) break;
            c.count.wait(seen, std::memory_order_acquire);
        }
        waited += seconds_since(start);
    }
    static void post(Channel& c, std::size_t i, core::Event e)
    {
        c.events[i] = e;
        c.count.store(i + 1, std::memory_order_release);
        c.count.notify_all();
    }
    void abort_all()
    {
        for (auto& c : forward_) {
            c.count.store(aborted, std::memory_order_release);
            c.count.notify_all();
        }
        for (auto& c : backward_) {
            c.count.store(aborted, std::memory_order_release);
            c.count.notify_all();
        }
    }

    // One training step's work over n samples: every stage through its schedule on its own thread.
    void run_step(const model::Pass& pass, const input_element* x, const std::int32_t* labels, std::size_t n,
                  float loss_scale)
    {
        const std::size_t m = std::max<std::size_t>(1, std::min(options_.micro_batches, n));
        micro_count_ = n == 0 ? 0 : m;
        if (tasks_micro_ != m) {   // the schedule's lists, made again only when m changes
            for (std::size_t s = 0; s < P; ++s) tasks_[s] = Schedule::tasks(s, P, m);
            tasks_micro_ = m;
        }
        if (losses_.size() < m) losses_ = backend::host_buffer<core::LossSlot>(m);
        for (std::size_t b = 0; b + 1 < P; ++b) {
            forward_[b].count.store(0);
            backward_[b].count.store(0);
            forward_[b].events.assign(m, {});
            backward_[b].events.assign(m, {});
        }
        core::static_for<P>([&](auto S) { std::get<S>(stages_).use_slots(Schedule::slots(S, P, m)); });
        first_error_ = nullptr;
        times_.busy_seconds.assign(P, 0.0);
        const auto start = std::chrono::steady_clock::now();
        pool_.run([&](std::size_t s) {
            try {
                const auto began = std::chrono::steady_clock::now();
                double waited = 0.0;
                core::static_for<P>([&](auto S) {
                    if (S == s) run_stage<S>(pass, x, labels, n, m, loss_scale, waited);
                });
                times_.busy_seconds[s] = seconds_since(began) - waited;
            } catch (const Stopped&) {   // another stage failed first
            } catch (...) {
                {
                    const std::lock_guard lock(error_mutex_);
                    if (!first_error_) first_error_ = std::current_exception();
                }
                abort_all();
            }
        });
        times_.step_seconds = seconds_since(start);
        if (first_error_) std::rethrow_exception(first_error_);
        largest_micro_ = std::max(largest_micro_, share(n, m, 0).count);
    }

    template <std::size_t S>
    void run_stage(const model::Pass& pass, const input_element* x, const std::int32_t* labels, std::size_t n,
                   std::size_t m, float loss_scale, double& waited)
    {
        auto& st = std::get<S>(stages_);
        const std::size_t slots = Schedule::slots(S, P, m);
        if (n == 0) {   // nothing to learn from: a zero gradient
            st.visit([&](auto& ctx) { fill(ctx, st.gradient_data(), 0.0f, st.param_count); });
            return;
        }
        for (const PipelineTask& t : tasks_[S]) {
            const Share part = share(n, m, t.micro);
            const int slot = int(t.micro % slots);
            model::Pass mine = pass;
            mine.first_sample += part.offset;
            if (!t.backward) {
                if constexpr (S == 0) {
                    st.forward_input(mine, x + part.offset * input_shape::size, part.count, slot);
                } else {
                    await(forward_[S - 1], t.micro, waited);
                    auto& before = std::get<S - 1>(stages_);
                    st.visit([&](auto& ctx) { ctx.wait(forward_[S - 1].events[t.micro]); });
                    st.forward_train(mine, before.output_of(int(t.micro % Schedule::slots(S - 1, P, m))), part.count, slot);
                }
                if constexpr (S + 1 < P) post(forward_[S], t.micro, st.visit([](auto& ctx) { return ctx.mark(); }));
            } else {
                storage* dx = nullptr;
                if constexpr (S > 0) dx = std::get<S - 1>(stages_).output_gradient_of(int(t.micro % Schedule::slots(S - 1, P, m)));
                const bool accumulate = t.micro > 0;
                if constexpr (S + 1 == P) {
                    st.loss_backward(mine, labels + part.offset * label_size, part.count, loss_scale, &losses_[t.micro],
                                     dx, slot, accumulate);
                } else {
                    await(backward_[S], t.micro, waited);
                    st.visit([&](auto& ctx) { ctx.wait(backward_[S].events[t.micro]); });
                    st.backward_from(mine, st.output_gradient_of(slot), dx, core::NoHook{}, slot, accumulate);
                }
                if constexpr (S > 0) post(backward_[S - 1], t.micro, st.visit([](auto& ctx) { return ctx.mark(); }));
            }
        }
        st.visit([](auto& ctx) { ctx.synchronize(); });
    }

    // Forward without training through every stage, a micro-batch's worth of samples at a time, on
    // this thread; then f(last stage, offset, count) reads the outputs from its slot 0.
    template <class F>
    void through_stages(const input_element* x, std::size_t n, F&& f)
    {
        const std::size_t chunk = std::max<std::size_t>(1, capacity_hint());
        for (std::size_t offset = 0; offset < n; offset += chunk) {
            const std::size_t count = std::min(chunk, n - offset);
            const model::Pass p{.training = false};
            core::static_for<P>([&](auto s) {
                auto& st = std::get<s>(stages_);
                if constexpr (s == 0) {
                    st.forward_input(p, x + offset * input_shape::size, count, 0);
                } else {
                    auto& before = std::get<s - 1>(stages_);
                    const core::Event ready = before.visit([](auto& ctx) { return ctx.mark(); });
                    st.visit([&](auto& ctx) { ctx.wait(ready); });
                    st.forward_train(p, before.output_of(0), count, 0);
                }
            });
            f(std::get<P - 1>(stages_), offset, count);
        }
    }
    // Samples a forward of evaluation takes at a time: the largest micro-batch trained so far, or 256.
    std::size_t capacity_hint() const { return largest_micro_ ? largest_micro_ : 256; }

    std::vector<Device> devices_;
    PipelineOptions options_;
    stages stages_;
    model::SlicedState state_;   // the optimizer state's planes; a state set before the first update
    WorkerPool pool_;
    std::array<Channel, P - 1> forward_, backward_;   // boundary b: stage b to b + 1
    core::Buffer<core::LossSlot> losses_;              // page-locked: a micro-batch's loss each
    std::size_t micro_count_ = 0;                      // micro-batches of the last step
    std::array<std::vector<PipelineTask>, P> tasks_;   // each stage's schedule for tasks_micro_ micro-batches
    std::size_t tasks_micro_ = 0;
    std::size_t largest_micro_ = 0;                    // samples of the largest micro-batch so far
    PipelineTimes times_;
    std::exception_ptr first_error_;                   // the error of the stage that failed first
    std::mutex error_mutex_;
};

template <class T>
struct is_pipeline : std::false_type {};
template <class M, class C, class S>
struct is_pipeline<Pipeline<M, C, S>> : std::true_type {};

} // namespace replica::parallel

namespace REPLICA_NAMESPACE {
using parallel::Cuts;
using parallel::GPipe;
using parallel::OneFOneB;
using parallel::Pipeline;
using parallel::PipelineOptions;
using parallel::PipelineTask;
} // namespace replica
