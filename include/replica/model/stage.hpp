#pragma once
// Stage<D>: a chain of layers on one context, and everything that runs it there. It owns, on its
// device: its layers (a Chain), one flat parameter buffer (and, in bf16 or fp16, its copy in that
// type, which the layers' products read), one flat gradient buffer, the optimizer's state, the
// statistics, one activation arena (model/arena.hpp) that grows to the largest batch seen and is
// reused from then on, so that a warm training step allocates nothing, and the step slots. How a step
// travels is the step pipeline's (model/step_pipeline.hpp); how it is executed, the backend's
// (backend/step_run.hpp); the reproducible mode's gradient, a strategy of its own
// (model/exact_gradient.hpp).
//
// A Sequential is its type-level description plus one Stage (model/sequential.hpp); a DataParallel
// holds one a replica; a Pipeline one a slice of the model (parallel/pipeline.hpp), each micro-batch
// in flight in an activation slot of its own (forward_train, backward_from).
//
// D, the description: chain (Chain<In, T, Layers...>), storage (T), loss, input_element (float or
// std::int32_t token ids), vocabulary (of the first layer, 0 for floats), param_rule, has_input.

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "replica/backend/backend.hpp"
#include "replica/core/config.hpp"
#include "replica/core/error.hpp"
#include "replica/core/hook.hpp"
#include "replica/layers/loss.hpp"
#include "replica/model/arena.hpp"
#include "replica/model/concepts.hpp"
#include "replica/model/exact_gradient.hpp"
#include "replica/model/input.hpp"
#include "replica/model/param_layout.hpp"
#include "replica/model/param_rules.hpp"
#include "replica/model/step_pipeline.hpp"

namespace REPLICA_NAMESPACE::model {

template <class D>
class Stage {
public:
    using chain = typename D::chain;   // the layers, bound to the stage's input shape
    using input_shape = typename chain::input_shape;
    using output_shape = typename chain::output_shape;
    using loss = typename D::loss;
    using storage = typename D::storage;   // the activations' element type
    // What a sample's inputs are (model/input.hpp): float, or std::int32_t token ids (Input<Tokens<T>>),
    // the ids of vocabulary tokens, read by the first layer.
    using input_element = typename D::input_element;
    static constexpr bool reads_tokens = std::is_same_v<input_element, std::int32_t>;
    static constexpr std::size_t vocabulary = D::vocabulary;
    // Error naming the sample and position of the first of n samples' token ids (host memory) outside
    // [0, vocabulary); nothing for floats. Every call that takes host inputs checks them before it
    // queues anything (train_step, the batch it queues ahead too).
    static void check_inputs(const input_element* x, std::size_t n)
    {
        if constexpr (reads_tokens) check_token_ids(x, n, input_shape::size, vocabulary);
    }
    static bool inputs_valid(const input_element* x, std::size_t n)
    {
        if constexpr (reads_tokens) return first_bad_token_id(x, n * input_shape::size, vocabulary) == n * input_shape::size;
        else return true;
    }
    using Evaluation = model::Evaluation;
    static constexpr std::size_t param_count = chain::param_count;
    // How the optimizer treats each parameter (model/param_rules.hpp): the model's ParamRule, else
    // DecayWeights; its plan of the flat parameters, and the parameters it trains (the optimizer state
    // holds state_per_param floats for each of them, frozen parameters none).
    using param_rule = typename D::param_rule;
    using update_plan = UpdatePlan<chain, param_rule, 0>;
    static constexpr std::size_t trainable_count = update_plan::trainable;
    // BatchNorm's running estimates and any other model state that is not trained.
    static constexpr std::size_t statistics_count = chain::statistics_count;
    // Sync points of a training step under DataParallel (core/hook.hpp).
    static constexpr std::size_t syncs = chain::syncs;
    // The reproducible mode's exact accumulator: the gradient, then the statistics' shard sums.
    static constexpr std::size_t exact_count = param_count + statistics_count;
    static constexpr std::size_t label_size = loss::template label_size<output_shape>;
    // A model none of whose convolutions runs channels-last (layers/op.hpp's wants_channels_last: every
    // one detours, as LeNet's do) keeps its activations channels-first where the backend would keep
    // them channels-last: the detours' transposes and their buffers would buy nothing. A model that
    // holds a nested DataParallel keeps the backend's layout, and so do its nested replicas.
    static constexpr bool keeps_channels_first = !chain::wants_channels_last && !chain::spans_devices;

    // On the default device (the first GPU, or the CPU); nested DataParallels use every default device.
    Stage() : Stage(backend::default_devices()) {}
    explicit Stage(Device device, std::uint64_t seed = 0) : Stage(std::vector<Device>{device}, seed) {}
    // devices[0] holds the model; a nested DataParallel replicates over all of them. first_layer_id
    // numbers the layers (for random streams) when the model is a replica nested in a larger one;
    // nested says it is one (its activations then keep the layout of the model around it, see
    // keeps_channels_first). A rank of a tensor-parallel model (parallel/tensor_parallel.hpp) gives
    // its group and rank, which its split ops sum over.
    explicit Stage(std::vector<Device> devices, std::uint64_t seed = 0, std::uint32_t first_layer_id = 0,
                        bool nested = false, TensorGroup* group = nullptr, std::size_t group_rank = 0)
        : devices_(check_devices(std::move(devices))),
          ctx_(backend::make_context(devices_.front(), keeps_channels_first && !nested)),
          chain_(Build{first_layer_id, devices_, 0, group, group_rank})
    {
        static_assert(Replica<Stage>);
        visit([&](auto& ctx) {
            params_ = ctx.template allocate<float>(param_count);
            if constexpr (reduced) weights_ = ctx.template allocate<storage>(param_count);
            grads_ = ctx.template allocate<float>(exact_count);
            stats_ = ctx.template allocate<float>(statistics_count);
        });
        std::vector<float> host(param_count);
        chain_.init(host.data(), seed);
        set_parameters(host);
        std::vector<float> stats(statistics_count);
        chain_.init_statistics(stats.data());
        set_statistics(stats);
    }

    Stage(Stage&&) = default;
    Stage& operator=(Stage&&) = default;

    const Device& device() const { return devices_.front(); }
    std::span<const Device> devices() const { return devices_; }
    // Devices that hold a replica of (part of) the model: all of them with a nested DataParallel.
    std::size_t replica_count() const { return chain::spans_devices ? devices_.size() : 1; }
    // Over every process: a Stage lives in one (a DataParallel spans processes).
    std::size_t global_replica_count() const { return replica_count(); }
    int process_rank() const { return 0; }
    std::string description() const
    {
        std::string s = device().name();
        if constexpr (chain::spans_devices) {
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
            refresh_weights(ctx);
            chain_.template sync<param_rule, 0>(ctx, params_.data(), nullptr, 0);
        });
    }

    // The model's statistics (BatchNorm's running estimates), host copy.
    std::vector<float> statistics() const { return download(stats_, statistics_count); }
    void set_statistics(std::span<const float> s)
    {
        core::require(s.size() == statistics_count, "set_statistics: got " + std::to_string(s.size()) +
                                                        " values, the model has " + std::to_string(statistics_count));
        drop_ahead();   // it computed with the old statistics
        visit([&](auto& ctx) { ctx.upload(stats_.data(), s.data(), statistics_count); });
    }

    // Optimizer state (momentum...), host copy: state_per_param floats for each trainable parameter,
    // in the order of the parameters; empty before the first update.
    std::vector<float> optimizer_state() const { return download(state_, state_.size()); }
    void set_optimizer_state(std::span<const float> s) { set_optimizer_state_with<param_rule, 0>(s); }
    // The same for a replica nested in a larger model, whose parameters follow Rule with layer ids from First.
    template <ParamRuleType Rule, std::uint32_t First>
    void set_optimizer_state_with(std::span<const float> s)
    {
        constexpr std::size_t trainable = UpdatePlan<chain, Rule, First>::trainable;
        core::require(trainable > 0 ? s.size() % trainable == 0 : s.empty(),
                      "set_optimizer_state: " + std::to_string(s.size()) + " values is not a whole number for each of the " +
                          std::to_string(trainable) + " trainable parameters");
        visit([&](auto& ctx) {
            if (state_.size() != s.size()) state_ = ctx.template allocate<float>(s.size());
            ctx.upload(state_.data(), s.data(), s.size());
            chain_.template sync<Rule, First>(ctx, params_.data(), state_.data(), trainable ? s.size() / trainable : 0);
        });
        state_given_ = !s.empty();
    }

    // ---- the training contract (model/concepts.hpp) ----

    // Forward, loss and backward over n samples (host memory, or memory of another device). Gradients
    // are ASSIGNED, scaled so that they are the gradient of loss_scale * (sum of the n losses).
    // hook(offset) is called as soon as the work producing gradients from `offset` to the end of the
    // buffer has been queued. Returns the sum of the losses, once everything has finished.
    template <class Hook = core::NoHook>
    double forward_backward(const Pass& pass, const input_element* x, const std::int32_t* labels, std::size_t n,
                            float loss_scale, Hook&& hook = {})
    {
        check_inputs(x, n);
        drop_ahead();
        const int slot = queue_forward_backward(pass, x, labels, n, loss_scale, hook);
        visit([](auto& ctx) { ctx.synchronize(); });
        return loss::template finish<output_shape>(*slots_.loss(slot));
    }

    // A training step as train_step takes it: forward, loss, backward and the update (opt), and, given
    // the next step's batch, that step's forward and backward too, all queued before the host waits
    // (model/step_pipeline.hpp). Returns the sum of the losses. Same floats as forward_backward, then
    // update, step after step.
    template <class Opt>
    double step(const StepInput<input_element>& in, const Opt& opt, const StepInput<input_element>* next = nullptr)
    {
        return ahead_.step(
            in, next,
            [&](const StepInput<input_element>& s, bool update_first) {
                if (update_first) update(opt);
                const int slot = queue_forward_backward(s.pass, s.x, s.labels, s.n, s.loss_scale);
                mark_step(slot);
                return slot;
            },
            [&] { update(opt); }, [&](int slot) { return finish_step(slot); });
    }

    // forward_backward in parts, for DataParallel: queue the work (on a GPU it runs asynchronously;
    // returns the step's slot, 0 or 1, taken in turn), mark_step(slot) once everything the host must
    // wait for is queued, then finish_step(slot): wait for that and read the loss. Between them other
    // devices' work can be queued. At most two steps may be queued and not finished.
    template <class Hook = core::NoHook>
    int queue_forward_backward(const Pass& pass, const input_element* x, const std::int32_t* labels, std::size_t n,
                               float loss_scale, Hook&& hook = {})
    {
        return visit([&](auto& ctx) {
            const int slot = slots_.next();
            queue(ctx, pass, x, labels, n, loss_scale, slot, hook);
            return slot;
        });
    }
    void mark_step(int slot)
    {
        visit([&](auto& ctx) { slots_.mark(ctx, slot); });
    }
    double finish_step(int slot)
    {
        visit([&](auto& ctx) { slots_.wait(ctx, slot); });
        return loss::template finish<output_shape>(*slots_.loss(slot));
    }
    // The slot of the last step queued.
    int last_slot() const { return slots_.last(); }
    // queue_forward_backward for one thread driving several GPUs (DataParallel<M, SingleThread>): a
    // step replayed from CUDA graphs queues what comes before its graphs and returns how many graph
    // segments it left to launch_deferred(k, hook), k = 0, 1, ..., so that the caller can launch every
    // replica's segment k before any replica's k + 1 (the GPUs then start within a launch of each
    // other, not a whole step's launches apart). Otherwise it queues everything and returns 0.
    template <class Hook>
    std::size_t queue_or_defer(const Pass& pass, const input_element* x, const std::int32_t* labels, std::size_t n,
                               float loss_scale, Hook& hook)
    {
        return visit([&](auto& ctx) { return queue(ctx, pass, x, labels, n, loss_scale, slots_.next(), hook, true); });
    }
    template <class Hook>
    void launch_deferred(std::size_t k, Hook& hook)
    {
        visit([&](auto& ctx) { launch_deferred_segment(ctx, deferred_, k, hook); });
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
            refresh_weights(ctx);
        });
    }

    // ---- micro-batches in flight: activation slots ----
    // The two halves of forward_backward, for a replica nested in a larger model (DataParallel::op,
    // slot 0) and for a Pipeline's stages (parallel/pipeline.hpp, slots 0 .. k - 1, k set by
    // use_slots(k) before any of them runs). Each slot keeps the activations of one micro-batch from its
    // forward to its backward. All of them queue their work.
    //   forward_train(pass, x, n, slot, hook)  forward of n samples of activations x (storage, memory of
    //                                     this device or another), with hook's sync points (none, or a
    //                                     nested DataParallel's); returns the output, in this stage's
    //                                     memory (output_of(slot)).
    //   forward_input(pass, x, n, slot)   the same from the model's own inputs (host memory): a
    //                                     pipeline's first stage.
    //   backward_from(pass, dy, dx, hook, slot, accumulate)   backward of the slot's micro-batch from
    //                                     dy (memory of this device or another, or output_gradient_of(slot)
    //                                     itself): the gradients ASSIGNED (hook(offset) told as in
    //                                     forward_backward), or with accumulate ADDED to the gradient, the
    //                                     micro-batch's summed apart first; the input gradient written to
    //                                     dx (memory of this device or another; may be null).
    //   loss_backward(pass, labels, n, scale, loss, dx, slot, accumulate)  a pipeline's last stage: the
    //                                     loss of the slot's output against labels (host memory), into
    //                                     *loss (page-locked), and backward_from its gradient.
    //   evaluate_outputs(labels, n, slot), outputs(slot, n, out)  the slot's outputs, without training.
    // Input, output and gradients are activations (storage).
    void use_slots(std::size_t k)
    {
        if (micro_.size() < k) micro_.resize(k);
    }
    template <class Hook = core::NoHook>
    const storage* forward_train(const Pass& pass, const storage* x, std::size_t n, std::size_t slot = 0, Hook&& hook = {})
    {
        return visit([&](auto& ctx) -> const storage* {
            Slot& s = reserve(ctx, n, slot, false);
            if (slot == 0) s.x = slots_.staging().take_activations(ctx, x, n);
            else s.x = ctx.stage(x, s.input.data(), n * input_shape::size);
            s.n = n;
            if (n) chain_.forward(ctx, pass, forward_args(s.arena, s.x, n), hook);
            else if constexpr (chain::syncs > 0) chain_.idle_forward(ctx, stats_.data(), hook);
            return s.arena.y();
        });
    }
    const storage* forward_input(const Pass& pass, const input_element* x, std::size_t n, std::size_t slot)
    {
        check_inputs(x, n);
        return visit([&](auto& ctx) -> const storage* {
            Slot& s = reserve(ctx, n, slot, true);
            const input_element* xd = x;
            if constexpr (!std::remove_cvref_t<decltype(ctx)>::host_visible) {
                grow(ctx, s.elements, n * input_shape::size);
                xd = ctx.stage(x, s.elements.data(), n * input_shape::size);
            }
            s.x = to_storage(ctx, xd, n, s.arena.input());
            s.n = n;
            if (n) chain_.forward(ctx, pass, forward_args(s.arena, s.x, n));
            return s.arena.y();
        });
    }
    template <class Hook = core::NoHook>
    void backward_from(const Pass& pass, const storage* dy_in, storage* dx, Hook&& hook = {}, std::size_t slot = 0,
                       bool accumulate = false)
    {
        visit([&](auto& ctx) {
            Slot& s = micro_[slot];
            const std::size_t n = s.n;
            if (n == 0) {
                if (!accumulate) fill(ctx, grads_.data(), 0.0f, param_count);
                if constexpr (chain::syncs > 0) chain_.idle_backward(ctx, hook);   // every sync point taken
                else hook(std::size_t{0});
                return;
            }
            const storage* dyd = dy_in == s.arena.dy() ? dy_in : ctx.stage(dy_in, s.arena.dy(), n * output_shape::size);
            // On a device, dx is written here first, then copied where it is wanted.
            storage* mine = dx == nullptr || std::remove_cvref_t<decltype(ctx)>::host_visible ? dx : input_grad_.data();
            if (accumulate) grow(ctx, partial_, param_count);
            float* g = accumulate ? partial_.data() : grads_.data();
            chain_.backward(ctx, pass, backward_args(s.arena, s.x, dyd, mine, n, g), hook);
            if (accumulate) add(ctx, static_cast<const float*>(g), grads_.data(), param_count);
            if (mine != dx) ctx.download(dx, mine, n * input_shape::size);
        });
    }
    void loss_backward(const Pass& pass, const std::int32_t* labels, std::size_t n, float loss_scale, core::LossSlot* loss,
                       storage* dx, std::size_t slot, bool accumulate)
    {
        visit([&](auto& ctx) {
            Slot& s = micro_[slot];
            *loss = {};
            loss::template forward_backward<output_shape>(ctx, s.arena.y(), stage_labels(ctx, s, labels, n), n,
                                                          loss_scale, s.arena.dy(), loss);
        });
        backward_from(pass, micro_[slot].arena.dy(), dx, core::NoHook{}, slot, accumulate);
    }
    Evaluation evaluate_outputs(const std::int32_t* labels, std::size_t n, std::size_t slot)
    {
        if (n == 0) return {};
        return visit([&](auto& ctx) {
            Slot& s = micro_[slot];
            return evaluation_of(ctx, s.arena.y(), stage_labels(ctx, s, labels, n), n);
        });
    }
    void outputs(std::size_t slot, std::size_t n, float* out)
    {
        visit([&](auto& ctx) { download_outputs(ctx, micro_[slot].arena.y(), n, out); });
    }
    storage* output_of(std::size_t slot) { return micro_[slot].arena.y(); }
    storage* output_gradient_of(std::size_t slot) { return micro_[slot].arena.dy(); }

    // The reproducible mode in parts (model/exact_gradient.hpp), for DataParallel: queue this model's
    // shards of samples [0, n) (numbered from first_shard) and return its exact accumulator for the
    // replicas' exact all-reduce (exact_count integers); finish_shards() waits and writes each shard's
    // loss; once the accumulators are summed, set_gradients_exact(batch, shard) turns this one into the
    // gradient and moves the statistics once for the whole batch.
    std::int64_t* queue_shard_gradients(const Pass& pass, const input_element* x, const std::int32_t* labels, std::size_t n,
                                        float loss_scale, std::size_t shard, std::size_t first_shard)
    {
        core::require(shard > 0, "the reproducible mode needs a micro-shard of at least 1 sample");
        drop_ahead();
        return visit([&](auto& ctx) {
            return exact_.queue(ctx, pass, x, labels, n, shard, first_shard, grads_.data(), exact_count,
                                !chain::spans_devices, [&](std::size_t m) { reserve(ctx, m); },
                                [&](const Pass& p, const input_element* xd, const std::int32_t* ld, std::size_t m,
                                    core::LossSlot* slot, float* into) {
                                    queue_pass(ctx, p, xd, ld, m, loss_scale, slot, core::NoHook{}, into);
                                });
        });
    }
    // Waits for the shards and writes their losses to shard_loss[shard number].
    void finish_shards(double* shard_loss)
    {
        visit([&](auto& ctx) {
            exact_.finish(ctx, shard_loss,
                          [](const core::LossSlot& s) { return loss::template finish<output_shape>(s); });
        });
    }
    void set_gradients_exact(std::size_t batch, std::size_t shard)
    {
        visit([&](auto& ctx) {
            exact_.write_gradient(ctx, grads_.data(), exact_count);
            if constexpr (statistics_count > 0) chain_.update_statistics(ctx, stats_.data(), shard_sums(), batch, shard);
        });
    }
    // The reproducible mode's gradient for one model: every shard here, summed exactly.
    double reproducible_forward_backward(const Pass& pass, const input_element* x, const std::int32_t* labels, std::size_t n,
                                         float loss_scale, std::size_t shard)
    {
        check_inputs(x, n);
        const backend::SerialHostKernels serial(devices_.front());   // sums independent of the thread count
        shard_loss_.assign((n + shard - 1) / shard, 0.0);
        queue_shard_gradients(pass, x, labels, n, loss_scale, shard, 0);
        finish_shards(shard_loss_.data());
        set_gradients_exact(n, shard);
        double total = 0.0;
        for (double l : shard_loss_) total += l;
        return total;
    }

    // Applies the optimizer to this model's parameters with its gradients, as its ParamRule says.
    template <class Opt>
    void update(const Opt& opt)
    {
        update_with<param_rule, 0>(opt);
    }
    // The same for a replica nested in a larger model, whose parameters follow Rule with layer ids from First.
    template <ParamRuleType Rule, std::uint32_t First, class Opt>
    void update_with(const Opt& opt)
    {
        update_slice<Rule, First, true>(opt);
    }

    // ---- an update over a gradient in parts (a Pipeline's stages, a TensorParallel's ranks) ----
    // The layout offers this stage as a part of its gradient (model::GradientPartsContract) and
    // combines the parts' answers on the host. Each call waits for this stage's answer, or queues.
    // unscale<Rule, First>(inv_scale): frozen parameters' gradients set to zero (as
    // update_with<Rule, First> does), then the gradient *= inv_scale; whether it was finite before.
    // gradient_squares<Rule, First>(ranges, at): the sum of squares, in double, over each [begin,
    // end) of `ranges` (sum_of_squares each, added here in their order) of the gradient, its frozen
    // parameters' first set to zero; at == GradientAt::state: of the optimizer state, `ranges` in
    // state indices (an Accumulate's sum).
    // clip_gradient<Rule, First>(squares, max_norm, at): the whole gradient (at == GradientAt::state:
    // the first float of state of each trainable parameter) *= max_norm / (norm + 1e-6) when norm =
    // sqrt(squares), the whole model's sum, exceeds max_norm; queued.
    // update_part<Rule, First>(opt): update_with's update without opt's prepare (the layout has
    // looked at the whole gradient in parts).
    template <ParamRuleType Rule, std::uint32_t First>
    bool unscale(float inv_scale)
    {
        using plan = UpdatePlan<chain, Rule, First>;
        return visit([&](auto& ctx) {
            for (const auto& [begin, end] : plan::frozen_runs) fill(ctx, grads_.data() + begin, 0.0f, end - begin);
            return unscale_gradient(ctx, grads_.data(), param_count, inv_scale);
        });
    }
    template <ParamRuleType Rule, std::uint32_t First>
    double gradient_squares(std::span<const std::pair<std::size_t, std::size_t>> ranges,
                            core::GradientAt at = core::GradientAt::params)
    {
        using plan = UpdatePlan<chain, Rule, First>;
        return visit([&](auto& ctx) {
            const float* from = at == core::GradientAt::state ? state_.data() : grads_.data();
            if (at == core::GradientAt::params)
                for (const auto& [begin, end] : plan::frozen_runs) fill(ctx, grads_.data() + begin, 0.0f, end - begin);
            grow(ctx, squares_, ranges.size());
            for (std::size_t k = 0; k < ranges.size(); ++k)
                sum_of_squares(ctx, from + ranges[k].first, ranges[k].second - ranges[k].first, squares_.data() + k);
            std::vector<double>& part = squares_host_;   // kept: no allocation an update
            part.resize(ranges.size());
            ctx.download(part.data(), squares_.data(), part.size());
            ctx.synchronize();
            double total = 0.0;
            for (double p : part) total += p;
            return total;
        });
    }
    template <ParamRuleType Rule, std::uint32_t First>
    void clip_gradient(double squares, float max_norm, core::GradientAt at = core::GradientAt::params)
    {
        using plan = UpdatePlan<chain, Rule, First>;
        visit([&](auto& ctx) {
            grow(ctx, squares_, 1);
            ctx.upload(squares_.data(), &squares, 1);
            const bool sums = at == core::GradientAt::state;
            clip_to_norm(ctx, sums ? state_.data() : grads_.data(), sums ? plan::trainable : param_count,
                         static_cast<const double*>(squares_.data()), max_norm);
        });
    }
    template <ParamRuleType Rule, std::uint32_t First, class Opt>
    void update_part(const Opt& opt)
    {
        update_slice<Rule, First, false>(opt);
    }

    // ---- a shard of the update (ZeRO-1: DataParallelOptions::shard) ----
    // update_shard(opt, first, last) applies opt to the trainable parameters whose state indices (their
    // order among the trainable ones) are in [first, last), their state held here (state_per_param
    // floats each, from index first: optimizer_state() is that slice, set_shard_state sets it); an
    // optimizer that looks at the whole gradient (ClipGradNorm, LossScale) sees all of it, as before.
    // Returns the range of parameters it may have changed, [begin, end) (frozen ones inside it keep
    // their values), which the other replicas copy (copy_parameters_from); the products' copy of the
    // parameters follows with weights_follow_parameters() once every range is in.
    template <class Opt>
    std::pair<std::size_t, std::size_t> update_shard(const Opt& opt, std::size_t first, std::size_t last)
    {
        static_assert(!chain::spans_devices, "a model holding a nested DataParallel cannot shard its optimizer state");
        if (shard_ != std::pair{first, last}) {
            shard_ = {first, last};
            shard_segments_.clear();
            for (const core::ParamSegment& g : update_plan::segments) {
                const std::size_t from = std::max(g.state, first), to = std::min(g.state + g.count, last);
                if (from < to)
                    shard_segments_.push_back({g.begin + (from - g.state), to - from, from - first, g.decay, g.lr_scale});
            }
        }
        visit([&](auto& ctx) {
            const std::size_t need = (last - first) * Opt::state_per_param;
            if (state_.size() != need) {
                core::require(!state_given_, "the optimizer state set for this replica's shard holds " +
                                                 std::to_string(state_.size()) + " values, but this optimizer keeps " +
                                                 std::to_string(need) + " for it: set the state of this optimizer, or none");
                state_ = ctx.template allocate<float>(need);
            }
            state_given_ = false;
            prepare_gradient<update_plan>(opt, ctx, grads_.data());
            if (!shard_segments_.empty())
                opt.apply(ctx, params_.data(), static_cast<const float*>(grads_.data()), state_.data(),
                          std::span<const core::ParamSegment>(shard_segments_));
        });
        if (shard_segments_.empty()) return {0, 0};
        return {shard_segments_.front().begin, shard_segments_.back().begin + shard_segments_.back().count};
    }
    // Parameters [begin, end) from `from`'s memory (another replica's parameter_data(), any device),
    // once `after` has happened there.
    void copy_parameters_from(const float* from, std::size_t begin, std::size_t end, core::Event after)
    {
        visit([&](auto& ctx) {
            ctx.wait(after);
            ctx.download(params_.data() + begin, from + begin, end - begin);
        });
    }
    void weights_follow_parameters()
    {
        visit([&](auto& ctx) { refresh_weights(ctx); });
    }
    // This replica's shard of the optimizer state, as update_shard keeps it.
    void set_shard_state(std::span<const float> s)
    {
        visit([&](auto& ctx) {
            if (state_.size() != s.size()) state_ = ctx.template allocate<float>(s.size());
            ctx.upload(state_.data(), s.data(), s.size());
        });
        state_given_ = !s.empty();
    }

    // Loss sum and number of correct predictions over n samples, without training (dropout off).
    Evaluation evaluate(const input_element* x, const std::int32_t* labels, std::size_t n)
    {
        if (n == 0) return {};
        check_inputs(x, n);
        return visit([&](auto& ctx) {
            reserve(ctx, n);
            const auto [xd, ld] = slots_.staging().take(ctx, x, labels, n);
            chain_.forward(ctx, Pass{.training = false}, forward_args(to_storage(ctx, xd, n, input_home(n)), n));
            return evaluation_of(ctx, y(), ld, n);
        });
    }

    // Model outputs (logits) for n samples, into host memory out (n * output_shape::size).
    void predict(const input_element* x, std::size_t n, float* out)
    {
        if (n == 0) return;
        check_inputs(x, n);
        visit([&](auto& ctx) {
            reserve(ctx, n);
            if constexpr (reduced) grow(ctx, outputs_, arena().capacity() * output_shape::size);   // before anything is queued
            const input_element* xd = slots_.staging().take(ctx, x, nullptr, n).first;
            chain_.forward(ctx, Pass{.training = false}, forward_args(to_storage(ctx, xd, n, input_home(n)), n));
            download_outputs(ctx, y(), n, out);
        });
    }

    chain& layers() { return chain_; }
    const backend::AnyContext& context() const { return ctx_; }
    // Bytes of activation memory held for the largest batch seen: each slot's arena (kept activations,
    // saved state, output and its gradient, the input in storage unless scratch holds it, scratch) and
    // on a device its copies of inputs and labels, on a device the input gradient of a nested replica
    // or pipeline stage, and in bf16 or fp16 predict's float outputs once predict has run.
    std::size_t activation_bytes() const
    {
        std::size_t b = input_grad_.size() * sizeof(storage) + outputs_.size() * sizeof(float);
        for (const Slot& s : micro_)
            b += s.arena.bytes() + s.input.size() * sizeof(storage) + s.elements.size() * sizeof(input_element) +
                 s.labels.size() * sizeof(std::int32_t);
        return b;
    }
    float* parameter_data() { return params_.data(); }
    // The parameters as the layers' products read them: in storage (the parameters themselves in fp32).
    const storage* weight_data() const
    {
        if constexpr (reduced) return weights_.data();
        else return params_.data();
    }
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
    // An activation slot: a micro-batch's activations, from its forward to its backward.
    struct Slot {
        Arena<chain, input_shape::size> arena;
        core::Buffer<storage> input;            // on a device, slots 1 ..: forward_train's input, copied here
        core::Buffer<input_element> elements;   // on a device: forward_input's samples, copied here
        core::Buffer<std::int32_t> labels;      // on a device: the labels of loss_backward, evaluate_outputs
        const storage* x = nullptr;             // the input its forward read, for its backward
        std::size_t n = 0;
    };

    static std::vector<Device> check_devices(std::vector<Device> d)
    {
        static_assert(D::has_input,
                      "a model needs Input<...> as its first entry, as in Sequential<Input<1, 28, 28>, ...>");
        core::require(!d.empty(), "a model needs a device: pass Device::cpu() or Device::cuda(i)");
        return d;
    }

    // Queues forward, loss and backward over n samples: a training step in `step_slot` (its staging
    // buffer, loss slot and, on a GPU, graphs), executed as the backend executes steps. With `defer`,
    // see queue_or_defer.
    template <class Ctx, class Hook>
    std::size_t queue(Ctx& ctx, const Pass& pass, const input_element* x, const std::int32_t* labels, std::size_t n,
                      float loss_scale, int step_slot, Hook&& hook, bool defer = false)
    {
        core::LossSlot* slot = slots_.loss(step_slot);
        *slot = {};
        if (n == 0) {   // nothing to learn from: a zero gradient, so that sums over replicas stay exact
            fill(ctx, grads_.data(), 0.0f, param_count);
            if constexpr (chain::syncs > 0) {   // yet every sync point is the replicas' together
                chain_.idle_forward(ctx, stats_.data(), hook);
                chain_.idle_backward(ctx, hook);
            } else {
                hook(std::size_t{0});
            }
            return 0;
        }
        reserve(ctx, n);
        const auto [xd, ld] = slots_.staging().take_for_step(ctx, x, labels, n, step_slot);
        auto work = [&](bool captured, auto&& on_layer) {
            const Pass p = captured ? Pass{.seed = pass.seed, .first_sample = 0, .training = pass.training} : pass;
            queue_pass(ctx, p, xd, ld, n, loss_scale, slot, on_layer);
        };
        deferred_ = backend::StepRun{.seed = pass.seed, .first_sample = pass.first_sample, .n = n, .key = step_slot,
                                     .params_slot = step_slot, .capturable = !chain::spans_devices && !communicates_of<chain>,
                                     .defer = defer};
        return execute_step(ctx, deferred_, work, hook);
    }

    // Forward, loss (into *slot) and backward over n samples already in the context's memory. The
    // gradient, then (a micro-shard) the statistics' shard sums, go to `gradient` (exact_count floats)
    // where given, else to grads_.
    template <class Ctx, class Hook>
    void queue_pass(Ctx& ctx, const Pass& pass, const input_element* xd, const std::int32_t* ld, std::size_t n, float loss_scale,
                    core::LossSlot* slot, Hook&& on_layer, float* gradient = nullptr)
    {
        float* const g = gradient ? gradient : grads_.data();
        const storage* x = to_storage(ctx, xd, n, input_home(n));
        ForwardArgs<storage> args = forward_args(x, n);
        if (pass.micro_shard > 0) args.shard_sums = g + param_count;
        chain_.forward(ctx, pass, args, on_layer);
        loss::template forward_backward<output_shape>(ctx, y(), ld, n, loss_scale, dy(), slot);
        const BackwardArgs<storage> back = backward_args(arena(), x, dy(), nullptr, n, g);
        if constexpr (reduced && chain::may_hold_input && !reads_tokens) {
            if (chain_.holds_input()) {   // backward overwrites it there before the first layer reads it
                chain_.backward_refilling(ctx, pass, back, [&](storage* to) { to_storage(ctx, xd, n, to); }, on_layer);
                return;
            }
        }
        chain_.backward(ctx, pass, back, on_layer);
    }

    // update_with (Prepare: opt's look at the whole gradient first) and update_part.
    template <ParamRuleType Rule, std::uint32_t First, bool Prepare, class Opt>
    void update_slice(const Opt& opt)
    {
        using plan = UpdatePlan<chain, Rule, First>;
        visit([&](auto& ctx) {
            const std::size_t need = plan::trainable * Opt::state_per_param;
            if (state_.size() != need) {
                core::require(!state_given_,
                              "the optimizer state set (a checkpoint, set_optimizer_state) holds " +
                                  std::to_string(state_.size()) + " values, but this optimizer keeps " +
                                  std::to_string(Opt::state_per_param) + " for each of the " +
                                  std::to_string(plan::trainable) + " trainable parameters (" + std::to_string(need) +
                                  "): set the state of this optimizer, or none");
                state_ = ctx.template allocate<float>(need);
            }
            state_given_ = false;
            prepare_gradient<plan, Prepare>(opt, ctx, grads_.data());
            chain_.template update<Rule, First>(ctx, opt, params_.data(), grads_.data(), state_.data());
            refresh_weights(ctx);
        });
    }

    // An optimizer that looks at the whole gradient first (ClipGradNorm, LossScale) sees frozen
    // parameters' gradients as zeros, as if they had none. A function of its own, not a branch in
    // update()'s lambda: nvcc does not discard that branch there.
    template <class Plan, bool Prepare = true, class Opt, class Ctx>
    static void prepare_gradient(const Opt& opt, Ctx& ctx, float* gradient)
    {
        if constexpr (Prepare && PreparesGradient<Opt, Ctx>) {
            static_assert(!chain::spans_devices,
                          "an optimizer that looks at the whole gradient (ClipGradNorm) cannot update a model "
                          "holding a nested DataParallel: its replicas update slice by slice");
            for (const auto& [begin, end] : Plan::frozen_runs) fill(ctx, gradient + begin, 0.0f, end - begin);
            opt.prepare(ctx, gradient, param_count);
        }
    }

    // Waits for the step queued ahead, if any (its buffers are the next step's but one), and forgets it.
    void drop_ahead()
    {
        ahead_.drop([&](int slot) { return finish_step(slot); });
    }

    // Slot `slot` with room for n samples; own_input: with a region of its own for the converted input
    // (forward_input's), not the chain's scratch.
    template <class Ctx>
    Slot& reserve(Ctx& ctx, std::size_t n, std::size_t slot = 0, bool own_input = false)
    {
        Slot& s = micro_[slot];
        if (n <= s.arena.capacity() && (!own_input || s.arena.owns_input())) return s;
        ctx.synchronize();   // no step still queued reads the buffers replaced here
        n = std::max(n, s.arena.capacity());
        s.arena.allocate(ctx, chain_, n, own_input);
        if constexpr (!Ctx::host_visible) {
            ctx.drop_graphs();   // they point into the buffers replaced here
            if (slot == 0) slots_.staging().reserve(ctx, n);
            else s.input = ctx.template allocate<storage>(n * input_shape::size);
            if (input_grad_.size() < n * input_shape::size) input_grad_ = ctx.template allocate<storage>(n * input_shape::size);
        }
        if (slot == 0) outputs_ = {};   // sized for the old capacity
        return s;
    }
    // b holds at least n values (replaced, after the queued work, when it does not: not on a warm step).
    template <class Ctx, class T>
    static void grow(Ctx& ctx, core::Buffer<T>& b, std::size_t n)
    {
        if (b.size() >= n) return;
        ctx.synchronize();
        b = ctx.template allocate<T>(n);
    }
    template <class Ctx>
    const std::int32_t* stage_labels(Ctx& ctx, Slot& s, const std::int32_t* labels, std::size_t n)
    {
        if constexpr (Ctx::host_visible) return labels;
        grow(ctx, s.labels, n * label_size);
        return ctx.stage(labels, s.labels.data(), n * label_size);
    }
    // Loss sum and correct predictions of n outputs y against labels ld (this context's memory); waits.
    template <class Ctx>
    Evaluation evaluation_of(Ctx& ctx, const storage* y, const std::int32_t* ld, std::size_t n)
    {
        core::LossSlot* slot = slots_.loss(slots_.evaluation);
        *slot = {};
        loss::template forward_backward<output_shape>(ctx, y, ld, n, 1.0f, nullptr, slot);
        const std::size_t correct = loss::template correct<output_shape>(ctx, y, ld, n);   // waits
        return Evaluation{loss::template finish<output_shape>(*slot), correct};
    }
    // n outputs y into host memory as floats; waits.
    template <class Ctx>
    void download_outputs(Ctx& ctx, const storage* y, std::size_t n, float* out)
    {
        if constexpr (reduced) {
            grow(ctx, outputs_, n * output_shape::size);
            from_activation_layout(ctx, y, outputs_.data(), n, output_shape::channels, output_shape::pixels);
            ctx.download(out, outputs_.data(), n * output_shape::size);
        } else {
            ctx.download(out, y, n * output_shape::size);
        }
        ctx.synchronize();
    }

    using arena_type = Arena<chain, input_shape::size>;
    ForwardArgs<storage> forward_args(const storage* x, std::size_t n) { return forward_args(arena(), x, n); }
    ForwardArgs<storage> forward_args(arena_type& a, const storage* x, std::size_t n)
    {
        return ForwardArgs<storage>{.params = params_.data(), .weights = weight_data(), .x = x, .y = a.y(), .n = n,
                                    .saved = a.saved(), .kept = a.kept(), .scratch = a.scratch(),
                                    .statistics = stats_.data()};
    }
    BackwardArgs<storage> backward_args(const storage* x, const storage* dyd, storage* dx, std::size_t n)
    {
        return backward_args(arena(), x, dyd, dx, n, grads_.data());
    }
    BackwardArgs<storage> backward_args(arena_type& a, const storage* x, const storage* dyd, storage* dx, std::size_t n,
                                        float* dparams)
    {
        return BackwardArgs<storage>{.params = params_.data(), .weights = weight_data(), .x = x, .y = a.y(), .dy = dyd,
                                     .dx = dx, .dparams = dparams, .n = n, .saved = a.saved(), .kept = a.kept(),
                                     .scratch = a.scratch()};
    }
    // Slot 0's arena: the one the model's own steps, evaluate and predict use.
    arena_type& arena() { return micro_.front().arena; }
    storage* y() { return arena().y(); }
    storage* dy() { return arena().dy(); }
    float* shard_sums() { return grads_.data() + param_count; }

    // Inputs arrive as floats (host batches); in bf16 or fp16 the layers read them converted, written
    // to `to` (input_home) by this function alone. Token ids go to the first layer as they are
    // (layers::token_ids).
    template <class Ctx>
    const storage* to_storage(Ctx& ctx, const input_element* x, std::size_t n, storage* to)
    {
        if constexpr (reads_tokens) {
            return reinterpret_cast<const storage*>(static_cast<const void*>(x));
        } else if constexpr (reduced) {
            to_activation_layout(ctx, x, to, n, input_shape::channels, input_shape::pixels);
            return to;
        } else {
            return x;
        }
    }
    // Where the layers read the converted input of n samples: in the chain's scratch where it can keep
    // it there (model/chain.hpp, may_hold_input; backward then has it converted again), else the
    // arena's input region.
    storage* input_home(std::size_t n)
    {
        if constexpr (chain::may_hold_input)
            if (chain_.holds_input()) return chain::input_home(arena().scratch(), n);
        return arena().input();
    }
    // The products' copy of the parameters follows every change of them.
    template <class Ctx>
    void refresh_weights(Ctx& ctx)
    {
        if constexpr (reduced) convert(ctx, static_cast<const float*>(params_.data()), weights_.data(), param_count);
    }

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
    chain chain_;
    static constexpr bool reduced = !std::is_same_v<storage, float>;
    // grads_ holds the gradient, then (the reproducible mode) the statistics' shard sums: one exact
    // accumulator sums both.
    core::Buffer<float> params_, grads_, state_, stats_;
    bool state_given_ = false;         // state_ was set from outside and no update has used it yet
    core::Buffer<storage> weights_;    // bf16, fp16: the parameters in storage
    std::vector<Slot> micro_ = std::vector<Slot>(1);
    core::Buffer<float> partial_;      // backward_from with accumulate: the micro-batch's gradient
    core::Buffer<float> outputs_;      // bf16, fp16: outputs as floats (made by predict, outputs)
    StepSlots<input_element, input_shape::size, label_size> slots_;
    QueueAhead<input_element> ahead_;
    backend::StepRun deferred_;        // the last step queued: launch_deferred() launches what it left
    core::Buffer<storage> input_grad_;   // nested replicas on a device
    ExactGradient<input_element, input_shape::size, label_size> exact_;
    std::pair<std::size_t, std::size_t> shard_{0, 0};   // update_shard's state indices, and its segments
    std::vector<core::ParamSegment> shard_segments_;
    std::vector<double> shard_loss_;   // reproducible_forward_backward's, one a shard
    core::Buffer<double> squares_;     // gradient_squares's sums, clip_gradient's total
    std::vector<double> squares_host_;   // gradient_squares's sums, read back
};

} // namespace replica::model
