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
// backward produces them (Threaded) or right after it (SingleThread); every replica applies the same
// update to its own copy. Parameters are never copied or broadcast per step.
//
// Random choices are keyed on the global sample index, so a model with dropout trains the same on 1
// or N replicas; results equal the single model's up to float summation order.
//
// Nested in a larger model it is a layer: see DataParallel::op.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "replica/backend/backend.hpp"
#include "replica/model/sequential.hpp"
#include "replica/parallel/communicators.hpp"
#include "replica/parallel/dispatch.hpp"
#include "replica/parallel/scaling.hpp"
#include "replica/parallel/worker_pool.hpp"

namespace replica::parallel {

struct DataParallelOptions {
    // Gradients are all-reduced in buckets of about this many floats, from the last layer's back.
    std::size_t bucket_floats = std::size_t{1} << 20;
    // ... but the first bucket (the last layers) closes at this many (or bucket_floats, if smaller), so
    // that communication starts early in backward: 1 MiB, as PyTorch DDP's first bucket. LeNet's
    // gradient (431k floats) is then two buckets, its classifier's reduced during its convolutions'
    // backward (2 H200s: 0.298 -> 0.288 ms a step, one thread; 0.307 -> 0.282, threaded).
    std::size_t first_bucket_floats = std::size_t{1} << 18;
    // Several processes (parallel/mpi.hpp): this process's replicas are part of every process's.
    // Every process must hold the same number of replicas. Not owned; must outlive the DataParallel.
    ProcessGroup* processes = nullptr;
};

namespace detail {
// [begin, end) ranges of the gradient buffer, last layers first, cut at layer boundaries: the first
// at least min(first, floats) long, the others at least `floats` (but the one holding the first layers).
template <class Graph>
std::vector<std::pair<std::size_t, std::size_t>> make_buckets(std::size_t first, std::size_t floats)
{
    std::vector<std::pair<std::size_t, std::size_t>> out;
    const auto& off = Graph::param_offset;
    std::size_t end = off.back();
    for (std::size_t i = off.size() - 1; i-- > 0;) {
        const std::size_t wanted = out.empty() ? std::min(first, floats) : floats;
        if (end - off[i] >= wanted || (i == 0 && end > off[i])) {
            out.emplace_back(off[i], end);
            end = off[i];
        }
    }
    return out;
}

inline std::vector<Device> check_replica_devices(std::vector<Device> devices)
{
    core::require(!devices.empty(), "DataParallel needs at least one device");
    for (std::size_t i = 0; i < devices.size(); ++i)
        for (std::size_t j = 0; j < i; ++j)
            core::require(!(devices[i] == devices[j]),
                          "device " + devices[i].name() + " appears twice in the DataParallel device list");
    return devices;
}

// The gradient all-reduce in buckets, started as backward produces them: what a DataParallel model
// and a DataParallel nested in a model share. Each replica's backward gets a hook(comm, r, gradient);
// SingleThread then reduces the buckets in after_backward, one group call each.
template <class Dispatch>
class BucketedReduce {
public:
    using Bucket = std::pair<std::size_t, std::size_t>;
    BucketedReduce(std::vector<Bucket> buckets, std::size_t replicas) : buckets_(std::move(buckets)), ptrs_(replicas) {}
    std::size_t size() const { return buckets_.size(); }

    // Replica r's backward hook: called as backward queues each layer (with the offset from which the
    // gradient is complete), it starts reducing every bucket that is complete: Threaded reduces it
    // there (every replica's thread calls), SingleThread marks it produced. acts() says whether a call
    // would start one: a step captured in CUDA graphs is cut there (Sequential::replay_or_capture).
    struct Hook {
        const BucketedReduce* reduce;
        Communicator* comm;
        std::size_t r;
        float* gradient;
        std::size_t next = 0;
        bool acts(std::size_t from) const { return next < reduce->buckets_.size() && reduce->buckets_[next].first >= from; }
        void operator()(std::size_t from)
        {
            for (; acts(from); ++next) {
                const auto [begin, end] = reduce->buckets_[next];
                if constexpr (std::same_as<Dispatch, Threaded>) {
                    comm->all_reduce(r, gradient + begin, end - begin, next);
                    // After the last bucket: later work waits for the reductions.
                    if (next + 1 == reduce->buckets_.size()) comm->wait(r);
                } else {
                    comm->produced(r, next);
                }
            }
        }
    };
    Hook hook(Communicator& comm, std::size_t r, float* gradient) const { return Hook{this, &comm, r, gradient}; }

    // After every replica's backward has been queued (gradient_of(r): replica r's gradient buffer).
    template <class GradientOf>
    void after_backward(Communicator& comm, GradientOf&& gradient_of)
    {
        if constexpr (std::same_as<Dispatch, SingleThread>)
            for (std::size_t b = 0; b < buckets_.size(); ++b) {
                for (std::size_t r = 0; r < ptrs_.size(); ++r) ptrs_[r] = gradient_of(r) + buckets_[b].first;
                comm.group_all_reduce(ptrs_, buckets_[b].second - buckets_[b].first, b);
            }
    }

private:
    std::vector<Bucket> buckets_;
    std::vector<float*> ptrs_;
};
} // namespace detail

template <class M, DispatchPolicy Dispatch = SingleThread>
class DataParallel {
    static_assert(model::is_sequential<M>::value,
                  "DataParallel<M>: M must be a model, a Sequential<Input<...>, ...>");

public:
    using replica_type = M;
    using dispatch = Dispatch;
    using input_shape = typename M::input_shape;
    using output_shape = typename M::output_shape;
    using loss = typename M::loss;
    static constexpr std::size_t param_count = M::param_count;
    static constexpr std::size_t label_size = M::label_size;

    // One replica of M on each device, all initialised from `seed`.
    explicit DataParallel(std::vector<Device> devices = backend::default_devices(), std::uint64_t seed = 0,
                          DataParallelOptions options = {})
        : devices_(detail::check_replica_devices(std::move(devices))), options_(options)
    {
        replicas_.reserve(devices_.size());
        for (const auto& d : devices_) replicas_.emplace_back(std::vector<Device>{d}, seed);
        start();
    }

    // Replicates an existing model (its parameters and optimizer state) over `devices`.
    DataParallel(M&& model, std::vector<Device> devices, DataParallelOptions options = {})
        : devices_(detail::check_replica_devices(std::move(devices))), options_(options)
    {
        const auto w = model.parameters();
        const auto state = model.optimizer_state();
        replicas_.reserve(devices_.size());
        for (const auto& d : devices_) {
            if (replicas_.empty() && model.device() == d) replicas_.push_back(std::move(model));
            else {
                replicas_.emplace_back(std::vector<Device>{d});
                replicas_.back().set_parameters(w);
                if (!state.empty()) replicas_.back().set_optimizer_state(state);
            }
        }
        start();
    }

    // ---- as a layer: Sequential<Input<...>, DataParallel<Features, Threaded>, Classifier> ----
    // Replica 0 runs in the parent model's context on the parent's memory (its parameters are the
    // parent's slice); replicas 1.. are models of their own on the other devices of the parent's
    // list. Forward scatters the input and gathers the outputs into the parent's output; backward
    // scatters the output gradient, all-reduces the replicas' parameter gradients into the parent's
    // slice and gathers the input gradient. Each replica applies the update to its own copy.
    template <class In>
    class op {
        static_assert(std::is_same_v<In, typename M::input_shape>,
                      "DataParallel<M> nested in a model: M's Input<...> must match the shape that reaches it");
        using graph = typename M::graph;

    public:
        using input_shape = In;
        using output_shape = typename M::output_shape;
        static constexpr std::size_t param_count = M::param_count;
        static constexpr std::uint32_t layer_count = graph::layer_count;
        static constexpr std::size_t saved_size = graph::saved_size;
        static constexpr bool has_data_parallel = true;

        explicit op(const model::Build& b)
            : graph0_(model::Build{b.layer_id, b.devices.first(1)}),
              reduce_(detail::make_buckets<graph>(DataParallelOptions{}.first_bucket_floats, DataParallelOptions{}.bucket_floats),
                      b.devices.size())
        {
            core::require(!b.devices.empty(), "a nested DataParallel needs at least one device");
            for (std::size_t r = 1; r < b.devices.size(); ++r)
                others_.emplace_back(std::vector<Device>{b.devices[r]}, 0, b.layer_id);
            gathered_.assign(b.devices.size(), {});
            if constexpr (std::same_as<Dispatch, Threaded>) {
                if (b.devices.front().is_cpu() && b.devices.size() > 1) blas_ = std::make_unique<backend::cpu::ScopedBlasThreads>(1);
                pool_ = std::make_unique<WorkerPool>(b.devices.size());
            }
        }

        std::size_t replica_count() const { return others_.size() + 1; }

        template <class Ctx>
        std::size_t scratch_size(const Ctx& ctx, std::size_t n) const { return graph0_.scratch_size(ctx, n); }
        void init(float* params, std::uint64_t seed) const { graph0_.init(params, seed); }

        template <class Ctx>
        void forward(Ctx& ctx, const model::Pass& pass, const model::ForwardArgs& a)
        {
            const core::Event input_ready = ctx.mark();
            const std::size_t active = pass.whole ? 1 : replica_count();
            each([&](std::size_t r) {
                if (r >= active) return;
                const Share s = share(a.n, active, r);
                const model::Pass mine = shifted(pass, s);
                if (r == 0) {
                    ctx.activate();
                    if (s.count) graph0_.forward(ctx, mine, model::ForwardArgs{a.params, a.x, a.y, s.count, a.saved, a.scratch});
                    return;
                }
                M& m = others_[r - 1];
                m.visit([&](auto& c) { c.wait(input_ready); });
                const float* y = m.forward_train(mine, a.x + s.offset * input_shape::size, s.count);
                m.visit([&](auto& c) {   // gather into the parent's output
                    c.download(a.y + s.offset * output_shape::size, y, s.count * output_shape::size);
                    gathered_[r] = c.mark();
                });
            });
            ctx.activate();   // the replicas made their own devices current
            for (std::size_t r = 1; r < active; ++r) ctx.wait(gathered_[r]);
        }

        // Each replica's gradient is all-reduced in buckets as its backward produces them (the hook of a
        // top-level DataParallel's replicas), so communication overlaps the rest of backward.
        template <class Ctx>
        void backward(Ctx& ctx, const model::Pass& pass, const model::BackwardArgs& a)
        {
            if (!comm_ && replica_count() > 1) {   // once: the parent's context is known from here on
                std::vector<backend::AnyContext> contexts{backend::AnyContext(ctx)};
                for (auto& m : others_) contexts.push_back(m.context());
                comm_ = make_communicator(contexts, reduce_.size());
            }
            const core::Event grad_ready = ctx.mark();
            const std::size_t active = pass.whole ? 1 : replica_count();
            whole_ = pass.whole;
            auto gradient_of = [&](std::size_t r) { return r == 0 ? a.dparams : others_[r - 1].gradient_data(); };
            // Replica r's backward, with `hook` told of each layer's gradient.
            auto replica_backward = [&](std::size_t r, const Share& s, auto&& hook) {
                const model::Pass mine = shifted(pass, s);
                float* dx = a.dx ? a.dx + s.offset * input_shape::size : nullptr;
                if (r == 0) {
                    ctx.activate();
                    if (s.count)
                        graph0_.backward(ctx, mine, model::BackwardArgs{a.params, a.x, a.y, a.dy, dx, a.dparams,
                                                                        s.count, a.saved, a.scratch}, hook);
                    else {
                        fill(ctx, a.dparams, 0.0f, param_count);
                        hook(std::size_t{0});
                    }
                    return;
                }
                M& m = others_[r - 1];
                m.visit([&](auto& c) { c.wait(grad_ready); });
                m.backward_from(mine, a.dy + s.offset * output_shape::size, dx, hook);
                m.visit([&](auto& c) { gathered_[r] = c.mark(); });
            };
            if (active == 1) {   // (whole: the others take replica 0's result at the update)
                replica_backward(0, share(a.n, 1, 0), model::detail::NoHook{});
                return;
            }
            each([&](std::size_t r) {
                try {
                    replica_backward(r, share(a.n, active, r), reduce_.hook(*comm_, r, gradient_of(r)));
                } catch (...) {
                    comm_->abort();
                    throw;
                }
            });
            reduce_.after_backward(*comm_, gradient_of);
            ctx.activate();
            for (std::size_t r = 1; r < replica_count(); ++r) ctx.wait(gathered_[r]);   // input gradients
            for (std::size_t r = 0; r < replica_count(); ++r) comm_->wait(r);
            ctx.activate();
        }

        template <class Ctx, class Opt>
        void update(Ctx& ctx, const Opt& opt, float* w, const float* g, float* state)
        {
            if (whole_) {   // only replica 0 has the gradient: update it, then copy it to the others
                ctx.activate();
                opt.apply(ctx, w, g, state, param_count);
                const core::Event updated = ctx.mark();
                for (auto& m : others_) m.copy_state_from(w, state, param_count * Opt::state_per_param, updated);
                ctx.activate();
                return;
            }
            each([&](std::size_t r) {
                if (r == 0) {
                    ctx.activate();
                    opt.apply(ctx, w, g, state, param_count);
                } else {
                    others_[r - 1].update(opt);
                }
            });
            ctx.activate();
        }

        // The parent set its parameters (and optimizer state): copy replica 0's slice to the others.
        template <class Ctx>
        void sync(Ctx& ctx, const float* w, const float* state, std::size_t per)
        {
            if (others_.empty()) return;
            std::vector<float> host(param_count * (state ? per : 1));
            ctx.download(host.data(), state ? state : w, host.size());
            ctx.synchronize();
            for (auto& m : others_) {
                if (state) m.set_optimizer_state(host);
                else m.set_parameters(host);
            }
        }

    private:
        static model::Pass shifted(model::Pass p, const Share& s)
        {
            p.first_sample += s.offset;
            return p;
        }
        template <class F>
        void each(F&& f)
        {
            if constexpr (std::same_as<Dispatch, Threaded>) pool_->run(f);
            else
                for (std::size_t r = 0; r < replica_count(); ++r) f(r);
        }

        graph graph0_;
        std::vector<M> others_;
        detail::BucketedReduce<Dispatch> reduce_;
        std::unique_ptr<Communicator> comm_;
        std::vector<core::Event> gathered_;
        std::unique_ptr<backend::cpu::ScopedBlasThreads> blas_;   // CPU replicas, not BLAS, use the cores
        bool whole_ = false;   // the last backward ran whole on replica 0 (reproducible mode)
        std::unique_ptr<WorkerPool> pool_;
    };

    std::size_t replica_count() const { return replicas_.size(); }
    // This process's rank among the processes of the run (0 without a ProcessGroup): rank 0 writes
    // checkpoints and logs.
    int process_rank() const { return options_.processes ? options_.processes->rank() : 0; }
    // Replicas over every process (replica_count() with one process).
    std::size_t global_replica_count() const { return replicas_.size() * std::size_t(process_count()); }
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
    const DataParallelOptions& options() const { return options_; }
    std::size_t bucket_count() const { return reduce_->size(); }

    std::vector<float> parameters() const { return replicas_.front().parameters(); }
    std::vector<float> gradients() const { return replicas_.front().gradients(); }
    std::vector<float> optimizer_state() const { return replicas_.front().optimizer_state(); }
    void set_parameters(std::span<const float> w)
    {
        drop_ahead();   // it computed with the old parameters
        for (auto& r : replicas_) r.set_parameters(w);
    }
    void set_optimizer_state(std::span<const float> s)
    {
        for (auto& r : replicas_) r.set_optimizer_state(s);
    }

    // ---- the training interface (as Sequential's) ----

    double forward_backward(const model::Pass& pass, const float* x, const std::int32_t* labels, std::size_t n,
                            float loss_scale)
    {
        drop_ahead();
        return finish_step(queue_step({pass, x, labels, n, loss_scale}, [](M&) {}));
    }

    // A training step as train_step takes it (see Sequential::step): every replica's update, then,
    // given the next batch, every replica's next forward, backward and all-reduce are queued before
    // the host waits for this step's losses and all-reduce. So no GPU waits for the host between
    // steps, and the GPUs start each step together.
    template <class Opt>
    double step(const model::StepInput& in, const Opt& opt, const model::StepInput* next = nullptr)
    {
        int slot = 0;
        if (ahead_ && ahead_->first == in) {
            slot = ahead_->second;
        } else {
            drop_ahead();
            slot = queue_step(in, [](M&) {});
        }
        ahead_.reset();
        auto update = [&](M& m) { m.update(opt); };
        if (next != nullptr && next->n > 0) ahead_.emplace(*next, queue_step(*next, update));
        else each([&](std::size_t r) { update(replicas_[r]); });
        return finish_step(slot);
    }

    // The reproducible mode (see train_step): the global batch is cut into micro-shards of `shard`
    // samples; replica r takes a contiguous run of whole shards and sums their gradients in fixed
    // point; the replicas' sums are added exactly (integers) by the communicator, so the gradient and
    // the update are the same bit for bit on any number of replicas. Returns the loss summed in shard order.
    double reproducible_forward_backward(const model::Pass& pass, const float* x, const std::int32_t* labels,
                                         std::size_t n, float loss_scale, std::size_t shard)
    {
        core::require(shard > 0, "the reproducible mode needs a micro-shard of at least 1 sample");
        drop_ahead();
        const std::size_t shards = (n + shard - 1) / shard;
        shard_loss_.assign(shards, 0.0);
        // OpenBLAS's sums depend on its thread count: one thread on every CPU replica.
        std::optional<backend::cpu::ScopedBlasThreads> one_thread;
        if (devices_.front().is_cpu()) one_thread.emplace(1);
        each([&](std::size_t r) {
            const Share s = samples_of(r, n, shard);
            model::Pass mine = pass;
            mine.first_sample = pass.first_sample + s.offset;
            exact_ptrs_[r] = replicas_[r].queue_shard_gradients(mine, x + s.offset * input_shape::size,
                                                                labels + s.offset * label_size, s.count, loss_scale,
                                                                shard, s.offset / shard);
        });
        each([&](std::size_t r) { replicas_[r].finish_shards(shard_loss_.data()); });
        comm_->exact_all_reduce(exact_ptrs_, param_count);
        comm_->sum_across_processes(shard_loss_.data(), shards);   // one contributor per shard: exact
        each([&](std::size_t r) { replicas_[r].set_gradients_exact(); });
        double total = 0.0;
        for (double l : shard_loss_) total += l;
        return total;
    }

    template <class Opt>
    void update(const Opt& opt)
    {
        each([&](std::size_t r) { replicas_[r].update(opt); });
    }

    // Loss sum and correct predictions over n samples: each replica of each process takes its share,
    // and the totals are summed over the processes.
    typename M::Evaluation evaluate(const float* x, const std::int32_t* labels, std::size_t n)
    {
        std::vector<typename M::Evaluation> parts(replicas_.size());
        each([&](std::size_t r) {
            const Share s = samples_of(r, n, 0);
            parts[r] = replicas_[r].evaluate(x + s.offset * input_shape::size, labels + s.offset * label_size, s.count);
        });
        double total[2] = {0.0, 0.0};
        for (const auto& p : parts) {
            total[0] += p.loss_sum;
            total[1] += double(p.correct);
        }
        comm_->sum_across_processes(total, 2);
        return {total[0], std::size_t(total[1] + 0.5)};
    }

    void predict(const float* x, std::size_t n, float* out)
    {
        each([&](std::size_t r) {
            const Share s = share(n, replicas_.size(), r);
            replicas_[r].predict(x + s.offset * input_shape::size, s.count, out + s.offset * output_shape::size);
        });
    }

private:
    // Queues a step on every replica, each after before(replica) (the update of the step before), and
    // returns its slot (see Sequential::queue_forward_backward; the replicas take slots in step).
    // SingleThread launches the replicas' graph segments interleaved, segment k of every replica
    // before any replica's k + 1 (Sequential::queue_or_defer), then the buckets' group all-reduces;
    // Threaded queues each replica on its thread, all-reduces included, in one hand-off.
    template <class Before>
    int queue_step(const model::StepInput& in, Before&& before)
    {
        auto queue = [&](std::size_t r) {
            const Share s = samples_of(r, in.n, 0);
            model::Pass mine = in.pass;
            mine.first_sample = in.pass.first_sample + s.offset;
            hooks_[r] = reduce_->hook(*comm_, r, replicas_[r].gradient_data());
            try {
                before(replicas_[r]);
                const float* xr = in.x + s.offset * input_shape::size;
                const std::int32_t* lr = in.labels + s.offset * label_size;
                if constexpr (std::same_as<Dispatch, SingleThread>) {
                    deferred_[r] = replicas_[r].queue_or_defer(mine, xr, lr, s.count, in.loss_scale, hooks_[r]);
                } else {
                    replicas_[r].queue_forward_backward(mine, xr, lr, s.count, in.loss_scale, hooks_[r]);
                    comm_->wait(r);
                    replicas_[r].mark_step(replicas_[r].last_slot());
                }
            } catch (...) {
                comm_->abort();
                throw;
            }
        };
        if constexpr (std::same_as<Dispatch, Threaded>) {
            pool_->run(queue);
        } else {
            std::size_t most = 0;
            for (std::size_t r = 0; r < replicas_.size(); ++r) {
                queue(r);
                most = std::max(most, deferred_[r]);
            }
            try {
                for (std::size_t k = 0; k < most; ++k)
                    for (std::size_t r = 0; r < replicas_.size(); ++r)
                        if (k < deferred_[r]) replicas_[r].launch_deferred(k, hooks_[r]);
                reduce_->after_backward(*comm_, [&](std::size_t r) { return replicas_[r].gradient_data(); });
            } catch (...) {
                comm_->abort();
                throw;
            }
            for (std::size_t r = 0; r < replicas_.size(); ++r) {
                comm_->wait(r);
                replicas_[r].mark_step(replicas_[r].last_slot());
            }
        }
        return replicas_.front().last_slot();
    }

    // Waits for every replica's loss and all-reduce of the step in `slot`; the loss over every replica
    // of every process.
    double finish_step(int slot)
    {
        double total = 0.0;
        for (auto& m : replicas_) total += m.finish_step(slot);
        comm_->sum_across_processes(&total, 1);
        return total;
    }

    // Waits for the step queued ahead, if any, and forgets it.
    void drop_ahead()
    {
        if (ahead_)
            for (auto& m : replicas_) m.finish_step(ahead_->second);
        ahead_.reset();
    }

    void start()
    {
        reduce_.emplace(detail::make_buckets<typename M::graph>(options_.first_bucket_floats, options_.bucket_floats),
                        replicas_.size());
        std::vector<backend::AnyContext> contexts;
        for (const auto& m : replicas_) contexts.push_back(m.context());
        comm_ = make_communicator(contexts, reduce_->size(), options_.processes);
        hooks_.assign(replicas_.size(), {});
        deferred_.assign(replicas_.size(), 0);
        exact_ptrs_.assign(replicas_.size(), nullptr);
        if constexpr (std::same_as<Dispatch, Threaded>) {
            // Replicas, not BLAS, use the cores.
            if (devices_.front().is_cpu() && replicas_.size() > 1) blas_ = std::make_unique<backend::cpu::ScopedBlasThreads>(1);
            pool_ = std::make_unique<WorkerPool>(replicas_.size());
        }
    }

    // f(r) for every replica, as the dispatch policy says.
    template <class F>
    void each(F&& f)
    {
        if constexpr (std::same_as<Dispatch, Threaded>) pool_->run(f);
        else
            for (std::size_t r = 0; r < replicas_.size(); ++r) f(r);
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
    std::unique_ptr<Communicator> comm_;
    std::optional<detail::BucketedReduce<Dispatch>> reduce_;
    std::vector<typename detail::BucketedReduce<Dispatch>::Hook> hooks_;   // this step's, one a replica
    std::vector<std::size_t> deferred_;   // graph segments each replica left to launch (SingleThread)
    std::optional<std::pair<model::StepInput, int>> ahead_;   // the step queued ahead by step(), and its slot
    std::unique_ptr<WorkerPool> pool_;
    std::unique_ptr<backend::cpu::ScopedBlasThreads> blas_;   // CPU replicas, not BLAS, use the cores
    std::vector<std::int64_t*> exact_ptrs_;   // reproducible mode: each replica's exact accumulator
    std::vector<double> shard_loss_;
};

template <class T>
struct is_data_parallel : std::false_type {};
template <class M, class D>
struct is_data_parallel<DataParallel<M, D>> : std::true_type {};

} // namespace replica::parallel

namespace replica {
using parallel::DataParallel;
using parallel::DataParallelOptions;
} // namespace replica
