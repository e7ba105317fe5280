#pragma once
// The op contract: what a layer is, and what the ops it yields offer the models that run them.
//
// A *layer* is a type with static hyper-parameters (Conv2d<20, 5>). Bound to the shape of one input
// sample it yields an *op*, `typename L::template op<In>`, which the model instantiates once per replica:
//
//   using input_shape, output_shape          Shapes of one sample.
//   static constexpr std::size_t param_count  Parameters, laid out contiguously in the model's flat buffer.
//   static constexpr std::uint32_t layer_count Layer ids it uses (a leaf uses one, a nested model its sum).
//   static constexpr std::size_t saved_size   Floats per sample it keeps from forward to backward,
//                                             beyond its output (a nested model's inner activations).
//   static constexpr bool spans_devices       Whether it runs work on devices beyond its model's (an op
//                                             that holds replicas: a nested DataParallel); the model then
//                                             runs its steps eagerly and applies updates op by op.
//   explicit op(const Build&)                 Built once per replica; never per step.
//   std::size_t scratch_size(ctx, n)          Scratch floats one call on n samples needs. Scratch holds
//                                             nothing between calls.
//   void init(float* params, seed)            Writes initial parameters (host memory).
//   void forward(ctx, pass, ForwardArgs)      Writes y (n, output_shape) and its saved state.
//   void backward(ctx, pass, BackwardArgs)    ASSIGNS dparams and dx (the input gradient; dx may be null
//                                             when nobody needs it). Reads x, y, dy and saved state as
//                                             forward left them.
//
// Optional: an op with `static constexpr bool fuses_relu`, forward_relu(ctx, pass, ForwardArgs) and
// backward_relu(ctx, pass, BackwardArgs, dz) (convolutions, fully connected layers) applies a ReLU
// that follows it in a Chain (`static constexpr bool is_relu`) in the same pass, forward and backward;
// the Chain then skips the ReLU, and the op's own output slot holds dz (its output's gradient) during
// backward. An op with `static constexpr bool is_view` (Flatten) outputs its input's values unchanged:
// the Chain skips it between two ops (the next one reads the view's input; dy passes through).
//
// An op made of ops (a Chain, a Concat) also takes a hook (core/hook.hpp) in backward, and calls it
// as each part's parameter gradients become final.
//
// Every random choice an op makes is keyed on (pass.seed, its layer id, pass.first_sample + i), so it
// does not depend on which replica runs sample i.

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "replica/core/device.hpp"
#include "replica/core/hook.hpp"
#include "replica/core/rng.hpp"
#include "replica/core/shape.hpp"

namespace replica::layers {

// What a forward or backward pass knows beyond its tensors.
struct Pass {
    std::uint64_t seed = 0;           // the run's seed: dropout masks
    std::uint64_t first_sample = 0;   // global index of the first sample of this call
    bool training = true;             // dropout on, activations kept for backward
    // Run the whole call on the model's own device: an op that spans devices does not split it, so
    // the floats do not depend on how many devices it spans (the reproducible mode's micro-shards).
    bool whole = false;
};

// What an op is built with, once per replica.
struct Build {
    std::uint32_t layer_id = 0;           // first layer id of the op
    std::span<const Device> devices;      // the model's device first; an op that spans devices uses all
};

struct ForwardArgs {
    const float* params;   // the op's parameters
    const float* x;        // (n, input_shape)
    float* y;              // (n, output_shape)
    std::size_t n;
    float* saved;          // n * saved_size floats, kept until backward
    float* scratch;        // scratch_size(ctx, n) floats
};

struct BackwardArgs {
    const float* params;
    const float* x;        // (n, input_shape), as given to forward
    const float* y;        // (n, output_shape), as forward wrote it
    const float* dy;       // (n, output_shape)
    float* dx;             // (n, input_shape) assigned; null when not needed
    float* dparams;        // param_count floats, assigned
    std::size_t n;
    float* saved;
    float* scratch;
};

template <class O>
concept Op = requires {
    typename O::input_shape;
    typename O::output_shape;
    { O::param_count } -> std::convertible_to<std::size_t>;
    { O::layer_count } -> std::convertible_to<std::uint32_t>;
    { O::saved_size } -> std::convertible_to<std::size_t>;
    { O::spans_devices } -> std::convertible_to<bool>;
} && std::constructible_from<O, const Build&>;

// A layer names an op template. Naming it does not instantiate it, so this holds for every layer
// whatever shapes it accepts.
template <class L>
concept Layer = requires { typename L::template op<Shape<1>>; };

// Defaults for a leaf op: one layer id, nothing saved, on its model's device only.
struct LeafOp {
    static constexpr std::uint32_t layer_count = 1;
    static constexpr std::size_t saved_size = 0;
    static constexpr bool spans_devices = false;
    std::uint32_t id;
    explicit LeafOp(const Build& b) : id(b.layer_id) {}
    template <class Ctx>
    std::size_t scratch_size(const Ctx&, std::size_t) const { return 0; }
};

// U(-bound, bound) from the counter-based generator: element i of layer `layer` under `seed`.
inline void init_uniform(float* p, std::size_t count, float bound, std::uint64_t seed, std::uint32_t layer,
                         std::uint32_t first_element = 0)
{
    for (std::size_t i = 0; i < count; ++i)
        p[i] = (2.0f * core::random_uniform(seed, core::Stream::init, layer, 0, first_element + std::uint32_t(i)) - 1.0f) * bound;
}

} // namespace replica::layers
