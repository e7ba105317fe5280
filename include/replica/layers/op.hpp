#pragma once
// The op contract: what a layer is, and what the ops it yields offer the models that run them.
//
// A *layer* is a type with static hyper-parameters (Conv2d<20, 5>). Bound to the shape of one input
// sample and to the element type T of the model's activations (float, bf16 or fp16: core/number.hpp)
// it yields an *op*, `typename L::template op<In, T>` (T defaults to float), which the model
// instantiates once per replica:
//
//   using input_shape, output_shape          Shapes of one sample.
//   static constexpr std::size_t param_count  Parameters, laid out contiguously in the model's flat buffer.
//   static constexpr std::uint32_t layer_count Layer ids it uses (a leaf uses one, a nested model its sum).
//   static constexpr std::size_t saved_size   Floats per sample of its own state from forward to backward
//                                             (max pooling's argmax positions).
//   static constexpr std::size_t kept_size    Activations (values of T) per sample it keeps from forward
//                                             to backward beyond its output (a nested model's inner
//                                             outputs).
//   static constexpr bool spans_devices       Whether it runs work on devices beyond its model's (an op
//                                             that holds replicas: a nested DataParallel); the model then
//                                             runs its steps eagerly and applies updates op by op.
//   explicit op(const Build&)                 Built once per replica; never per step.
//   std::size_t scratch_size(ctx, n)          Scratch floats one call on n samples needs (values of T
//                                             that it keeps there count as floats_for<T>). Scratch holds
//                                             nothing between calls.
//   void init(float* params, seed)            Writes initial parameters (host memory).
//   void forward(ctx, pass, ForwardArgs<T>)   Writes y (n, output_shape) and its saved state.
//   void backward(ctx, pass, BackwardArgs<T>) ASSIGNS dparams and dx (the input gradient; dx may be null
//                                             when nobody needs it). Reads x, y, dy and saved state as
//                                             forward left them.
//
// Optional: an op with `static constexpr bool fuses_relu`, forward_relu(ctx, pass, ForwardArgs) and
// backward_relu(ctx, pass, BackwardArgs, dz) (convolutions, fully connected layers, BatchNorm, a
// Residual, a nested model whose last op has them) applies a ReLU that follows it in a Chain (`static
// constexpr bool is_relu`) in the same pass, forward and backward; the Chain then skips the ReLU.
// backward_relu gets the ReLU's output in y and its gradient in dy; dz (the op's own output slot) is
// room for the op's output gradient, which the op may write or not: nothing reads it after. An op
// with `static constexpr bool is_view = true` (Flatten of float activations) outputs its input's values
// unchanged: the Chain skips it between two ops (the next one reads the view's input; dy passes
// through).
//
// Optional: an op with `static constexpr bool fuses_gelu_tanh` and forward_gelu_tanh(ctx, pass,
// ForwardArgs, T* activated) (a fully connected layer) applies the tanh form of GELU that follows it
// in a Chain (an op whose `is_gelu_tanh` is true) in its forward pass: its own output goes to a.y, as
// forward writes it, and the GELU's to `activated` (the GELU's output slot); the Chain skips the
// GELU's forward. Backward is unchanged (the GELU's reads its input, the op's output). Where the
// backend fuses them (a GPU product's epilogue), the GELU is of the float values before a.y's
// rounding.
//
// Optional: `static constexpr bool takes_addend` (BatchNorm, Linear, CausalSelfAttention; a Chain whose
// last op does): forward and forward_relu add ForwardArgs::addend, when it is not null, to the output
// before the ReLU, in the same pass (a Residual's sum: model/residual.hpp), and backward reads no y
// (its output is then the sum's).
//
// Optional: `static constexpr std::array<core::ParamBlock, K> param_blocks`: its parameters' kinds
// (core/param_kind.hpp), block by block in the order of its slice, the counts summing to param_count;
// the optimizer's rule reads them (default: every parameter a weight). A composite lists its parts'.
//
// Optional: `static constexpr bool wants_channels_last` (default false): it has a convolution that
// runs on channels-last activations where the backend keeps them (backend/layout_rules.hpp); a model
// none of whose ops wants them keeps its activations channels-first (model/sequential.hpp).
//
// Optional, on a layer type: `static constexpr std::size_t vocabulary` (Embedding): it reads token
// ids in [0, vocabulary) and must be the first layer of a model with Input<Tokens<T>>
// (model/input.hpp). Its op<In, T> gets In = Shape<T> and the ids at ForwardArgs::x and
// BackwardArgs::x, typed as the activations' pointer: read them with token_ids(a.x). The model checks
// every id against the vocabulary before it queues anything.
//
// Optional, tied weights (GPT-2's head reads the token embedding's table): an op with `using tag = Tag`
// names its parameters (Embedding's: its layer type); an op with `using tied_to = Tag` and param_count 0
// (TiedHead<E>) reads, as its params and weights, those of the one op before it in the same chain
// whose tag is Tag, and its backward ASSIGNS their gradients (it runs first, backward
// walking the chain in reverse). The owner's op then gets BackwardArgs::accumulate_params and adds its
// own; it declares `static constexpr bool accumulates_param_gradient = true`. The parameters are one
// block, counted, initialised, updated and saved once.
//
// Optional, for text generation: `static void decode(const DecodeArgs&)` with decode_cache and
// decode_scratch, one position of a sequence on the host (layers/decode.hpp).
//
// An op made of ops (a Chain, a Concat) also takes a hook (core/hook.hpp) in backward, and calls it
// as each part's parameter gradients become final.
//
// Optional, for ops with state that is not trained (BatchNorm's running mean and variance):
//   static constexpr std::size_t statistics_count  Floats of model statistics, laid out contiguously
//                                             in the model's flat statistics buffer (ForwardArgs::
//                                             statistics); saved in checkpoints, never updated by an
//                                             optimizer, updated by training forward passes.
//   void init_statistics(float* s) const      Their initial values (host memory).
//   void update_statistics(ctx, statistics, sums, batch, shard)
//                                             The reproducible mode's update, once a step: sums (laid out
//                                             like the statistics) is the exact sum, over every micro-
//                                             shard of a batch of `batch` samples in shards of `shard`,
//                                             of what training forward passes wrote to shard_sums.
//   static constexpr std::uint64_t options_signature
//                                             Its options that change neither its parameter nor its
//                                             statistics layout (BatchNorm's eps and momentum), hashed; 0
//                                             (the default) for none or the defaults. A composite folds
//                                             its parts'; checkpoints' model signature includes it.
//   static constexpr std::size_t syncs        Sync points it uses in a training step (core/hook.hpp):
//                                             it then takes the hook in forward and backward too,
//                                             forward(ctx, pass, args, hook), backward(ctx, pass, args,
//                                             hook), and numbers its sync points from Build::first_sync.
//
// Every random choice an op makes is keyed on (pass.seed, its layer id, pass.first_sample + i), so it
// does not depend on which replica runs sample i.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "replica/core/config.hpp"
#include "replica/core/device.hpp"
#include "replica/core/hook.hpp"
#include "replica/core/param_kind.hpp"
#include "replica/core/rng.hpp"
#include "replica/core/shape.hpp"

namespace REPLICA_NAMESPACE::layers {

// What a forward or backward pass knows beyond its tensors.
struct Pass {
    std::uint64_t seed = 0;           // the run's seed: dropout masks
    std::uint64_t first_sample = 0;   // global index of the first sample of this call
    bool training = true;             // dropout on, activations kept for backward
    // Non-zero: this call is one micro-shard of the reproducible mode, of micro_shard samples (the last
    // of a batch may hold fewer), and its floats must not depend on the device count. An op that spans
    // devices runs it whole on the model's own device; an op with statistics leaves them as they are
    // and writes its share of the step's sums to ForwardArgs::shard_sums (see update_statistics).
    std::size_t micro_shard = 0;
};

// What an op is built with, once per replica.
// The devices a tensor-parallel model is split over (parallel/tensor_parallel.hpp), as its split ops
// (layers/tensor_parallel.hpp) see them: every rank runs the same layers on the same samples, each
// with its share of the split layers' parameters, and sums partial results over the group.
class TensorGroup {
public:
    virtual ~TensorGroup() = default;
    virtual std::size_t size() const = 0;
    // Called by every rank, from its own thread, with `count` floats in its own device's memory:
    // afterwards every rank's buffer holds the element-wise sum over the ranks, added in rank order
    // (the same bits on every rank), and rank's work queued later is ordered after the sum.
    virtual void all_reduce(std::size_t rank, float* data, std::size_t count) = 0;
};

struct Build {
    std::uint32_t layer_id = 0;           // first layer id of the op
    std::span<const Device> devices;      // the model's device first; an op that spans devices uses all
    std::size_t first_sync = 0;           // first sync point id of the op (ops with syncs)
    TensorGroup* group = nullptr;         // a split op's group (a tensor-parallel model's), else null
    std::size_t group_rank = 0;           // and this model's rank in it
};

// Parameters are float (the master copy that optimizers update, and their gradients); activations,
// their gradients and the weights that products read are T. With T = float, weights are the
// parameters themselves; otherwise the model's copy of them in T, refreshed after every change.
template <class T = float>
struct ForwardArgs {
    const float* params;   // the op's parameters
    const T* weights;      // the same parameters in T (for convolutions and fully connected layers)
    const T* x;            // (n, input_shape)
    T* y;                  // (n, output_shape)
    std::size_t n;
    float* saved;          // n * saved_size floats, kept until backward
    T* kept;               // n * kept_size values, kept until backward
    float* scratch;        // scratch_size(ctx, n) floats
    float* statistics = nullptr;   // the op's statistics (statistics_count floats), if it has any
    float* shard_sums = nullptr;   // with pass.micro_shard: statistics_count floats, ASSIGNED
    const T* addend = nullptr;     // (n, output_shape) or null: added to y before a fused ReLU (takes_addend)
};

template <class T = float>
struct BackwardArgs {
    const float* params;
    const T* weights;
    const T* x;            // (n, input_shape), as given to forward
    const T* y;            // (n, output_shape), as forward wrote it
    const T* dy;           // (n, output_shape)
    T* dx;                 // (n, input_shape) assigned; null when not needed
    float* dparams;        // param_count floats, assigned
    std::size_t n;
    float* saved;
    T* kept;
    float* scratch;
    bool accumulate = false;   // dx += the input gradient instead (only for an op that accumulates_input_gradient)
    // dparams += the parameter gradients instead: set for an op whose parameters a later op of its
    // chain shares (tied weights, below), that op's backward having assigned them first.
    bool accumulate_params = false;
};

// Floats of scratch that `count` values of T take; a 16-bit region is rounded up to 16 bytes so that
// what follows it stays aligned.
template <class T>
constexpr std::size_t floats_for(std::size_t count)
{
    if constexpr (sizeof(T) == sizeof(float)) return count;
    else return (count * sizeof(T) + 15) / 16 * (16 / sizeof(float));
}

template <class O>
concept Op = requires {
    typename O::input_shape;
    typename O::output_shape;
    { O::param_count } -> std::convertible_to<std::size_t>;
    { O::layer_count } -> std::convertible_to<std::uint32_t>;
    { O::saved_size } -> std::convertible_to<std::size_t>;
    { O::kept_size } -> std::convertible_to<std::size_t>;
    { O::spans_devices } -> std::convertible_to<bool>;
} && std::constructible_from<O, const Build&>;

// The optional members, with their defaults.
template <class O>
inline constexpr std::size_t statistics_count_of = [] {
    if constexpr (requires { O::statistics_count; }) return std::size_t(O::statistics_count);
    else return std::size_t{0};
}();
template <class O>
inline constexpr bool takes_addend_of = [] {
    if constexpr (requires { O::takes_addend; }) return bool(O::takes_addend);
    else return false;
}();
// An op that can add its input gradient to dx (BackwardArgs::accumulate) instead of assigning it.
template <class O>
inline constexpr bool accumulates_input_gradient_of = [] {
    if constexpr (requires { O::accumulates_input_gradient; }) return bool(O::accumulates_input_gradient);
    else return false;
}();
// An op whose backward_relu, after a forward that added ForwardArgs::addend, reads dy through the mask of
// the ReLU's output a.y and writes the masked gradient, relu_backward(a.y, a.dy), into dz as it goes
// (otherwise dz may be left unwritten): a Residual whose body adds the shortcut then leaves its ReLU's
// backward to the body's first pass instead of a pass of its own.
template <class O>
inline constexpr bool writes_relu_gradient_of = [] {
    if constexpr (requires { O::writes_relu_gradient; }) return bool(O::writes_relu_gradient);
    else return false;
}();
// An op whose output gradient is read before its input gradient is written (a chain whose first op
// is not the one that reads it): the two may then share memory.
template <class O>
inline constexpr bool reads_output_gradient_first_of = [] {
    if constexpr (requires { O::reads_output_gradient_first; }) return bool(O::reads_output_gradient_first);
    else return false;
}();
template <class O>
inline constexpr bool wants_channels_last_of = [] {
    if constexpr (requires { O::wants_channels_last; }) return bool(O::wants_channels_last);
    else return false;
}();
template <class O>
inline constexpr std::uint64_t options_signature_of = [] {
    if constexpr (requires { O::options_signature; }) return std::uint64_t(O::options_signature);
    else return std::uint64_t{0};
}();
// An op that sums over a TensorGroup in forward or backward (a split op, or a composite holding one):
// its model runs its steps eagerly (a sum waits on the other ranks' threads, which a CUDA graph
// replay cannot).
template <class O>
inline constexpr bool communicates_of = [] {
    if constexpr (requires { O::communicates; }) return bool(O::communicates);
    else return false;
}();
template <class O>
inline constexpr std::size_t syncs_of = [] {
    if constexpr (requires { O::syncs; }) return std::size_t(O::syncs);
    else return std::size_t{0};
}();
template <class O>
void init_statistics_of(const O& op, float* s)
{
    if constexpr (statistics_count_of<O> > 0) op.init_statistics(s);
}
template <class O, class Ctx>
void update_statistics_of(O& op, Ctx& ctx, float* statistics, const float* sums, std::size_t batch, std::size_t shard)
{
    if constexpr (statistics_count_of<O> > 0) op.update_statistics(ctx, statistics, sums, batch, shard);
}

// An op that can add its parameter gradients to dparams (BackwardArgs::accumulate_params): the owner
// of parameters that a later op shares.
template <class O>
inline constexpr bool accumulates_param_gradient_of = [] {
    if constexpr (requires { O::accumulates_param_gradient; }) return bool(O::accumulates_param_gradient);
    else return false;
}();

// A layer's vocabulary, 0 for a layer that does not read token ids.
template <class L>
inline constexpr std::size_t vocabulary_of = [] {
    if constexpr (requires { L::vocabulary; }) return std::size_t(L::vocabulary);
    else return std::size_t{0};
}();
// The token ids a token model's first op finds at ForwardArgs::x (see above): the model passes its
// std::int32_t input through the activations' pointer type, unconverted.
template <class T>
const std::int32_t* token_ids(const T* x)
{
    return reinterpret_cast<const std::int32_t*>(static_cast<const void*>(x));
}

// A layer names an op template. Naming it does not instantiate it, so this holds for every layer
// whatever shapes it accepts.
template <class L>
concept Layer = requires { typename L::template op<Shape<1>>; };

// Defaults for a leaf op: one layer id, nothing saved, on its model's device only.
struct LeafOp {
    static constexpr std::uint32_t layer_count = 1;
    static constexpr std::size_t saved_size = 0;
    static constexpr std::size_t kept_size = 0;
    static constexpr bool spans_devices = false;
    std::uint32_t id;
    explicit LeafOp(const Build& b) : id(b.layer_id) {}
    template <class Ctx>
    std::size_t scratch_size(const Ctx&, std::size_t) const { return 0; }
};

// The entry points of an op that takes the hook (it has sync points, or parts that may) and can apply
// the ReLU after it (fuses_relu), from its own run_forward(ctx, pass, args, hook, relu) and
// run_backward(ctx, pass, args, dy, hook), dy being its output's gradient.
template <class D, class T>
struct FusesReluWithHook {
    static constexpr bool fuses_relu = true;
    template <class Ctx, class Hook = core::NoHook>
    void forward(Ctx& ctx, const Pass& pass, const ForwardArgs<T>& a, Hook&& hook = {})
    {
        self().run_forward(ctx, pass, a, hook, false);
    }
    template <class Ctx, class Hook = core::NoHook>
    void forward_relu(Ctx& ctx, const Pass& pass, const ForwardArgs<T>& a, Hook&& hook = {})
    {
        self().run_forward(ctx, pass, a, hook, true);
    }
    template <class Ctx, class Hook = core::NoHook>
    void backward(Ctx& ctx, const Pass& pass, const BackwardArgs<T>& a, Hook&& hook = {})
    {
        self().run_backward(ctx, pass, a, a.dy, hook);
    }
    // a.y and a.dy are the ReLU's output and gradient; dz receives the op's own output gradient, or
    // where the op says (D::output_gradient_home(a, dz), if it has one: a Residual puts it in dx).
    template <class Ctx, class Hook = core::NoHook>
    void backward_relu(Ctx& ctx, const Pass& pass, const BackwardArgs<T>& a, T* dz, Hook&& hook = {})
    {
        T* home = dz;
        if constexpr (requires { D::output_gradient_home(a, dz); }) home = D::output_gradient_home(a, dz);
        relu_backward(ctx, a.y, a.dy, home, a.n * D::output_shape::size);
        self().run_backward(ctx, pass, a, home, hook);
    }

private:
    D& self() { return static_cast<D&>(*this); }
};

// U(-bound, bound) from the counter-based generator: element i of layer `layer` under `seed`.
inline void init_uniform(float* p, std::size_t count, float bound, std::uint64_t seed, std::uint32_t layer,
                         std::uint32_t first_element = 0)
{
    for (std::size_t i = 0; i < count; ++i)
        p[i] = (2.0f * core::random_uniform(seed, core::Stream::init, layer, 0, first_element + std::uint32_t(i)) - 1.0f) * bound;
}

} // namespace replica::layers
