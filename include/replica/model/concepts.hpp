#pragma once
// The training contract: what a trainable model offers to train_step, the Trainer and checkpoints
// (TrainableModel), and what a model offers to a DataParallel that replicates it (Replica).
// Sequential, DataParallel and AutoParallel each static_assert the contracts they meet.
//
// A model trains on batches in host memory. All of its calls are made from one thread at a time;
// their work may run asynchronously on the model's devices, but every call that returns host
// values (a loss, parameters, an evaluation) has waited for the work they depend on.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "replica/core/config.hpp"
#include "replica/layers/decode.hpp"
#include "replica/layers/op.hpp"

namespace REPLICA_NAMESPACE::model {

// The op contract (layers/op.hpp), as models and their machinery name it.
using layers::BackwardArgs;
using layers::Build;
using layers::communicates_of;
using layers::decode_cache_of;
using layers::decode_scratch_of;
using layers::decodes_of;
using layers::DecodeArgs;
using layers::Decodes;
using layers::ForwardArgs;
using layers::FusesReluWithHook;
using layers::init_uniform;
using layers::Layer;
using layers::LeafOp;
using layers::floats_for;
using layers::Op;
using layers::Pass;
using layers::row_size;
using layers::init_statistics_of;
using layers::update_statistics_of;
using layers::options_signature_of;
using layers::statistics_count_of;
using layers::syncs_of;
using layers::takes_addend_of;
using layers::TensorGroup;
using layers::writes_relu_gradient_of;
using layers::accumulates_input_gradient_of;
using layers::accumulates_param_gradient_of;
using layers::reads_output_gradient_first_of;
using layers::wants_channels_last_of;

// A training step's batch as a model's step() takes it (host memory, n samples), with its pass and
// the loss scale. Two are equal when they describe the same samples of the same memory. E is the
// model's input_element: float, or std::int32_t token ids (model/input.hpp).
template <class E>
struct StepInput {
    Pass pass;
    const E* x = nullptr;
    const std::int32_t* labels = nullptr;
    std::size_t n = 0;
    float loss_scale = 1.0f;
    bool operator==(const StepInput& o) const
    {
        return pass.seed == o.pass.seed && pass.first_sample == o.pass.first_sample && pass.training == o.pass.training &&
               pass.micro_shard == o.pass.micro_shard && x == o.x && labels == o.labels && n == o.n && loss_scale == o.loss_scale;
    }
};

// Loss sum and number of correct predictions over some samples, without training (dropout off).
struct Evaluation {
    double loss_sum = 0.0;
    std::size_t correct = 0;
};

// What a model asks of an optimizer: `state_per_param` floats of state per trainable parameter
// (zero-filled before the first update), and apply(ctx, w, g, state, segments, at), which queues the
// update of the parameters of w that the segments name (core/param_kind.hpp: the model's plan under
// its ParamRule, model/param_layout.hpp) from their gradients g on ctx (train/sgd.hpp); `at` says
// where g holds a parameter's gradient (GradientAt::params by default). Optionally prepare(ctx, g,
// count): the model's whole gradient, once per update before apply (train/clip.hpp); and then
// update_in_parts(parts), the same look at a gradient that lies in parts (UpdatesInParts below).
template <class O>
concept Optimizer = requires {
    { O::state_per_param } -> std::convertible_to<std::size_t>;
};

// An optimizer with prepare(ctx, g, count).
template <class O, class Ctx>
concept PreparesGradient = requires(const O& o, Ctx& ctx, float* g, std::size_t n) { o.prepare(ctx, g, n); };

// A gradient that lies in parts on several contexts (a Pipeline's stages, a TensorParallel's ranks,
// model::update_in_parts), as the layout that holds it offers it to an optimizer:
//   unscale(inv_scale)        every part's gradient *= inv_scale (its frozen parameters' set to zero
//                             first, as a plain update does); whether every part's was finite before:
//                             one answer for all parts, each part's counted.
//   squares(at)               the sum of squares, in double, of the whole gradient, each parameter
//                             counted once (the kernel op sum_of_squares a part, added on the host in
//                             part order); at == GradientAt::state: of the first float of optimizer
//                             state of each trainable parameter instead (an Accumulate's sum).
//   clip(squares, max_norm, at)  every part's gradient (or that state) *= max_norm / (norm + 1e-6)
//                             when norm = sqrt(squares) exceeds max_norm (the kernel op clip_to_norm).
//   apply(o)                  every part applies optimizer o to its slice, o's apply without its
//                             prepare; its state is state_per_param floats a trainable parameter.
// context: the context type the parts' optimizer calls take. The calls wait for the parts' answers;
// their order is the optimizer's.
template <class Ctx>
struct GradientPartsContract {
    using context = Ctx;
    bool unscale(float inv_scale);
    double squares(core::GradientAt at = core::GradientAt::params);
    void clip(double squares, float max_norm, core::GradientAt at = core::GradientAt::params);
    template <class O>
    void apply(const O& o);
};

// An optimizer that a layout holding its gradient in parts can apply (`Parts` as
// GradientPartsContract says): one that does not look at the whole gradient (each part applies it),
// or one that says how to look at it in parts, o.update_in_parts(parts), with the same result as its
// prepare on the whole gradient (ClipGradNorm, LossScale, an Accumulate of a ClipGradNorm).
template <class O, class Ctx, class Parts = GradientPartsContract<Ctx>>
concept UpdatesInParts = !PreparesGradient<O, Ctx> || requires(const O& o, Parts& parts) { o.update_in_parts(parts); };

// The update of a gradient in parts: o's own update_in_parts, or every part's apply.
template <class O, class Parts>
    requires UpdatesInParts<O, typename Parts::context, Parts>
void update_in_parts(const O& o, Parts& parts)
{
    if constexpr (requires { o.update_in_parts(parts); }) o.update_in_parts(parts);
    else parts.apply(o);
}

// An optimizer that leaves the parameters as they are: for timing steps (auto_parallel) and for
// stating the contracts below.
struct NoUpdate {
    static constexpr std::size_t state_per_param = 0;
    template <class Ctx>
    void apply(Ctx&, float*, const float*, float*, std::span<const core::ParamSegment>,
               core::GradientAt = core::GradientAt::params) const {}
};

// A trainable model: a Sequential, a DataParallel, an AutoParallel.
//   step(in, opt, next)      forward, loss, backward, gradient all-reduce and opt's update on in's
//                            samples; returns the sum of their losses. Given `next` (the following
//                            call's batch, its memory unchanged until then), that step's work may be
//                            queued behind this one's update before the host waits (Sequential::step).
//   forward_backward(...)    forward, loss and backward only: the gradient, ASSIGNED, summed over
//                            replicas; returns the sum of the losses.
//   reproducible_forward_backward(..., shard)  the same, computed in micro-shards of `shard` samples
//                            and summed exactly: bit-identical on any number of replicas.
//   update(opt)              applies opt with the gradient that the last call left.
//   evaluate, predict        without training; predict writes n * output_shape::size logits.
//   parameters(), optimizer_state() and their setters: host copies of the flat vectors (the state is
//                            empty before the first update); the setters drop any work queued ahead.
//   statistics(), set_statistics(values)  host copies of the model's statistics_count statistics
//                            (BatchNorm's running estimates; none without): model state that is not
//                            trained, saved in checkpoints.
//   replica_count()          replicas in this process; global_replica_count() over every process;
//                            process_rank(): this process among them (rank 0 writes checkpoints).
template <class M>
concept TrainableModel =
    requires { typename M::input_shape; typename M::output_shape; typename M::loss; typename M::input_element; } &&
    requires(M& m, const M& cm, const Pass& pass, const StepInput<typename M::input_element>& in,
             const typename M::input_element* x, const std::int32_t* labels,
             std::size_t n, float* out, std::span<const float> values) {
        { M::param_count } -> std::convertible_to<std::size_t>;
        { M::label_size } -> std::convertible_to<std::size_t>;
        { M::statistics_count } -> std::convertible_to<std::size_t>;
        { cm.statistics() } -> std::same_as<std::vector<float>>;
        m.set_statistics(values);
        { m.step(in, NoUpdate{}, &in) } -> std::convertible_to<double>;
        { m.forward_backward(pass, x, labels, n, 1.0f) } -> std::convertible_to<double>;
        { m.reproducible_forward_backward(pass, x, labels, n, 1.0f, n) } -> std::convertible_to<double>;
        m.update(NoUpdate{});
        { m.evaluate(x, labels, n) } -> std::same_as<Evaluation>;
        m.predict(x, n, out);
        { cm.parameters() } -> std::same_as<std::vector<float>>;
        { cm.optimizer_state() } -> std::same_as<std::vector<float>>;
        m.set_parameters(values);
        m.set_optimizer_state(values);
        { cm.replica_count() } -> std::convertible_to<std::size_t>;
        { cm.global_replica_count() } -> std::convertible_to<std::size_t>;
        { cm.process_rank() } -> std::convertible_to<int>;
        { cm.description() } -> std::convertible_to<std::string>;
    };

// A model that a DataParallel can replicate: a TrainableModel on one device whose step comes in
// parts, so that one host thread (or one per replica) can queue every replica's work before it waits.
//   queue_forward_backward(pass, x, labels, n, scale, hook)  queues forward, loss and backward in the
//                            next step slot (0 or 1, in turn) and returns it; hook(offset) is called as
//                            gradients from `offset` to the end become final (core/hook.hpp).
//   queue_or_defer(...), launch_deferred(k, hook)  the same for one thread driving several GPUs: work
//                            replayed from CUDA graphs is left in segments to launch in turn.
//   mark_step(slot), finish_step(slot)  what the host waits for of a slot's step, and the wait: returns
//                            its loss sum.
//   forward_train(pass, x, n), backward_from(pass, dy, dx, hook)  the two halves of forward_backward,
//                            for a replica of a DataParallel nested in a larger model; x, dy and dx are
//                            activations (M::storage: float, bf16 or fp16), in the larger model's memory.
//   queue_shard_gradients(...), finish_shards(losses), set_gradients_exact(batch, shard)  the
//                            reproducible mode's parts (model/exact_gradient.hpp), over exact_count
//                            integers a replica.
//   copy_state_from(w, state, size, after)  parameters and optimizer state from another replica.
template <class M>
concept Replica =
    TrainableModel<M> && requires { typename M::chain; typename M::storage; } &&
    requires(M& m, const Pass& pass, const typename M::input_element* x, const std::int32_t* labels, std::size_t n,
             const typename M::storage* activations, typename M::storage* dx, int slot, core::NoHook& hook,
             double* losses) {
        { m.queue_forward_backward(pass, x, labels, n, 1.0f, hook) } -> std::same_as<int>;
        { m.queue_or_defer(pass, x, labels, n, 1.0f, hook) } -> std::same_as<std::size_t>;
        m.launch_deferred(n, hook);
        m.mark_step(slot);
        { m.finish_step(slot) } -> std::convertible_to<double>;
        { m.last_slot() } -> std::same_as<int>;
        { m.forward_train(pass, activations, n) } -> std::same_as<const typename M::storage*>;
        m.backward_from(pass, activations, dx, hook);
        { m.queue_shard_gradients(pass, x, labels, n, 1.0f, n, n) } -> std::same_as<std::int64_t*>;
        m.finish_shards(losses);
        m.set_gradients_exact(n, n);
        { M::exact_count } -> std::convertible_to<std::size_t>;
        { m.gradient_data() } -> std::same_as<float*>;
    };

// The model whose layers M runs: M::replica_type for a DataParallel or an AutoParallel, else M
// itself (a Sequential). Its chain is M's parameter layout.
template <class M>
struct replica_of {
    using type = M;
};
template <class M>
    requires requires { typename M::replica_type; }
struct replica_of<M> {
    using type = typename M::replica_type;
};

} // namespace replica::model
