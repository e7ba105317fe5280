#pragma once
// Residual<Body> and Residual<Body, Shortcut>: y = x + Body(x), or Shortcut(x) + Body(x) (ResNet's
// projection shortcut, e.g. Sequential<Conv2d<128, 1, 2, 0, Bias::none>, BatchNorm2d>).
//   Residual<Sequential<Conv2d<64, 3, 1, 1>, BatchNorm2d, ReLU, Conv2d<64, 3, 1, 1>, BatchNorm2d>>, ReLU
// Parameters: the body's, then the shortcut's; statistics likewise. A ReLU after it is applied in the
// same pass as the addition (a Chain fuses them), forward and backward. A body whose last op takes an
// addend (layers/op.hpp: BatchNorm, as every ResNet block's) adds the other branch in its own last pass,
// and writes the Residual's output itself: the shortcut then runs first, and the body's output is
// neither written apart nor kept. In backward no pass adds the two branches' input gradients either,
// where the first op that writes one can add to it (accumulates_input_gradient: a convolution): an
// identity shortcut's gradient is the Residual's own output gradient, which the ReLU's backward then
// writes into dx, where the body reads it before its first op adds the body's gradient to it; a
// projection's first op adds its gradient to the body's. Nor does a pass of its own undo the ReLU after
// it, where the body's last op writes the ReLU's gradient as it reads it (writes_relu_gradient_of: a
// BatchNorm that added the shortcut): the body's backward_relu then writes it where the ReLU's
// backward would have (output_gradient_home), for the shortcut, and for the body's first op to add to.

#include <cstddef>
#include <type_traits>

#include "replica/core/config.hpp"
#include "replica/core/hook.hpp"
#include "replica/core/meta.hpp"
#include "replica/model/concepts.hpp"
#include "replica/model/parts.hpp"

namespace REPLICA_NAMESPACE::model {

namespace detail {
template <class Body, class Shortcut, class In, class T>
struct residual_parts {
    using body = bound_op<Body, In, T>;
    using shortcut = bound_op<Shortcut, In, T>;
    static_assert(std::is_same_v<typename shortcut::output_shape, typename body::output_shape>,
                  "Residual<Body, Shortcut>: the shortcut must map the input to the body's output shape: give it "
                  "the body's output channels and stride (a 1x1 Conv2d<C, 1, Stride, 0, Bias::none> and a BatchNorm2d)");
    using type = Parts<body, shortcut>;
};
template <class Body, class In, class T>
struct residual_parts<Body, void, In, T> {
    using body = bound_op<Body, In, T>;
    static_assert(std::is_same_v<typename body::output_shape, In>,
                  "Residual<Body>: the body must keep its input's shape for x + Body(x); when it changes the "
                  "channels or the size, add a projection shortcut: Residual<Body, Sequential<Conv2d<C, 1, "
                  "Stride, 0, Bias::none>, BatchNorm2d>>");
    using type = Parts<body>;
};
} // namespace detail

template <class Body, class Shortcut = void>
struct Residual {
    static_assert(Layer<Body>, "Residual<Body>: the body must be a layer or a Sequential<...> of layers");

    template <class In, class T = float>
    class op : public FusesReluWithHook<op<In, T>, T> {
        using parts = typename detail::residual_parts<Body, Shortcut, In, T>::type;
        static constexpr bool projected = !std::is_void_v<Shortcut>;
        using body_op = typename parts::template op<0>;
        using Out = typename body_op::output_shape;
        static constexpr bool body_adds = takes_addend_of<body_op>;
        // The body undoes the ReLU after the Residual in its own backward (see the top).
        static constexpr bool body_writes_relu_gradient = body_adds && writes_relu_gradient_of<body_op>;
        // Per sample in kept: the body's output (unless body_adds), the shortcut's (if any), then each
        // part's own.
        static constexpr std::size_t outputs = Out::size * ((body_adds ? 0 : 1) + (projected ? 1 : 0));

    public:
        // Backward's sums in place (see the top): with an identity shortcut the body's output gradient
        // and its input gradient share dx, so the body must read the one before it writes the other.
        static constexpr bool identity_in_place =
            !projected && accumulates_input_gradient_of<body_op> && reads_output_gradient_first_of<body_op>;
        static constexpr bool shortcut_accumulates = [] {
            if constexpr (projected) return accumulates_input_gradient_of<typename parts::template op<1>>;
            else return false;
        }();
        // The shortcut's input gradient apart, to be added: a projection that cannot add it itself.
        static constexpr bool gradient_apart = projected && !shortcut_accumulates;
        using input_shape = In;
        using output_shape = Out;
        static constexpr std::size_t param_count = parts::param_count;
        static constexpr auto param_ranges = parts::param_ranges;
        static constexpr std::size_t statistics_count = parts::statistics_count;
        static constexpr std::size_t syncs = parts::syncs;
        static constexpr std::uint64_t options_signature = parts::options_signature;
        static constexpr std::uint32_t layer_count = parts::layer_count;
        static constexpr std::size_t saved_size = parts::saved_offset.back();
        static constexpr std::size_t kept_size = outputs + parts::kept_offset.back();
        static constexpr bool spans_devices = parts::spans_devices;
        static constexpr bool communicates = parts::communicates;
        static constexpr bool wants_channels_last = parts::wants_channels_last;

        // Decoding one position (layers/decode.hpp): y = x + body(x), or shortcut(x) + body(x).
        // Scratch: [the body's row | the shortcut's row (projected) | the parts' scratch].
        static constexpr std::size_t decode_rows = row_size<Out> * (projected ? 2 : 1);
        static constexpr std::size_t decode_cache = parts::decode_cache_offset.back();
        static constexpr bool decodes = parts::decodes;
        static constexpr std::size_t decode_scratch = decode_rows + parts::decode_scratch;
        static void decode(const DecodeArgs& a)
        {
            float* body = a.scratch;
            parts::template decode<0>(a, a.x, body, a.scratch + decode_rows);
            const float* other = a.x;
            if constexpr (projected) {
                float* shortcut = a.scratch + row_size<Out>;
                parts::template decode<1>(a, a.x, shortcut, a.scratch + decode_rows);
                other = shortcut;
            }
            for (std::size_t f = 0; f < row_size<Out>; ++f) a.y[f] = other[f] + body[f];
        }

        explicit op(const Build& b) : parts_(b) {}

        // [the shortcut's input gradient (In values, gradient_apart) | the parts' scratch]
        template <class Ctx>
        std::size_t scratch_size(const Ctx& ctx, std::size_t n) const
        {
            return (gradient_apart ? floats_for<T>(In::size * n) : 0) + parts_.scratch_size(ctx, n);
        }

        // Where the ReLU after it writes its gradient (layers/op.hpp, FusesReluWithHook): into dx where
        // the identity shortcut's sum is made in place.
        static T* output_gradient_home(const BackwardArgs<T>& a, T* dz) { return identity_in_place && a.dx ? a.dx : dz; }
        void init(float* params, std::uint64_t seed) const { parts_.init(params, seed); }
        void init_statistics(float* s) const { parts_.init_statistics(s); }
        template <class Ctx>
        void update_statistics(Ctx& ctx, float* s, const float* sums, std::size_t batch, std::size_t shard)
        {
            parts_.update_statistics(ctx, s, sums, batch, shard);
        }

        template <ParamRuleType Rule, std::uint32_t First, class Ctx, class Opt>
        void update(Ctx& ctx, const Opt& opt, float* w, const float* g, float* state) { parts_.template update<Rule, First>(ctx, opt, w, g, state); }
        template <ParamRuleType Rule, std::uint32_t First, class Ctx>
        void sync(Ctx& ctx, const float* w, const float* state, std::size_t per)
        {
            parts_.template sync<Rule, First>(ctx, w, state, per);
        }

        // See Chain::idle_forward: the parts in the order forward and backward run them (the shortcut first
        // in forward when the body adds it).
        template <class Ctx, class Hook>
        void idle_forward(Ctx& ctx, float* statistics, Hook&& hook)
        {
            if constexpr (body_adds && projected) {
                parts_.template idle_forward<1>(ctx, statistics, hook);
                parts_.template idle_forward<0>(ctx, statistics, hook);
            } else {
                parts_.idle_forward(ctx, statistics, hook);
            }
        }
        template <class Ctx, class Hook>
        void idle_backward(Ctx& ctx, Hook&& hook) { parts_.idle_backward(ctx, hook); }

        // The backward of the Residual and the ReLU after it (FusesReluWithHook's contract): the body's
        // own when body_writes_relu_gradient, FusesReluWithHook's ReLU pass otherwise.
        template <class Ctx, class Hook = core::NoHook>
        void backward_relu(Ctx& ctx, const Pass& pass, const BackwardArgs<T>& a, T* dz, Hook&& hook = {})
        {
            if constexpr (body_writes_relu_gradient) run_backward(ctx, pass, a, nullptr, hook, output_gradient_home(a, dz));
            else FusesReluWithHook<op<In, T>, T>::backward_relu(ctx, pass, a, dz, hook);
        }

    private:
        friend FusesReluWithHook<op<In, T>, T>;

        template <class Ctx, class Hook>
        void run_forward(Ctx& ctx, const Pass& pass, const ForwardArgs<T>& a, Hook& hook, bool relu)
        {
            const T* other = a.x;
            if constexpr (projected) {
                T* short_y = shortcut_output(a.kept, a.n);
                parts_.template forward<1>(
                    ctx, pass, parts::template forward_args<1>(a, a.x, short_y, outputs, inner_scratch(a.scratch, a.n)), hook);
                other = short_y;
            }
            if constexpr (body_adds) {
                ForwardArgs<T> args = parts::template forward_args<0>(a, a.x, a.y, outputs, inner_scratch(a.scratch, a.n));
                args.addend = other;
                if constexpr (requires { body_op::fuses_relu; }) {
                    if (relu) parts_.template forward_relu<0>(ctx, pass, args, hook);
                    else parts_.template forward<0>(ctx, pass, args, hook);
                } else {   // a body that adds but applies no ReLU (one ending in attention): the ReLU apart
                    parts_.template forward<0>(ctx, pass, args, hook);
                    if (relu) relu_forward(ctx, static_cast<const T*>(a.y), a.y, a.n * Out::size);
                }
            } else {
                T* body_y = a.kept;
                parts_.template forward<0>(ctx, pass, parts::template forward_args<0>(a, a.x, body_y, outputs, inner_scratch(a.scratch, a.n)),
                                           hook);
                add_into(ctx, body_y, other, a.y, a.n * Out::size, relu);
            }
        }

        // dz: the Residual's output gradient. Or relu_home (not null): a.y and a.dy are the ReLU's output
        // and gradient, and the body's backward_relu writes the Residual's output gradient into relu_home,
        // dz from then on.
        template <class Ctx, class Hook>
        void run_backward(Ctx& ctx, const Pass& pass, const BackwardArgs<T>& a, const T* dz, Hook& hook,
                          T* relu_home = nullptr)
        {
            // body_adds: the body's output is the Residual's (its last op reads y only through the ReLU).
            const T* body_y = body_adds ? a.y : a.kept;
            BackwardArgs<T> body = parts::template backward_args<0>(a, a.x, body_y, relu_home ? a.dy : dz, a.dx, outputs,
                                                                    inner_scratch(a.scratch, a.n));
            if (relu_home) dz = relu_home;
            // In place: dz is dx (output_gradient_home), and the body adds its gradient to it.
            const bool in_place = identity_in_place && a.dx && dz == a.dx;
            body.accumulate = in_place;
            if constexpr (body_writes_relu_gradient) {
                if (relu_home) parts_.template backward_relu<0>(ctx, pass, body, relu_home, hook);
                else parts_.template backward<0>(ctx, pass, body, hook);
            } else {
                parts_.template backward<0>(ctx, pass, body, hook);
            }
            if constexpr (projected) {
                T* dx_short = !a.dx ? nullptr : gradient_apart ? reinterpret_cast<T*>(a.scratch) : a.dx;
                BackwardArgs<T> shortcut = parts::template backward_args<1>(a, a.x, shortcut_output(a.kept, a.n), dz, dx_short,
                                                                            outputs, inner_scratch(a.scratch, a.n));
                shortcut.accumulate = shortcut_accumulates && a.dx;
                parts_.template backward<1>(ctx, pass, shortcut, hook);
                if (a.dx && gradient_apart) add(ctx, dx_short, a.dx, a.n * In::size);
            } else if (a.dx && !in_place) {
                add(ctx, dz, a.dx, a.n * In::size);
            }
        }

        // Where the shortcut's output is kept: after the body's, or first when the body keeps none.
        static T* shortcut_output(T* kept, std::size_t n) { return kept + (body_adds ? 0 : Out::size * n); }

        static float* inner_scratch(float* scratch, std::size_t n)
        {
            return scratch + (gradient_apart ? floats_for<T>(In::size * n) : 0);
        }

        parts parts_;
    };
};

} // namespace replica::model

namespace REPLICA_NAMESPACE {
using model::Residual;
} // namespace replica
