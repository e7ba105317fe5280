#pragma once
// Sequential<Input<...>, Layers...>: a model. Layers run one after the other; shapes, parameter
// count and the parameter layout are fixed at compile time.
//
//   using LeNet = Sequential<Input<1, 28, 28>, Conv2d<20, 5>, MaxPool2d<2>, ..., Linear<10>>;
//   LeNet net{Device::cpu()};         // parameters initialised from seed 0
//
// A Sequential is also a layer: nested in another model (as a Concat branch, or a classifier after a
// DataParallel) it needs no Input; if it has one, it must match the shape that reaches it.
//
// As a model it owns, on its device: one flat parameter buffer, one flat gradient buffer, the
// optimizer's state, and one activation arena that grows to the largest batch seen and is reused
// from then on, so a warm training step allocates nothing.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "replica/backend/backend.hpp"
#include "replica/core/error.hpp"
#include "replica/core/fixed_point.hpp"
#include "replica/layers/loss.hpp"
#include "replica/model/chain.hpp"
#include "replica/model/input.hpp"
#include "replica/model/staging.hpp"

namespace replica::model {

namespace detail {
// What a Sequential without Input has in place of a graph: it is a layer only, never a model.
struct NotAModel {
    using input_shape = Shape<1>;
    using output_shape = Shape<1>;
    static constexpr std::size_t param_count = 0, saved_size = 0;
    explicit NotAModel(const Build&) {}
};

template <class... Es>
struct entries {
    static constexpr bool has_input = false;
    template <class In>
    using chain = Chain<In, Es...>;
    using graph = NotAModel;
};
template <class I, class... Es>
    requires is_input<I>::value
struct entries<I, Es...> {
    static constexpr bool has_input = true;
    using input_shape = typename I::shape;
    template <class In>
    using chain = Chain<In, Es...>;
    using graph = Chain<input_shape, Es...>;
};
} // namespace detail

template <class... Entries>
class Sequential {
    using entries = detail::entries<Entries...>;

public:
    // ---- as a layer ----
    template <class In>
    static constexpr bool input_matches()
    {
        if constexpr (entries::has_input) return std::is_same_v<typename entries::input_shape, In>;
        else return true;
    }

    template <class In>
    struct op : entries::template chain<In> {
        static_assert(input_matches<In>(),
                      "a nested model's Input<...> does not match the shape that reaches it: fix the Input "
                      "or the layers before it");
        using entries::template chain<In>::chain;
    };

    // ---- as a model ----
    using graph = typename entries::graph;
    using input_shape = typename graph::input_shape;
    using output_shape = typename graph::output_shape;
    using loss = layers::SoftmaxCrossEntropy;
    static constexpr std::size_t param_count = graph::param_count;
    static constexpr std::size_t label_size = loss::template label_size<output_shape>;

    // On the default device (the first GPU, or the CPU); nested DataParallels use every default device.
    Sequential() : Sequential(backend::default_devices()) {}
    explicit Sequential(Device device, std::uint64_t seed = 0) : Sequential(std::vector<Device>{device}, seed) {}
    // devices[0] holds the model; a nested DataParallel replicates over all of them. first_layer_id
    // numbers the layers (for random streams) when the model is a replica nested in a larger one.
    explicit Sequential(std::vector<Device> devices, std::uint64_t seed = 0, std::uint32_t first_layer_id = 0)
        : devices_(check_devices(std::move(devices))),
          ctx_(backend::make_context(devices_.front())),
          graph_(Build{first_layer_id, devices_})
    {
        visit([&](auto& ctx) {
            params_ = ctx.template allocate<float>(param_count);
            grads_ = ctx.template allocate<float>(param_count);
        });
        std::vector<float> host(param_count);
        graph_.init(host.data(), seed);
        set_parameters(host);
    }

    Sequential(Sequential&&) = default;
    Sequential& operator=(Sequential&&) = default;

    const Device& device() const { return devices_.front(); }
    std::span<const Device> devices() const { return devices_; }
    // Devices that hold a replica of (part of) the model: all of them with a nested DataParallel.
    std::size_t replica_count() const { return graph::has_data_parallel ? devices_.size() : 1; }
    // Over every process: a Sequential lives in one (a DataParallel spans processes).
    std::size_t global_replica_count() const { return replica_count(); }
    int process_rank() const { return 0; }
    std::string description() const
    {
        std::string s = device().name();
        if constexpr (graph::has_data_parallel) {
            s += " (nested DataParallel over ";
            for (std::size_t i = 0; i < devices_.size(); ++i) s += (i ? "," : "") + devices_[i].name();
            s += ")";
        }
        return s;
    }

    // Host copies of the flat parameter and gradient vectors.
    std::vector<float> parameters() const { return download(params_, param_count); }
    std::vector<float> gradients() const { return download(grads_, param_count); }

    void set_parameters(std::span<const float> w)
    {
        core::require(w.size() == param_count, "set_parameters: got " + std::to_string(w.size()) +
                                                   " values, the model has " + std::to_string(param_count));
        drop_ahead();   // it computed with the old parameters
        visit([&](auto& ctx) {
            ctx.upload(params_.data(), w.data(), param_count);
            graph_.sync(ctx, params_.data(), nullptr, 0);
        });
    }

    // Optimizer state (momentum...), host copy; empty before the first update.
    std::vector<float> optimizer_state() const { return download(state_, state_.size()); }
    void set_optimizer_state(std::span<const float> s)
    {
        visit([&](auto& ctx) {
            core::require(s.size() % param_count == 0, "set_optimizer_state: " + std::to_string(s.size()) +
                                                              " values is not a whole number per parameter");
            if (state_.size() != s.size()) state_ = ctx.template allocate<float>(s.size());
            ctx.upload(state_.data(), s.data(), s.size());
            graph_.sync(ctx, params_.data(), state_.data(), s.size() / param_count);
        });
    }

    // ---- the training interface (train_step, Trainer and DataParallel use it) ----

    // Forward, loss and backward over n samples (host memory, or memory of another device). Gradients
    // are ASSIGNED, scaled so that they are the gradient of loss_scale * (sum of the n losses).
    // hook(offset) is called as soon as the work producing gradients from `offset` to the end of the
    // buffer has been queued. Returns the sum of the losses, once everything has finished.
    template <class Hook = detail::NoHook>
    double forward_backward(const Pass& pass, const float* x, const std::int32_t* labels, std::size_t n,
                            float loss_scale, Hook&& hook = {})
    {
        drop_ahead();
        const int slot = queue_forward_backward(pass, x, labels, n, loss_scale, hook);
        visit([](auto& ctx) { ctx.synchronize(); });
        return loss::template finish<output_shape>(loss_slots_[slot]);
    }

    // A training step as train_step takes it: forward, loss, backward and the update (opt), and, given
    // the next step's batch, that step's forward and backward too, all queued before the host waits;
    // the host waits only for this step's loss. So the GPU goes from one step to the next without
    // waiting for the host, which meanwhile reads the loss and comes back with the next call. A step
    // whose batch was queued ahead (the `next` of the call before) is not queued again; a call on
    // other data, or set_parameters() in between, drops the work queued ahead. Returns the sum of
    // the losses. Same floats as forward_backward, then update, step after step.
    template <class Opt>
    double step(const StepInput& in, const Opt& opt, const StepInput* next = nullptr)
    {
        int slot = 0;
        if (ahead_ && ahead_->first == in) {
            slot = ahead_->second;
        } else {
            drop_ahead();
            slot = queue_forward_backward(in.pass, in.x, in.labels, in.n, in.loss_scale);
            mark_step(slot);
        }
        ahead_.reset();
        update(opt);
        if (next != nullptr && next->n > 0) {
            ahead_.emplace(*next, queue_forward_backward(next->pass, next->x, next->labels, next->n, next->loss_scale));
            mark_step(ahead_->second);
        }
        return finish_step(slot);
    }

    // forward_backward in parts, for DataParallel: queue the work (on a GPU it runs asynchronously;
    // returns the step's slot, 0 or 1, taken in turn), mark_step(slot) once everything the host must
    // wait for is queued, then finish_step(slot): wait for that and read the loss. Between them other
    // devices' work can be queued. At most two steps may be queued and not finished.
    template <class Hook = detail::NoHook>
    int queue_forward_backward(const Pass& pass, const float* x, const std::int32_t* labels, std::size_t n,
                               float loss_scale, Hook&& hook = {})
    {
        return visit([&](auto& ctx) {
            const int slot = next_slot();
            queue(ctx, pass, x, labels, n, loss_scale, slot, hook);
            return slot;
        });
    }
    void mark_step(int slot)
    {
        visit([&](auto& ctx) { marks_[slot] = ctx.mark_for_host(slot); });
    }
    double finish_step(int slot)
    {
        visit([&](auto& ctx) { ctx.synchronize(marks_[slot]); });
        return loss::template finish<output_shape>(loss_slots_[slot]);
    }
    // The slot of the last step queued (queue_or_defer's).
    int last_slot() const { return slot_; }
    // queue_forward_backward for one thread driving several GPUs (DataParallel<M, SingleThread>): a
    // step replayed from CUDA graphs queues what comes before its graphs and returns how many graph
    // segments it left to launch_deferred(k, hook), k = 0, 1, ..., so that the caller can launch every
    // replica's segment k before any replica's k + 1 (the GPUs then start within a launch of each
    // other, not a whole step's launches apart). Otherwise it queues everything and returns 0.
    template <class Hook>
    std::size_t queue_or_defer(const Pass& pass, const float* x, const std::int32_t* labels, std::size_t n,
                               float loss_scale, Hook& hook)
    {
        return visit([&](auto& ctx) { return queue(ctx, pass, x, labels, n, loss_scale, next_slot(), hook, true); });
    }
    template <class Hook>
    void launch_deferred(std::size_t k, Hook& hook)
    {
        visit([&](auto& ctx) {
            if constexpr (!std::remove_cvref_t<decltype(ctx)>::host_visible)
                launch_segment(ctx, (*ctx.graph({deferred_.first, deferred_.second}))[k], hook);
        });
    }

    // Parameters and optimizer state (state_size values) copied from w and state, memory of this
    // device or another, once `after` has happened there (a nested DataParallel's replicas after an
    // update made on its first replica).
    void copy_state_from(const float* w, const float* state, std::size_t state_size, core::Event after)
    {
        visit([&](auto& ctx) {
            ctx.wait(after);
            if (state_.size() != state_size) state_ = ctx.template allocate<float>(state_size);
            ctx.download(params_.data(), w, param_count);
            ctx.download(state_.data(), state, state_size);
        });
    }


    // The two halves of forward_backward, for a replica nested in a larger model (DataParallel::op):
    // forward_train keeps its activations for backward_from, which ASSIGNS the gradients (calling
    // hook(offset) as forward_backward does) and writes the input gradient to dx (memory of this device
    // or another one; may be null). Both queue their work; forward_train returns the output in this
    // model's memory.
    const float* forward_train(const Pass& pass, const float* x, std::size_t n)
    {
        return visit([&](auto& ctx) -> const float* {
            reserve(ctx, n);
            last_x_ = staging_.take(ctx, x, nullptr, n).first;
            last_n_ = n;
            if (n) graph_.forward(ctx, pass, forward_args(last_x_, n));
            return y(n);
        });
    }
    template <class Hook = detail::NoHook>
    void backward_from(const Pass& pass, const float* dy_in, float* dx, Hook&& hook = {})
    {
        visit([&](auto& ctx) {
            const std::size_t n = last_n_;
            if (n == 0) {
                fill(ctx, grads_.data(), 0.0f, param_count);
                hook(std::size_t{0});
                return;
            }
            const float* dyd = ctx.stage(dy_in, dy(n), n * output_shape::size);
            // On a device, dx is written here first, then copied where it is wanted.
            float* mine = dx == nullptr || std::remove_cvref_t<decltype(ctx)>::host_visible ? dx : input_grad_.data();
            graph_.backward(ctx, pass,
                            BackwardArgs{.params = params_.data(), .x = last_x_, .y = y(n), .dy = dyd, .dx = mine,
                                         .dparams = grads_.data(), .n = n, .saved = saved(), .scratch = scratch(n)},
                            hook);
            if (mine != dx) ctx.download(dx, mine, n * input_shape::size);
        });
    }

    // The reproducible mode's half of a step, in two halves like forward_backward. Samples [0, n) are
    // cut into micro-shards of `shard` samples, numbered from first_shard; each shard's gradient is
    // computed on its own and added, in fixed point (core/fixed_point.hpp), to this model's exact
    // accumulator, which starts from zero. So the sum depends on the shard size, never on how many
    // replicas share the shards or in which order they are summed. Returns the accumulator (in this
    // model's memory) for the replicas' exact all-reduce; set_gradients_exact() turns the summed
    // accumulator into the gradient. Every kernel is deterministic from the first call on (on a GPU:
    // the libraries' deterministic choices, kept afterwards). On a GPU the shards are replayed from a
    // CUDA graph, as a training step is (keyed by batch and shard size), but in a nested DataParallel.
    std::int64_t* queue_shard_gradients(const Pass& pass, const float* x, const std::int32_t* labels, std::size_t n,
                                        float loss_scale, std::size_t shard, std::size_t first_shard)
    {
        core::require(shard > 0, "the reproducible mode needs a micro-shard of at least 1 sample");
        drop_ahead();
        const std::size_t shards = (n + shard - 1) / shard;
        first_shard_ = first_shard;
        shard_count_ = shards;
        return visit([&](auto& ctx) {
            make_deterministic(ctx);
            if (exact_.size() != param_count) exact_ = ctx.template allocate<std::int64_t>(param_count);
            if (shard_slots_.size() < shards) {
                ctx.synchronize();
                if constexpr (!std::remove_cvref_t<decltype(ctx)>::host_visible) ctx.drop_graphs();   // they write the slots
                shard_slots_ = backend::host_buffer<core::LossSlot>(shards);
            }
            for (std::size_t k = 0; k < shards; ++k) shard_slots_[k] = {};
            reserve(ctx, std::min(shard, n));   // activations for one shard
            const auto [xd, ld] = stage_shards(ctx, x, labels, n);
            auto work = [&](const Pass& p, auto&&) {
                zero_fixed(ctx, exact_.data(), param_count);
                for (std::size_t k = 0; k < shards; ++k) {
                    const std::size_t begin = k * shard, m = std::min(shard, n - begin);
                    Pass mine = p;
                    mine.first_sample += begin;
                    mine.whole = true;   // a nested DataParallel computes each shard on its first replica
                    queue_pass(ctx, mine, xd + begin * input_shape::size, ld + begin * label_size, m, loss_scale,
                               &shard_slots_[k], detail::NoHook{});
                    add_fixed(ctx, grads_.data(), exact_.data(), param_count);
                }
            };
            detail::NoHook none;
            if constexpr (!std::remove_cvref_t<decltype(ctx)>::host_visible && !graph::has_data_parallel)
                if (ctx.options().graphs) {
                    // Negative slots key the shards' graphs (0 and 1 are the steps'); step parameters in slot 0.
                    replay_or_capture(ctx, pass, {n, -1 - int(std::min<std::size_t>(shard, 1 << 30))}, 0, work, none, false);
                    return exact_.data();
                }
            work(pass, none);
            return exact_.data();
        });
    }
    // Waits for the shards and writes their losses to shard_loss[shard number].
    void finish_shards(double* shard_loss)
    {
        visit([](auto& ctx) {
            ctx.synchronize();
            check_fixed(ctx);
        });
        for (std::size_t k = 0; k < shard_count_; ++k)
            shard_loss[first_shard_ + k] = loss::template finish<output_shape>(shard_slots_[k]);
    }
    // The gradients from the exact accumulator (once the replicas' accumulators have been summed).
    void set_gradients_exact()
    {
        visit([&](auto& ctx) { fixed_to_float(ctx, exact_.data(), grads_.data(), param_count); });
    }
    // The reproducible mode's gradient for one model: every shard here, summed exactly.
    double reproducible_forward_backward(const Pass& pass, const float* x, const std::int32_t* labels, std::size_t n,
                                         float loss_scale, std::size_t shard)
    {
        // OpenBLAS's sums depend on its thread count: one thread, as on every CPU replica.
        std::optional<backend::cpu::ScopedBlasThreads> one_thread;
        if (device().is_cpu()) one_thread.emplace(1);
        shard_loss_.assign((n + shard - 1) / shard, 0.0);
        queue_shard_gradients(pass, x, labels, n, loss_scale, shard, 0);
        finish_shards(shard_loss_.data());
        set_gradients_exact();
        double total = 0.0;
        for (double l : shard_loss_) total += l;
        return total;
    }

    // Applies the optimizer to this model's parameters with its gradients.
    template <class Opt>
    void update(const Opt& opt)
    {
        visit([&](auto& ctx) {
            const std::size_t need = param_count * Opt::state_per_param;
            if (state_.size() != need) state_ = ctx.template allocate<float>(need);
            graph_.update(ctx, opt, params_.data(), grads_.data(), state_.data());
        });
    }

    // Loss sum and number of correct predictions over n samples, without training (dropout off).
    struct Evaluation {
        double loss_sum = 0.0;
        std::size_t correct = 0;
    };
    Evaluation evaluate(const float* x, const std::int32_t* labels, std::size_t n)
    {
        if (n == 0) return {};
        return visit([&](auto& ctx) {
            reserve(ctx, n);
            const auto [xd, ld] = staging_.take(ctx, x, labels, n);
            graph_.forward(ctx, Pass{.training = false}, forward_args(xd, n));
            core::LossSlot* slot = &loss_slots_[2];
            *slot = {};
            loss::template forward_backward<output_shape>(ctx, y(n), ld, n, 1.0f, nullptr, slot);
            const std::size_t correct = loss::template correct<output_shape>(ctx, y(n), ld, n);   // waits
            return Evaluation{loss::template finish<output_shape>(*slot), correct};
        });
    }

    // Model outputs (logits) for n samples, into host memory out (n * output_shape::size).
    void predict(const float* x, std::size_t n, float* out)
    {
        if (n == 0) return;
        visit([&](auto& ctx) {
            reserve(ctx, n);
            const float* xd = staging_.take(ctx, x, nullptr, n).first;
            graph_.forward(ctx, Pass{.training = false}, forward_args(xd, n));
            ctx.download(out, y(n), n * output_shape::size);
            ctx.synchronize();
        });
    }

    graph& layers() { return graph_; }
    const backend::AnyContext& context() const { return ctx_; }
    float* parameter_data() { return params_.data(); }
    float* gradient_data() { return grads_.data(); }

    // Calls f(context) with this model's device made current for the calling thread.
    template <class F>
    decltype(auto) visit(F&& f)
    {
        return std::visit([&](auto& ctx) -> decltype(auto) { ctx.activate(); return f(ctx); }, ctx_);
    }
    template <class F>
    decltype(auto) visit(F&& f) const
    {
        return std::visit([&](auto& ctx) -> decltype(auto) { ctx.activate(); return f(ctx); }, ctx_);
    }

private:
    static std::vector<Device> check_devices(std::vector<Device> d)
    {
        static_assert(entries::has_input,
                      "a model needs Input<...> as its first entry, as in Sequential<Input<1, 28, 28>, ...>");
        core::require(!d.empty(), "a model needs a device: pass Device::cpu() or Device::cuda(i)");
        return d;
    }

    // Queues forward, loss and backward over n samples: a training step in `step_slot` (its staging
    // buffer, loss slot and graphs). With `defer`, see queue_or_defer.
    template <class Ctx, class Hook>
    std::size_t queue(Ctx& ctx, const Pass& pass, const float* x, const std::int32_t* labels, std::size_t n,
                      float loss_scale, int step_slot, Hook&& hook, bool defer = false)
    {
        core::LossSlot* slot = &loss_slots_[step_slot];
        *slot = {};
        if (n == 0) {   // nothing to learn from: a zero gradient, so that sums over replicas stay exact
            fill(ctx, grads_.data(), 0.0f, param_count);
            hook(std::size_t{0});
            return 0;
        }
        reserve(ctx, n);
        const auto [xd, ld] = staging_.take_for_step(ctx, x, labels, n, step_slot);
        auto work = [&](const Pass& p, auto&& on_layer) { queue_pass(ctx, p, xd, ld, n, loss_scale, slot, on_layer); };
        if constexpr (!Ctx::host_visible && !graph::has_data_parallel)
            if (ctx.options().graphs) return replay_or_capture(ctx, pass, {n, step_slot}, step_slot, work, hook, defer);
        work(pass, hook);
        return 0;
    }

    // Forward, loss (into *slot) and backward over n samples already in the context's memory.
    template <class Ctx, class Hook>
    void queue_pass(Ctx& ctx, const Pass& pass, const float* xd, const std::int32_t* ld, std::size_t n, float loss_scale,
                    core::LossSlot* slot, Hook&& on_layer)
    {
        graph_.forward(ctx, pass, forward_args(xd, n));
        loss::template forward_backward<output_shape>(ctx, y(n), ld, n, loss_scale, dy(n), slot);
        graph_.backward(ctx, pass,
                        BackwardArgs{.params = params_.data(), .x = xd, .y = y(n), .dy = dy(n), .dx = nullptr,
                                     .dparams = grads_.data(), .n = n, .saved = saved(), .scratch = scratch(n)},
                        on_layer);
    }

    // The reproducible mode's n samples in the context's memory, all at once (its shards then read
    // them where they are: a graph of the shards holds no copy from host memory).
    template <class Ctx>
    std::pair<const float*, const std::int32_t*> stage_shards(Ctx& ctx, const float* x, const std::int32_t* labels,
                                                              std::size_t n)
    {
        if constexpr (Ctx::host_visible) {
            return {x, labels};
        } else {
            if (shard_inputs_.size() < n * input_shape::size) {
                ctx.synchronize();
                ctx.drop_graphs();   // they read the old buffers
                shard_inputs_ = ctx.template allocate<float>(n * input_shape::size);
                shard_labels_ = ctx.template allocate<std::int32_t>(n * label_size);
            }
            ctx.stage(x, shard_inputs_.data(), n * input_shape::size);
            ctx.stage(labels, shard_labels_.data(), n * label_size);
            return {shard_inputs_.data(), shard_labels_.data()};
        }
    }

    // CUDA graphs: the first step of a (batch size, staging buffer) runs eagerly (plans, workspaces and
    // scratch grow then), the second is captured, and later ones replay it. Dropout reads the step's
    // seed and first sample from device memory, so the captured kernels get offset 0. Where the hook
    // has work (detail::hook_acts), the capture is cut: the segment so far is kept and launched, the
    // hook runs eagerly (a DataParallel replica queues an all-reduce on its communication stream),
    // and the capture goes on in a new segment; a replay launches the segments and calls the hook
    // at the same cuts. So a graph never holds a collective, and communication still overlaps backward.
    template <class Ctx, class Work, class Hook>
    std::size_t replay_or_capture(Ctx& ctx, const Pass& pass, const typename Ctx::GraphKey& key, int slot, Work& work,
                                  Hook& hook, bool defer)
    {
        ctx.set_step(slot, pass.seed, pass.first_sample);
        if (const auto* segments = ctx.graph(key)) {
            if (defer) {   // launch_deferred() launches them
                deferred_ = {key.n, key.slot};
                return segments->size();
            }
            for (const auto& s : *segments) launch_segment(ctx, s, hook);
            return 0;
        }
        if (ctx.first_time(key)) {
            work(pass, hook);
            return 0;
        }
        bool in_hook = false;
        auto cut = [&](std::size_t from) {
            if (!detail::hook_acts(hook, from)) return;
            ctx.end_segment(key, from);
            in_hook = true;
            hook(from);
            in_hook = false;
            ctx.begin_capture();
        };
        ctx.begin_capture();
        try {
            work(Pass{.seed = pass.seed, .first_sample = 0, .training = pass.training}, cut);
            ctx.end_capture(key);
            return 0;
        } catch (const std::exception& e) {
            ctx.abandon_capture(key);
            if (in_hook) throw;   // the hook's own error (a failed all-reduce), not the capture's
            throw Error(std::string("capturing a training step in a CUDA graph failed: ") + e.what() +
                        ". Turn backend::cuda::default_options().graphs off");
        }
    }

    // One replayed segment, then the step's hook at its cut.
    template <class Ctx, class Hook>
    static void launch_segment(Ctx& ctx, const typename Ctx::Segment& segment, Hook& hook)
    {
        ctx.launch(segment.exec);
        if (segment.cut != Ctx::Segment::no_cut) hook(segment.cut);
    }

    int next_slot() { return slot_ = 1 - slot_; }
    // Waits for the step queued ahead, if any (its buffers are the next step's but one), and forgets it.
    void drop_ahead()
    {
        if (ahead_) finish_step(ahead_->second);
        ahead_.reset();
    }

    template <class Ctx>
    void reserve(Ctx& ctx, std::size_t n)
    {
        if (n <= capacity_) return;
        ctx.synchronize();   // no step still queued reads the buffers replaced here
        const std::size_t out = output_shape::size;
        arena_ = ctx.template allocate<float>(n * (graph::saved_size + 2 * out) + graph_.scratch_size(ctx, n));
        if constexpr (!Ctx::host_visible) {
            ctx.drop_graphs();   // they point into the buffers replaced here
            staging_.reserve(ctx, n);
            input_grad_ = ctx.template allocate<float>(n * input_shape::size);
        }
        capacity_ = n;
    }

    ForwardArgs forward_args(const float* x, std::size_t n)
    {
        return ForwardArgs{.params = params_.data(), .x = x, .y = y(n), .n = n, .saved = saved(), .scratch = scratch(n)};
    }
    float* saved() { return arena_.data(); }
    float* y(std::size_t) { return arena_.data() + capacity_ * graph::saved_size; }
    float* dy(std::size_t) { return y(0) + capacity_ * output_shape::size; }
    float* scratch(std::size_t) { return dy(0) + capacity_ * output_shape::size; }

    std::vector<float> download(const core::Buffer<float>& b, std::size_t n) const
    {
        std::vector<float> out(n);
        visit([&](auto& ctx) {
            ctx.download(out.data(), b.data(), n);
            ctx.synchronize();
        });
        return out;
    }

    std::vector<Device> devices_;
    backend::AnyContext ctx_;
    graph graph_;
    core::Buffer<float> params_, grads_, state_;
    core::Buffer<float> arena_;
    Staging<input_shape::size, label_size> staging_;   // inputs in device memory, one buffer a step in flight
    core::Buffer<float> input_grad_;                                          // nested replicas on a device
    // Page-locked: the losses of the two steps that may be in flight (by slot), then evaluate()'s.
    core::Buffer<core::LossSlot> loss_slots_ = backend::host_buffer<core::LossSlot>(3);
    core::Event marks_[2];   // what the host waits for of each step in flight (mark_step)
    int slot_ = 1;           // the slot of the last step queued; the first takes 0
    std::optional<std::pair<StepInput, int>> ahead_;   // the step queued ahead by step(), and its slot
    std::size_t capacity_ = 0;
    const float* last_x_ = nullptr;
    std::size_t last_n_ = 0;
    std::pair<std::size_t, int> deferred_{0, 0};   // the graph key of the segments queue_or_defer left
    // The reproducible mode's exact accumulator and one loss slot per shard.
    core::Buffer<std::int64_t> exact_;
    core::Buffer<core::LossSlot> shard_slots_;
    core::Buffer<float> shard_inputs_;   // stage_shards'
    core::Buffer<std::int32_t> shard_labels_;
    std::size_t first_shard_ = 0, shard_count_ = 0;
    std::vector<double> shard_loss_;
};

template <class T>
struct is_sequential : std::false_type {};
template <class... E>
struct is_sequential<Sequential<E...>> : std::true_type {};

} // namespace replica::model

namespace replica {
using model::Sequential;
} // namespace replica
