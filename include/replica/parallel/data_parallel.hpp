#pragma once
// DataParallel<M, Dispatch>: model M replicated on several devices, trained as one model.
//
//   DataParallel<LeNet, Threaded> dp{{Device::cpu(0), Device::cpu(1), Device::cpu(2)}};
//   float loss = train_step(dp, opt, batch);     // same API as a single model
//
// Every replica starts from the same parameters. Each step: the global batch is split over the
// replicas (uneven splits allowed; a replica with no samples contributes a zero gradient); each replica
// runs forward, its share of the loss (scaled by 1 / global batch, so the replica gradients SUM to the
// gradient of the global mean loss), and backward; gradients are all-reduced bucket by bucket as
// backward produces them (the dispatch policy says how: parallel/dispatch.hpp); every replica applies
// the same update to its own copy. Parameters are never copied or broadcast per step.
//
// Random choices are keyed on the global sample index, so a model with dropout trains the same on 1
// or N replicas; results equal the single model's up to float summation order.
//
// Nested in a larger model it is a layer: see DataParallel::op.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "replica/backend/backend.hpp"
#include "replica/core/config.hpp"
#include "replica/model/concepts.hpp"
#include "replica/model/sequential.hpp"
#include "replica/model/state_planes.hpp"
#include "replica/model/step_pipeline.hpp"
#include "replica/parallel/dispatch.hpp"
#include "replica/parallel/replica_set.hpp"
#include "replica/parallel/scaling.hpp"

namespace REPLICA_NAMESPACE::parallel {

// What the replicas keep a shard of, instead of a whole copy each (DataParallelOptions::shard).
//   none             every replica keeps the whole optimizer state and applies the whole update.
//   optimizer_state  ZeRO-1: replica r keeps the state of its 1/R of the trainable parameters and
//                    updates only them, after the gradient's all-reduce as before; then every
//                    replica copies the others' updated ranges. The same floats as `none` (the
//                    update is element by element), 1/R of the state's memory a replica.
enum class Shard { none, optimizer_state };

struct DataParallelOptions {
    // Gradients are all-reduced in buckets of about this many floats, from the last layer's back.
    std::size_t bucket_floats = std::size_t{1} << 20;
    // ... but the first bucket (the last layers) closes at this many (or bucket_floats, if smaller), so
    // that communication starts early in backward, as PyTorch DDP's first bucket does (1 MiB).
    std::size_t first_bucket_floats = std::size_t{1} << 18;
    // How the gradient buckets travel in the all-reduce (backend/communicator.hpp): fp32, or bf16
    // (each replica's bucket and the sum rounded to bf16: half the bytes, 8 significant bits; the
    // guide says what it costs). BatchNorm's sums over the replicas stay fp32. The reproducible mode
    // refuses bf16: its sum is exact.
    GradientReduction gradient_reduction = GradientReduction::fp32;
    // Several processes (parallel/mpi.hpp): this process's replicas are part of every process's.
    // Every process must hold the same number of replicas. Not owned; must outlive the DataParallel.
    ProcessGroup* processes = nullptr;
    // Shard::optimizer_state: ZeRO-1 (above). One process only; no nested DataParallel in M.
    Shard shard = Shard::none;
};

namespace detail {
// A GPU may be listed several times when it is the only one listed (its replicas share it); a CPU
// device may not: CPU replicas share the host anyway, and their numbers only tell them apart.
inline std::vector<Device> check_replica_devices(std::vector<Device> devices)
{
    core::require(!devices.empty(), "DataParallel needs at least one device");
    for (std::size_t i = 0; i < devices.size(); ++i)
        for (std::size_t j = 0; j < i; ++j)
            core::require(!(devices[i] == devices[j]) || devices[i].is_cuda(),
                          "device " + devices[i].name() + " appears twice in the DataParallel device list: "
                          "number CPU replicas cpu:0, cpu:1, ...");
    check_communicator_devices(devices, false);
    return devices;
}

// M's gradient buckets; its frozen parameters' gradients are not reduced.
template <class M>
std::vector<Bucket> buckets_of(const DataParallelOptions& o)
{
    return make_buckets(M::chain::param_offset, o.first_bucket_floats, o.bucket_floats,
                        std::span<const Bucket>(M::update_plan::frozen_runs));
}

inline model::Pass shifted(model::Pass p, const Share& s)
{
    p.first_sample += s.offset;
    return p;
}
} // namespace detail

template <class M, DispatchPolicy Dispatch = SingleThread>
class DataParallel {
    static_assert(model::is_sequential<M>::value,
                  "DataParallel<M>: M must be a model, a Sequential<Input<...>, ...>");
    static_assert(model::Replica<M>);
    static_assert(M::syncs == 0 || Dispatch::syncs_in_step,
                  "BatchNorm's statistics over the global batch are summed over the replicas in the middle of each "
                  "step, which only DataParallel<M, Threaded> can issue (auto_parallel picks it): use Threaded, or "
                  "BatchNorm<Rank, BatchStats::per_replica> for each replica's own statistics");

public:
    using replica_type = M;
    using dispatch = Dispatch;
    using input_shape = typename M::input_shape;
    using input_element = typename M::input_element;   // float, or token ids: scattered as they are
    using output_shape = typename M::output_shape;
    using loss = typename M::loss;
    using Evaluation = model::Evaluation;
    static constexpr std::size_t param_count = M::param_count;
    using param_rule = typename M::param_rule;
    using update_plan = typename M::update_plan;
    static constexpr std::size_t trainable_count = M::trainable_count;
    static constexpr std::size_t statistics_count = M::statistics_count;
    static constexpr std::size_t label_size = M::label_size;

    // One replica of M on each device, all initialised from `seed`.
    explicit DataParallel(std::vector<Device> devices = backend::default_devices(), std::uint64_t seed = 0,
                          DataParallelOptions options = {})
        : devices_(detail::check_replica_devices(std::move(devices))), options_(check_options(options)),
          set_(detail::buckets_of<M>(options), devices_.size(), devices_.front(), M::syncs)
    {
        replicas_.reserve(devices_.size());
        for (const auto& d : devices_) replicas_.emplace_back(std::vector<Device>{d}, seed);
        start();
    }

    // Replicates an existing model (its parameters and optimizer state) over `devices`.
    DataParallel(M&& model, std::vector<Device> devices, DataParallelOptions options = {})
        : devices_(detail::check_replica_devices(std::move(devices))), options_(check_options(options)),
          set_(detail::buckets_of<M>(options), devices_.size(), devices_.front(), M::syncs)
    {
        const auto w = model.parameters();
        const auto state = model.optimizer_state();
        const auto stats = model.statistics();
        replicas_.reserve(devices_.size());
        for (const auto& d : devices_) {
            if (replicas_.empty() && model.device() == d) replicas_.push_back(std::move(model));
            else {
                replicas_.emplace_back(std::vector<Device>{d});
                replicas_.back().set_parameters(w);
                replicas_.back().set_statistics(stats);
                if (!state.empty() && !sharded()) replicas_.back().set_optimizer_state(state);
            }
        }
        start();
        if (sharded() && !state.empty()) set_optimizer_state(state);
    }

    // ---- as a layer: Sequential<Input<...>, DataParallel<Features, Threaded>, Classifier> ----
    // Replica 0 runs in the parent model's context on the parent's memory (its parameters are the
    // parent's slice); replicas 1.. are models of their own on the other devices of the parent's
    // list. Forward scatters the input and gathers the outputs into the parent's output; backward
    // scatters the output gradient, all-reduces the replicas' parameter gradients into the parent's
    // slice and gathers the input gradient. Each replica applies the update to its own copy.
    // Its replicas compute in the precision of the model around it (T).
    //
    // BatchNorm in M (statistics, and sync points with the global batch's statistics): the sync points
    // are the nested replicas' own, summed by this op's replica set inside the parent's forward and
    // backward (Threaded only, as for any DataParallel of M), and stay out of the parent's count. The
    // running estimates the parent sees (its statistics, checkpoints) are replica 0's; the other
    // replicas move their own copies from the same sums in a fast step, and take replica 0's before
    // every forward that reads them (not training) and after the reproducible mode's update.
    template <class In, class T = float>
    class op {
        static_assert(std::is_same_v<In, typename M::input_shape>,
                      "DataParallel<M> nested in a model: M's Input<...> must match the shape that reaches it");
        using replica_model = model::with_precision<M, T>;
        using chain = typename replica_model::chain;
        static constexpr bool syncing = chain::syncs > 0;

    public:
        using input_shape = In;
        using output_shape = typename M::output_shape;
        static constexpr std::size_t param_count = M::param_count;
        static constexpr auto param_ranges = chain::param_ranges;
        static constexpr std::uint32_t layer_count = chain::layer_count;
        static constexpr std::size_t saved_size = chain::saved_size;
        static constexpr std::size_t kept_size = chain::kept_size;
        static constexpr bool spans_devices = true;
        static constexpr bool wants_channels_last = chain::wants_channels_last;
        static constexpr std::size_t statistics_count = chain::statistics_count;
        static constexpr std::uint64_t options_signature = chain::options_signature;

        explicit op(const model::Build& b)
            : chain0_(model::Build{b.layer_id, b.devices.first(1)}),
              set_(detail::buckets_of<M>(DataParallelOptions{}), b.devices.size(), b.devices.front(), chain::syncs)
        {
            core::require(!b.devices.empty(), "a nested DataParallel needs at least one device");
            for (std::size_t r = 1; r < b.devices.size(); ++r)
                others_.emplace_back(std::vector<Device>{b.devices[r]}, 0, b.layer_id, true);
            gathered_.assign(b.devices.size(), {});
        }

        std::size_t replica_count() const { return others_.size() + 1; }

        template <class Ctx>
        std::size_t scratch_size(const Ctx& ctx, std::size_t n) const { return chain0_.scratch_size(ctx, n); }
        void init(float* params, std::uint64_t seed) const { chain0_.init(params, seed); }
        void init_statistics(float* s) const { chain0_.init_statistics(s); }
        // The reproducible mode ran the step whole on replica 0: its estimates move, the others copy them.
        template <class Ctx>
        void update_statistics(Ctx& ctx, float* s, const float* sums, std::size_t batch, std::size_t shard)
        {
            chain0_.update_statistics(ctx, s, sums, batch, shard);
            copy_statistics(ctx, s);
        }

        template <class Ctx>
        void forward(Ctx& ctx, const model::Pass& pass, const model::ForwardArgs<T>& a)
        {
            const std::size_t active = pass.micro_shard > 0 ? 1 : replica_count();
            if constexpr (statistics_count > 0)
                if (!pass.training && active > 1) copy_statistics(ctx, a.statistics);
            const bool synced = syncing && pass.training && active > 1;   // BatchNorm over the nested batch
            if (synced) connect(ctx);
            const core::Event input_ready = ctx.mark();
            set_.each([&](std::size_t r) {
                if (r >= active) return;
                const Share s = share(a.n, active, r);
                const model::Pass mine = detail::shifted(pass, s);
                if constexpr (syncing) {
                    if (synced) {
                        try {
                            forward_replica(ctx, r, mine, a, s, input_ready, set_.hook(r, nullptr));
                        } catch (...) {
                            set_.abort();   // releases the replicas waiting at a sync point
                            throw;
                        }
                        return;
                    }
                }
                forward_replica(ctx, r, mine, a, s, input_ready, core::NoHook{});
            });
            ctx.activate();   // the replicas made their own devices current
            for (std::size_t r = 1; r < active; ++r) ctx.wait(gathered_[r]);
        }

    private:
        // Replica r's forward of its share s, with `hook`'s sync points (a replica without samples
        // takes them too).
        template <class Ctx, class Hook>
        void forward_replica(Ctx& ctx, std::size_t r, const model::Pass& mine, const model::ForwardArgs<T>& a, const Share& s,
                             const core::Event& input_ready, Hook hook)
        {
            if (r == 0) {
                ctx.activate();
                if (s.count) {
                    model::ForwardArgs<T> part = a;
                    part.n = s.count;
                    chain0_.forward(ctx, mine, part, hook);
                } else if constexpr (core::SyncingHook<Hook>) {
                    chain0_.idle_forward(ctx, a.statistics, hook);
                }
                return;
            }
            replica_model& m = others_[r - 1];
            m.visit([&](auto& c) { c.wait(input_ready); });
            const T* y = m.forward_train(mine, a.x + s.offset * input_shape::size, s.count, 0, hook);
            m.visit([&](auto& c) {   // gather into the parent's output
                c.download(a.y + s.offset * output_shape::size, y, s.count * output_shape::size);
                gathered_[r] = c.mark();
            });
        }
        // Replica 0's running estimates (s, the parent's memory) to the others.
        template <class Ctx>
        void copy_statistics(Ctx& ctx, const float* s)
        {
            if (others_.empty()) return;
            std::vector<float> host(statistics_count);
            ctx.download(host.data(), s, statistics_count);
            ctx.synchronize();
            for (auto& m : others_) m.set_statistics(host);
        }
        // Once: the parent's context is known from the first training pass on.
        template <class Ctx>
        void connect(Ctx& ctx)
        {
            if (set_.connected() || replica_count() == 1) return;
            std::vector<backend::AnyContext> contexts{backend::AnyContext(ctx)};
            for (auto& m : others_) contexts.push_back(m.context());
            set_.connect(contexts);
        }

    public:

        // Each replica's gradient is all-reduced in buckets as its backward produces them (the hook of a
        // top-level DataParallel's replicas), so communication overlaps the rest of backward.
        template <class Ctx>
        void backward(Ctx& ctx, const model::Pass& pass, const model::BackwardArgs<T>& a)
        {
            run_backward(ctx, pass, a, nullptr);
        }

        // With one replica, the one on the parent's memory, a model may keep its converted input in
        // that replica's scratch (model/chain.hpp, may_hold_input); backward_refilling (requires
        // holds_input()) is backward then, with the input written again where the replica reads it.
        static constexpr bool may_hold_input = chain::may_hold_input;
        bool holds_input() const { return others_.empty() && chain0_.holds_input(); }
        static T* input_home(float* scratch, std::size_t n)
            requires may_hold_input
        {
            return chain::input_home(scratch, n);
        }
        template <class Ctx, class Refill>
            requires may_hold_input
        void backward_refilling(Ctx& ctx, const model::Pass& pass, const model::BackwardArgs<T>& a, Refill&& refill)
        {
            run_backward(ctx, pass, a, &refill);
        }

    private:
        // refill: null, or backward_refilling's (replica 0 only: there are no others).
        template <class Ctx, class Refill>
        void run_backward(Ctx& ctx, const model::Pass& pass, const model::BackwardArgs<T>& a, Refill refill)
        {
            connect(ctx);
            const core::Event grad_ready = ctx.mark();
            const std::size_t active = pass.micro_shard > 0 ? 1 : replica_count();
            whole_ = pass.micro_shard > 0;
            auto gradient_of = [&](std::size_t r) { return r == 0 ? a.dparams : others_[r - 1].gradient_data(); };
            // Replica r's backward, with `hook` told of each layer's gradient.
            auto replica_backward = [&](std::size_t r, const Share& s, auto&& hook) {
                const model::Pass mine = detail::shifted(pass, s);
                T* dx = a.dx ? a.dx + s.offset * input_shape::size : nullptr;
                if (r == 0) {
                    ctx.activate();
                    if (s.count) {
                        model::BackwardArgs<T> part = a;
                        part.dx = dx;
                        part.n = s.count;
                        if constexpr (std::is_null_pointer_v<Refill>) chain0_.backward(ctx, mine, part, hook);
                        else chain0_.backward_refilling(ctx, mine, part, *refill, hook);
                    } else {   // nothing to learn from, yet every sync point is the replicas' together
                        fill(ctx, a.dparams, 0.0f, param_count);
                        if constexpr (syncing) chain0_.idle_backward(ctx, hook);
                        else hook(std::size_t{0});
                    }
                    return;
                }
                replica_model& m = others_[r - 1];
                m.visit([&](auto& c) { c.wait(grad_ready); });
                m.backward_from(mine, a.dy + s.offset * output_shape::size, dx, hook);
                m.visit([&](auto& c) { gathered_[r] = c.mark(); });
            };
            if (active == 1) {   // (whole: the others take replica 0's result at the update)
                replica_backward(0, share(a.n, 1, 0), core::NoHook{});
                return;
            }
            set_.each([&](std::size_t r) {
                try {
                    replica_backward(r, share(a.n, active, r), set_.hook(r, gradient_of(r)));
                } catch (...) {
                    set_.abort();
                    throw;
                }
            });
            set_.after_backward(gradient_of);
            ctx.activate();
            for (std::size_t r = 1; r < replica_count(); ++r) ctx.wait(gathered_[r]);   // input gradients
            for (std::size_t r = 0; r < replica_count(); ++r) set_.comm().wait(r);
            ctx.activate();
        }

    public:

        // Under the parent's Rule, this op's first layer id being First: every replica applies the same
        // plan to its own copy.
        template <model::ParamRuleType Rule, std::uint32_t First, class Ctx, class Opt>
        void update(Ctx& ctx, const Opt& opt, float* w, const float* g, float* state)
        {
            using plan = model::UpdatePlan<chain, Rule, First>;
            const std::span<const core::ParamSegment> segments(plan::segments);
            if (whole_) {   // only replica 0 has the gradient: update it, then copy it to the others
                ctx.activate();
                opt.apply(ctx, w, g, state, segments);
                const core::Event updated = ctx.mark();
                for (auto& m : others_) m.copy_state_from(w, state, plan::trainable * Opt::state_per_param, updated);
                ctx.activate();
                return;
            }
            set_.each([&](std::size_t r) {
                if (r == 0) {
                    ctx.activate();
                    opt.apply(ctx, w, g, state, segments);
                } else {
                    others_[r - 1].template update_with<Rule, First>(opt);
                }
            });
            ctx.activate();
        }

        // The parent set its parameters (and optimizer state: per floats a trainable parameter under
        // Rule): copy replica 0's slice to the others.
        template <model::ParamRuleType Rule, std::uint32_t First, class Ctx>
        void sync(Ctx& ctx, const float* w, const float* state, std::size_t per)
        {
            if (others_.empty()) return;
            std::vector<float> host(state ? model::UpdatePlan<chain, Rule, First>::trainable * per : param_count);
            ctx.download(host.data(), state ? state : w, host.size());
            ctx.synchronize();
            for (auto& m : others_) {
                if (state) m.template set_optimizer_state_with<Rule, First>(host);
                else m.set_parameters(host);
            }
        }

    private:
        chain chain0_;
        std::vector<replica_model> others_;
        ReplicaSet<Dispatch> set_;
        std::vector<core::Event> gathered_;
        bool whole_ = false;   // the last backward ran whole on replica 0 (reproducible mode)
    };

    std::size_t replica_count() const { return replicas_.size(); }
    // This process's rank among the processes of the run (0 without a ProcessGroup): rank 0 writes
    // checkpoints and logs.
    int process_rank() const { return options_.processes ? options_.processes->rank() : 0; }
    // Replicas over every process (replica_count() with one process).
    std::size_t global_replica_count() const { return replicas_.size() * std::size_t(process_count()); }
    // "DataParallel<threaded> over cpu:0,cpu:1"
    std::string description() const
    {
        std::string s = std::string("DataParallel<") + Dispatch::name + "> over ";
        for (std::size_t i = 0; i < devices_.size(); ++i) s += (i ? "," : "") + devices_[i].name();
        if (options_.shard == Shard::optimizer_state) s += ", optimizer state sharded";
        return s;
    }
    // The samples of an n-sample batch that this process's replicas train on (shard: the reproducible
    // mode's micro-shard, 0 in the fast mode). Contiguous, since a process's replicas are consecutive
    // global replicas; a Loader gathers only these (Loader::only), so no process reads the others'.
    Share process_share(std::size_t n, std::size_t shard) const
    {
        const Share first = samples_of(0, n, shard), last = samples_of(replicas_.size() - 1, n, shard);
        return {first.offset, last.offset + last.count - first.offset};
    }
    std::span<const Device> devices() const { return devices_; }
    const Device& device() const { return devices_.front(); }
    M& replica(std::size_t r) { return replicas_[r]; }
    // The activation memory of one replica (Sequential::activation_bytes).
    std::size_t activation_bytes() const { return replicas_.front().activation_bytes(); }
    const DataParallelOptions& options() const { return options_; }
    GradientReduction gradient_reduction() const { return options_.gradient_reduction; }
    std::size_t bucket_count() const { return set_.bucket_count(); }
    // Floats of gradient each replica all-reduces a step (the reproducible mode's exact sum aside): the
    // trainable parameters' (M's ParamRule: frozen parameters' gradients are not summed).
    std::size_t reduced_floats() const { return set_.gradient_floats(); }

    std::vector<float> parameters() const { return replicas_.front().parameters(); }
    std::vector<float> gradients() const { return replicas_.front().gradients(); }
    // M's optimizer state; sharded, the replicas' shards joined plane by plane (model/state_planes.hpp).
    std::vector<float> optimizer_state() const
    {
        if (!sharded()) return replicas_.front().optimizer_state();
        if (!shard_state_.kept().empty()) return shard_state_.kept();
        std::vector<float> all;   // parameter-major, where the shards follow one another
        for (std::size_t r = 0; r < replicas_.size(); ++r) {
            const auto part = shard_state_.parameter_major(replicas_[r].optimizer_state(),
                                                           share(trainable_count, replicas_.size(), r).count);
            all.insert(all.end(), part.begin(), part.end());
        }
        return shard_state_.plane_major(all, trainable_count);
    }
    // Replica 0's statistics: with BatchStats::global every replica's are the same.
    std::vector<float> statistics() const { return replicas_.front().statistics(); }
    void set_statistics(std::span<const float> s)
    {
        for (auto& r : replicas_) r.set_statistics(s);
    }
    void set_parameters(std::span<const float> w)
    {
        drop_ahead();   // it computed with the old parameters
        for (auto& r : replicas_) r.set_parameters(w);
    }
    void set_optimizer_state(std::span<const float> s)
    {
        if (!sharded()) {
            for (auto& r : replicas_) r.set_optimizer_state(s);
            return;
        }
        core::require(trainable_count > 0 ? s.size() % trainable_count == 0 : s.empty(),
                      "set_optimizer_state: " + std::to_string(s.size()) + " values is not a whole number for each of the " +
                          std::to_string(trainable_count) + " trainable parameters");
        if (shard_state_.known()) hand_shards(s);
        else shard_state_.keep(s);   // the first update says how it is laid out in planes
    }
    // Floats of optimizer state replica r holds (1/R of M's sharded; all of it otherwise).
    std::size_t optimizer_state_floats(std::size_t r) const { return replicas_[r].optimizer_state().size(); }

    // ---- the training contract (model/concepts.hpp) ----

    double forward_backward(const model::Pass& pass, const input_element* x, const std::int32_t* labels, std::size_t n,
                            float loss_scale)
    {
        M::check_inputs(x, n);
        drop_ahead();
        return finish_step(queue_step({pass, x, labels, n, loss_scale}, [](M&) {}));
    }

    // A training step as train_step takes it (model/step_pipeline.hpp): every replica's update, then,
    // given the next batch, every replica's next forward, backward and all-reduce are queued before
    // the host waits for this step's losses and all-reduce. So no GPU waits for the host between
    // steps, and the GPUs start each step together.
    template <class Opt>
    double step(const model::StepInput<input_element>& in, const Opt& opt, const model::StepInput<input_element>* next = nullptr)
    {
        if (sharded()) {   // every replica's next step reads every shard's update: nothing queued ahead
            const double l = forward_backward(in.pass, in.x, in.labels, in.n, in.loss_scale);
            update(opt);
            return l;
        }
        return ahead_.step(
            in, next,
            [&](const model::StepInput<input_element>& s, bool update_first) {
                if (update_first) return queue_step(s, [&](M& m) { m.update(opt); });
                return queue_step(s, [](M&) {});
            },
            [&] { update(opt); }, [&](int slot) { return finish_step(slot); });
    }

    // The reproducible mode (see train_step): the global batch is cut into micro-shards of `shard`
    // samples; replica r takes a contiguous run of whole shards and sums their gradients in fixed
    // point; the replicas' sums are added exactly (integers) by the communicator, so the gradient and
    // the update are the same bit for bit on any number of replicas. Returns the loss summed in shard order.
    double reproducible_forward_backward(const model::Pass& pass, const input_element* x, const std::int32_t* labels,
                                         std::size_t n, float loss_scale, std::size_t shard)
    {
        core::require(shard > 0, "the reproducible mode needs a micro-shard of at least 1 sample");
        M::check_inputs(x, n);
        check_reproducible_reduction(options_.gradient_reduction);
        drop_ahead();
        const std::size_t shards = (n + shard - 1) / shard;
        shard_loss_.assign(shards, 0.0);
        const backend::SerialHostKernels serial(devices_.front());   // sums independent of the thread count
        set_.each([&](std::size_t r) {
            const Share s = samples_of(r, n, shard);
            model::Pass mine = pass;
            mine.first_sample = pass.first_sample + s.offset;
            exact_ptrs_[r] = replicas_[r].queue_shard_gradients(mine, x + s.offset * input_shape::size,
                                                                labels + s.offset * label_size, s.count, loss_scale,
                                                                shard, s.offset / shard);
        });
        set_.each([&](std::size_t r) { replicas_[r].finish_shards(shard_loss_.data()); });
        set_.comm().exact_all_reduce(exact_ptrs_, M::exact_count);
        set_.comm().sum_across_processes(shard_loss_.data(), shards);   // one contributor per shard: exact
        set_.each([&](std::size_t r) { replicas_[r].set_gradients_exact(n, shard); });
        double total = 0.0;
        for (double l : shard_loss_) total += l;
        return total;
    }

    template <class Opt>
    void update(const Opt& opt)
    {
        if (sharded()) {
            update_sharded(opt);
            return;
        }
        set_.each([&](std::size_t r) { replicas_[r].update(opt); });
    }

    // Loss sum and correct predictions over n samples: each replica of each process takes its share,
    // and the totals are summed over the processes.
    Evaluation evaluate(const input_element* x, const std::int32_t* labels, std::size_t n)
    {
        std::vector<Evaluation> parts(replicas_.size());
        set_.each([&](std::size_t r) {
            const Share s = samples_of(r, n, 0);
            parts[r] = replicas_[r].evaluate(x + s.offset * input_shape::size, labels + s.offset * label_size, s.count);
        });
        double total[2] = {0.0, 0.0};
        for (const auto& p : parts) {
            total[0] += p.loss_sum;
            total[1] += double(p.correct);
        }
        set_.comm().sum_across_processes(total, 2);
        return {total[0], std::size_t(total[1] + 0.5)};
    }

    void predict(const input_element* x, std::size_t n, float* out)
    {
        set_.each([&](std::size_t r) {
            const Share s = share(n, replicas_.size(), r);
            replicas_[r].predict(x + s.offset * input_shape::size, s.count, out + s.offset * output_shape::size);
        });
    }

private:
    bool sharded() const { return options_.shard == Shard::optimizer_state; }
    static DataParallelOptions check_options(DataParallelOptions o)
    {
        core::require(o.shard == Shard::none || !o.processes,
                      "DataParallelOptions::shard: sharded optimizer state runs in one process; across processes, "
                      "use Shard::none");
        return o;
    }
    // M's optimizer state (its planes) to the replicas, each its shard in its own planes.
    void hand_shards(std::span<const float> s)
    {
        const std::size_t per = trainable_count ? s.size() / trainable_count : 0;
        const std::vector<float> by_parameter = shard_state_.parameter_major(s, trainable_count);
        for (std::size_t r = 0; r < replicas_.size(); ++r) {
            const Share part = share(trainable_count, replicas_.size(), r);
            replicas_[r].set_shard_state(shard_state_.plane_major(
                std::span<const float>(by_parameter).subspan(part.offset * per, part.count * per), part.count));
        }
    }
    // ZeRO-1: each replica updates its shard, then copies every other replica's updated range.
    template <class Opt>
    void update_sharded(const Opt& opt)
    {
        static_assert(!M::chain::spans_devices,
                      "DataParallelOptions::shard: a model holding a nested DataParallel cannot shard its optimizer state");
        const std::size_t R = replicas_.size();
        if (shard_state_.adopt<Opt>()) hand_shards(shard_state_.take());
        shard_ranges_.resize(R);
        shard_done_.resize(R);
        set_.each([&](std::size_t r) {
            const Share part = share(trainable_count, R, r);
            shard_ranges_[r] = replicas_[r].update_shard(opt, part.offset, part.offset + part.count);
            shard_done_[r] = replicas_[r].visit([](auto& ctx) { return ctx.mark(); });
        });
        set_.each([&](std::size_t r) {
            for (std::size_t q = 0; q < R; ++q) {
                const auto [begin, end] = shard_ranges_[q];
                if (q != r && begin < end)
                    replicas_[r].copy_parameters_from(replicas_[q].parameter_data(), begin, end, shard_done_[q]);
            }
            replicas_[r].weights_follow_parameters();
        });
    }

    // Queues a step on every replica, each after before(replica) (the update of the step before), and
    // returns its slot (the replicas take slots in step; see Sequential::queue_forward_backward).
    template <class Before>
    int queue_step(const model::StepInput<input_element>& in, Before&& before)
    {
        auto queue = [&](std::size_t r, bool defer) -> std::size_t {
            const Share s = samples_of(r, in.n, 0);
            const model::Pass mine = detail::shifted(in.pass, s);
            hooks_[r] = set_.hook(r, replicas_[r].gradient_data());
            before(replicas_[r]);
            const input_element* xr = in.x + s.offset * input_shape::size;
            const std::int32_t* lr = in.labels + s.offset * label_size;
            if (defer) return replicas_[r].queue_or_defer(mine, xr, lr, s.count, in.loss_scale, hooks_[r]);
            replicas_[r].queue_forward_backward(mine, xr, lr, s.count, in.loss_scale, hooks_[r]);
            return 0;
        };
        set_.queue_step(queue, [&](std::size_t r, std::size_t k) { replicas_[r].launch_deferred(k, hooks_[r]); },
                        [&](std::size_t r) { return replicas_[r].gradient_data(); },
                        [&](std::size_t r) { replicas_[r].mark_step(replicas_[r].last_slot()); });
        return replicas_.front().last_slot();
    }

    // Waits for every replica's loss and all-reduce of the step in `slot`; the loss over every replica
    // of every process.
    double finish_step(int slot)
    {
        double total = 0.0;
        for (auto& m : replicas_) total += m.finish_step(slot);
        set_.comm().sum_across_processes(&total, 1);
        return total;
    }

    // Waits for the step queued ahead, if any, and forgets it.
    void drop_ahead()
    {
        ahead_.drop([&](int slot) {
            for (auto& m : replicas_) m.finish_step(slot);
            return 0.0;
        });
    }

    void start()
    {
        static_assert(model::TrainableModel<DataParallel>);
        std::vector<backend::AnyContext> contexts;
        for (const auto& m : replicas_) contexts.push_back(m.context());
        set_.connect(contexts, options_.processes, options_.gradient_reduction);
        hooks_.assign(replicas_.size(), {});
        exact_ptrs_.assign(replicas_.size(), nullptr);
    }

    int process_count() const { return options_.processes ? options_.processes->size() : 1; }
    std::size_t global_index(std::size_t r) const
    {
        return (options_.processes ? std::size_t(options_.processes->rank()) : 0) * replicas_.size() + r;
    }
    // The samples of an n-sample batch that local replica r trains on: its share of the samples (fast
    // mode, shard = 0) or of the micro-shards of `shard` samples (reproducible mode), by global index.
    Share samples_of(std::size_t r, std::size_t n, std::size_t shard) const
    {
        if (shard == 0) return share(n, global_replica_count(), global_index(r));
        const Share s = share((n + shard - 1) / shard, global_replica_count(), global_index(r));
        const std::size_t begin = std::min(n, s.offset * shard);
        return {begin, std::min(n, (s.offset + s.count) * shard) - begin};
    }

    std::vector<Device> devices_;
    DataParallelOptions options_;
    std::vector<M> replicas_;
    ReplicaSet<Dispatch> set_;
    std::vector<typename ReplicaSet<Dispatch>::Hook> hooks_;   // this step's, one a replica
    model::QueueAhead<input_element> ahead_;
    std::vector<std::int64_t*> exact_ptrs_;   // reproducible mode: each replica's exact accumulator
    std::vector<double> shard_loss_;
    std::vector<std::pair<std::size_t, std::size_t>> shard_ranges_;   // ZeRO-1: each replica's updated range
    model::SlicedState shard_state_;   // ZeRO-1: the optimizer state's planes; a state set before the first update
    std::vector<core::Event> shard_done_;                             // and the mark after its update
};

template <class T>
struct is_data_parallel : std::false_type {};
template <class M, class D>
struct is_data_parallel<DataParallel<M, D>> : std::true_type {};

} // namespace replica::parallel

namespace REPLICA_NAMESPACE {
using parallel::DataParallel;
using parallel::DataParallelOptions;
using parallel::GradientReduction;
using parallel::Shard;
} // namespace replica
