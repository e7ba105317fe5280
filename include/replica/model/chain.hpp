#pragma once
// Chain<In, T, Layers...>: the op of layers applied one after the other, starting from shape In, with
// activations of type T (float, bf16, fp16). It is what Sequential runs, as a model and as a layer
// nested in another model.
//
// Layout (per sample, compile time): parameters of layer i at param_offset[i]; the outputs of every
// layer but the last, then every layer's own kept activations, in `kept`; every layer's saved state
// in `saved`. Backward walks the layers in reverse with two ping-pong gradient buffers in scratch,
// and calls hook(param_offset[i]) once layer i's parameter gradients are final, so that DataParallel
// can reduce them while the rest runs. A model may keep its converted input in scratch too
// (may_hold_input). Decoding one position (layers/decode.hpp) runs the ops in order, each one's row
// into one of two row buffers in its scratch, each op's cache at its decode_cache_offset.

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <tuple>
#include <type_traits>

#include "replica/core/config.hpp"
#include "replica/core/hook.hpp"
#include "replica/core/meta.hpp"
#include "replica/model/concepts.hpp"
#include "replica/model/parts.hpp"

namespace REPLICA_NAMESPACE::model {

namespace detail {
template <class In, class T, class... Ls>
struct bind_all {
    using type = std::tuple<>;
    using output_shape = In;
};
template <class In, class T, class L, class... Rest>
struct bind_all<In, T, L, Rest...> {
    static_assert(Layer<L>, "every entry of a model after Input must be a layer, such as Conv2d<20, 5>, "
                            "ReLU or a nested Sequential<...>");
    using first = bound_op<L, In, T>;
    using rest = bind_all<typename first::output_shape, T, Rest...>;
    using type = decltype(std::tuple_cat(std::declval<std::tuple<first>>(), std::declval<typename rest::type>()));
    using output_shape = typename rest::output_shape;
};

template <class In, class T, class... Ls>
using bound_ops = typename bind_all<In, T, Ls...>::type;   // std::tuple of the ops

// Whether the last of the bound ops applies the ReLU after it (layers/op.hpp's fuses_relu); a chain
// whose last op does declares fuses_relu itself (chain_fuses_relu<true>).
template <class Tuple>
inline constexpr bool last_fuses_relu = false;
template <class... Os>
    requires(sizeof...(Os) > 0)
inline constexpr bool last_fuses_relu<std::tuple<Os...>> =
    requires { std::tuple_element_t<sizeof...(Os) - 1, std::tuple<Os...>>::fuses_relu; };
template <bool Fuses>
struct chain_fuses_relu {};
template <>
struct chain_fuses_relu<true> {
    static constexpr bool fuses_relu = true;
};

template <class O>
struct input_shape_of {
    using type = typename O::input_shape;
};

template <class Tuple>
struct parts_of;
template <class... Os>
struct parts_of<std::tuple<Os...>> {
    using type = Parts<Os...>;
};
} // namespace detail

template <class In, class T, class... Layers>
class Chain : public detail::chain_fuses_relu<detail::last_fuses_relu<detail::bound_ops<In, T, Layers...>>> {
    using parts = typename detail::parts_of<detail::bound_ops<In, T, Layers...>>::type;
    static constexpr bool last_fuses_relu_ = detail::last_fuses_relu<detail::bound_ops<In, T, Layers...>>;
    static constexpr std::size_t N = sizeof...(Layers);
    template <std::size_t I>
    using op_t = typename parts::template op<I>;

    // Outputs of layers 0 .. N-2 are kept (the last one is the caller's y).
    template <std::size_t... I>
    static constexpr auto act_offsets_(std::index_sequence<I...>)
    {
        return core::prefix_sums<(I + 1 < N ? op_t<I>::output_shape::size : 0)...>;
    }
    using seq = std::make_index_sequence<N>;

public:
    using input_shape = In;
    using output_shape = typename detail::bind_all<In, T, Layers...>::output_shape;
    using storage = T;

    static constexpr auto param_offset = parts::param_offset;
    // The layer whose parameters layer I uses: I, or for a tied layer (TiedHead) the one it shares.
    template <std::size_t I>
    static constexpr std::size_t param_home = parts::template param_home<I>;
    static constexpr auto id_offset = parts::id_offset;
    static constexpr std::array<std::size_t, N + 1> act_offset = act_offsets_(seq{});

    static constexpr auto statistics_offset = parts::statistics_offset;
    static constexpr std::size_t param_count = parts::param_count;
    static constexpr auto param_ranges = parts::param_ranges;
    static constexpr std::size_t statistics_count = parts::statistics_count;
    static constexpr std::size_t syncs = parts::syncs;
    static constexpr std::uint64_t options_signature = parts::options_signature;
    static constexpr std::uint32_t layer_count = parts::layer_count;
    static constexpr std::size_t saved_size = parts::saved_offset[N];
    static constexpr std::size_t kept_size = act_offset[N] + parts::kept_offset[N];
    static constexpr bool spans_devices = parts::spans_devices;
    static constexpr bool communicates = parts::communicates;
    static constexpr bool wants_channels_last = parts::wants_channels_last;
    // Its last op adds ForwardArgs::addend into the chain's output (layers/op.hpp), and then writes the
    // ReLU's gradient in backward_relu (writes_relu_gradient_of), given dz by this chain's backward_relu.
    static constexpr bool takes_addend = [] {
        if constexpr (N == 0) return false;
        else return takes_addend_of<op_t<N - 1>>;
    }();
    static constexpr bool writes_relu_gradient = [] {
        if constexpr (N == 0) return false;
        else return last_fuses_relu_ && takes_addend_of<op_t<N - 1>> && writes_relu_gradient_of<op_t<N - 1>>;
    }();
    // The shape that reaches layer I; for I == size(), the output's.
    template <std::size_t I>
    using shape_before = typename std::conditional_t<(I < N), detail::input_shape_of<op_t<std::min(I, N - 1)>>,
                                                     std::type_identity<output_shape>>::type;
    // The largest activation that flows backward between two layers (ping-pong buffer size).
    static constexpr std::size_t max_inner = []<std::size_t... I>(std::index_sequence<I...>) {
        return std::max({std::size_t{0}, (I + 1 < N ? op_t<I>::output_shape::size : 0)...});
    }(seq{});

    // Decoding one position (layers/decode.hpp): [two row buffers | the ops' scratch].
    static constexpr std::size_t decode_row = []<std::size_t... I>(std::index_sequence<I...>) {
        return std::max({std::size_t{0}, (I + 1 < N ? row_size<typename op_t<I>::output_shape> : 0)...});
    }(seq{});
    static constexpr std::size_t decode_cache = parts::decode_cache_offset[N];
    static constexpr bool decodes = parts::decodes;
    static constexpr std::size_t decode_scratch = 2 * decode_row + parts::decode_scratch;
    static void decode(const DecodeArgs& a)
    {
        float* rows[2] = {a.scratch, a.scratch + decode_row};
        const float* x = a.x;
        core::static_for<N>([&](auto i) {
            float* y = i + 1 == N ? a.y : rows[i % 2];
            parts::template decode<i>(a, x, y, a.scratch + 2 * decode_row);
            x = y;
        });
    }

    explicit Chain(const Build& b) : parts_(b) {}

    template <std::size_t I>
    auto& layer() { return parts_.template get<I>(); }
    static constexpr std::size_t size() { return N; }

    // [two ping-pong gradient buffers (T) | the layers' scratch]
    template <class Ctx>
    std::size_t scratch_size(const Ctx& ctx, std::size_t n) const
    {
        return floats_for<T>(2 * max_inner * n) + parts_.scratch_size(ctx, n);
    }

    void init(float* params, std::uint64_t seed) const { parts_.init(params, seed); }
    void init_statistics(float* s) const { parts_.init_statistics(s); }
    template <class Ctx>
    void update_statistics(Ctx& ctx, float* s, const float* sums, std::size_t batch, std::size_t shard)
    {
        parts_.update_statistics(ctx, s, sums, batch, shard);
    }

    // An op that can apply the ReLU after it (fuses_relu, forward_relu, backward_relu) does, into the
    // ReLU's output, and runs the ReLU's backward in its own: the ReLU is skipped both ways, one pass
    // over memory fewer each way, the same bits. The op's own output slot, never written by forward,
    // holds the op's output gradient during backward, if the op writes it. A nested chain whose last
    // op fuses the ReLU fuses it too (forward_relu, backward_relu below).
    template <std::size_t I>
    static constexpr bool fuses_next_relu = [] {
        if constexpr (I + 1 < N) return requires { op_t<I>::fuses_relu; } && requires { op_t<I + 1>::is_relu; };
        else return false;
    }();
    template <std::size_t I>
    static constexpr bool fused_into_previous = [] {
        if constexpr (I > 0) return fuses_next_relu<I - 1>;
        else return false;
    }();
    // An op that can apply the tanh form of GELU after it in its forward pass (fuses_gelu_tanh,
    // forward_gelu_tanh: a fully connected layer, in its product's epilogue on a GPU) writes its own
    // output and the GELU's, and the GELU's forward is skipped: the GELU's backward reads its input,
    // so both outputs are kept, and backward runs as without the fusion.
    template <std::size_t I>
    static constexpr bool fuses_next_gelu = [] {
        if constexpr (I + 1 < N) {
            if constexpr (requires { op_t<I>::fuses_gelu_tanh; } && requires { op_t<I + 1>::is_gelu_tanh; })
                return op_t<I + 1>::is_gelu_tanh && !fuses_next_relu<I>;
            else return false;
        } else {
            return false;
        }
    }();
    template <std::size_t I>
    static constexpr bool gelu_fused_into_previous = [] {
        if constexpr (I > 0) return fuses_next_gelu<I - 1>;
        else return false;
    }();

    // A view (an op whose `is_view` is true: Flatten of float activations) changes the shape, not the
    // memory: between two ops it does not run, the op after it reads the view's input, and backward
    // hands the gradient through (one copy fewer each way). Last in the chain it runs, since its output is the caller's buffer; first,
    // its backward runs (it copies the gradient into the caller's dx, if any).
    template <std::size_t I>
    static constexpr bool skipped_view = [] {
        if constexpr (I + 1 < N && requires { op_t<I>::is_view; }) return bool(op_t<I>::is_view);
        else return false;
    }();

    // Its first op can add its input gradient to the caller's dx (BackwardArgs::accumulate, handed to
    // that op).
    static constexpr bool accumulates_input_gradient = [] {
        if constexpr (N == 0) return false;
        else return accumulates_input_gradient_of<op_t<0>> && !skipped_view<0>;
    }();
    // The op whose backward reads the chain's output gradient (the last that runs one), and whether it
    // is not the first: the chain's output gradient is then read before its input gradient is written.
    static constexpr std::size_t reads_output_gradient = []<std::size_t... I>(std::index_sequence<I...>) {
        std::size_t k = 0;
        ((k = !fused_into_previous<I> && !(skipped_view<I> && I > 0) ? I : k), ...);
        return k;
    }(seq{});
    static constexpr bool reads_output_gradient_first = reads_output_gradient > 0;

private:
    // may_hold_input's two ways; the first op reads the input in both (it is no skipped view).
    static constexpr bool pings_hold_input_ = [] {
        if constexpr (N == 0) return false;
        else return !skipped_view<0> && In::size <= max_inner;
    }();
    static constexpr bool first_may_hold_input_ = [] {
        if constexpr (N == 0) return false;
        else if constexpr (requires { op_t<0>::may_hold_input; })
            return op_t<0>::may_hold_input && !skipped_view<0> && !fuses_next_relu<0>;
        else return false;
    }();

public:
    // Whether a model may keep this chain's input in T in the chain's scratch instead of memory of its
    // own (input_home): one ping-pong gradient buffer holds it (both are idle in forward; before the
    // first op's backward the one its dy is not in is free, its dx being the caller's), or else the
    // first op is a chain, or holds one, that can keep it (holds_input(), known once the op is built:
    // a nested DataParallel can with one replica only). Backward overwrites it; backward_refilling has
    // it written again, where the first op's backward then reads it.
    static constexpr bool may_hold_input = [] {
        if constexpr (N == 0) return false;
        else return pings_hold_input_ || first_may_hold_input_;
    }();
    bool holds_input() const
    {
        if constexpr (N > 0 && pings_hold_input_) return true;
        else if constexpr (N > 0 && first_may_hold_input_) return parts_.template get<0>().holds_input();
        else return false;
    }
    // Where the input of n samples is kept, given this chain's scratch; requires holds_input().
    static T* input_home(float* scratch, std::size_t n)
        requires may_hold_input
    {
        if constexpr (pings_hold_input_) return reinterpret_cast<T*>(scratch);
        else return op_t<0>::input_home(inner_scratch(scratch, n), n);
    }

    // What op I reads: the output of the last op before it that is not a skipped view.
    template <std::size_t I>
    static const T* input_of(const T* x, T* kept, std::size_t n)
    {
        if constexpr (I == 0) return x;
        else if constexpr (skipped_view<I - 1>) return input_of<I - 1>(x, kept, n);
        else return activation(kept, n, I - 1);
    }

    // hook: its sync points only (core/hook.hpp); a chain's gradient offsets are backward's.
    template <class Ctx, class Hook = core::NoHook>
    void forward(Ctx& ctx, const Pass& pass, const ForwardArgs<T>& a, Hook&& hook = {})
    {
        run_forward<false>(ctx, pass, a, hook);
    }
    template <class Ctx, class Hook = core::NoHook>
    void backward(Ctx& ctx, const Pass& pass, const BackwardArgs<T>& a, Hook&& hook = {})
    {
        run_backward<false>(ctx, pass, a, nullptr, hook);
    }
    // backward for a model that keeps the input at input_home (holds_input()): a.x is where forward
    // read it; refill(T* to) queues writing it, n samples in T, to `to`, where the first op's backward
    // reads it.
    template <class Ctx, class Refill, class Hook = core::NoHook>
        requires may_hold_input
    void backward_refilling(Ctx& ctx, const Pass& pass, const BackwardArgs<T>& a, Refill&& refill, Hook&& hook = {})
    {
        run_backward<false>(ctx, pass, a, nullptr, hook, &refill);
    }

    // A chain nested in another fuses the ReLU after it when its last op does (the leaf ops' contract,
    // layers/op.hpp): forward_relu runs the last op with forward_relu into a.y, the ReLU's output;
    // backward_relu gets that output in a.y and its gradient in a.dy, runs the last op's backward_relu
    // with dz (this chain's own output gradient buffer, which the op may leave unwritten unless it
    // writes_relu_gradient after an addend), then the other ops as backward does.
    template <class Ctx, class Hook = core::NoHook>
        requires last_fuses_relu_
    void forward_relu(Ctx& ctx, const Pass& pass, const ForwardArgs<T>& a, Hook&& hook = {})
    {
        run_forward<true>(ctx, pass, a, hook);
    }
    template <class Ctx, class Hook = core::NoHook>
        requires last_fuses_relu_
    void backward_relu(Ctx& ctx, const Pass& pass, const BackwardArgs<T>& a, T* dz, Hook&& hook = {})
    {
        run_backward<true>(ctx, pass, a, dz, hook);
    }

    // A replica with no samples in a step that has sync points still takes part in every one, in the
    // order the others reach them, contributing nothing: idle_forward, then idle_backward (which calls
    // hook(offset) where backward would, the gradient being zero already).
    template <class Ctx, class Hook>
    void idle_forward(Ctx& ctx, float* statistics, Hook&& hook)
    {
        parts_.idle_forward(ctx, statistics, hook);
    }
    template <class Ctx, class Hook>
    void idle_backward(Ctx& ctx, Hook&& hook)
    {
        core::static_for_reverse<N>([&](auto i) {
            if constexpr (syncs_of<op_t<i>> > 0)
                parts_.template get<i>().idle_backward(ctx, core::SyncOnly<std::remove_cvref_t<Hook>>{&hook});
            hook(param_offset[i]);
        });
    }

    template <ParamRuleType Rule, std::uint32_t First, class Ctx, class Opt>
    void update(Ctx& ctx, const Opt& opt, float* w, const float* g, float* state) { parts_.template update<Rule, First>(ctx, opt, w, g, state); }
    template <ParamRuleType Rule, std::uint32_t First, class Ctx>
    void sync(Ctx& ctx, const float* w, const float* state, std::size_t per)
    {
        parts_.template sync<Rule, First>(ctx, w, state, per);
    }

private:
    // Whether op I applies the ReLU after it: the next op's, or (Relu: forward_relu, backward_relu) the
    // one after the chain.
    template <bool Relu, std::size_t I>
    static constexpr bool applies_relu = fuses_next_relu<I> || (Relu && I + 1 == N);

    template <bool Relu, class Ctx, class Hook>
    void run_forward(Ctx& ctx, const Pass& pass, const ForwardArgs<T>& a, Hook& hook)
    {
        core::static_for<N>([&](auto i) {
            // Done by the op before (a fused ReLU or GELU); a view.
            if constexpr (fused_into_previous<i> || gelu_fused_into_previous<i> || skipped_view<i>) return;
            constexpr std::size_t last = fuses_next_relu<i> ? i + 1 : i;   // the op whose output this writes
            ForwardArgs<T> args = parts::template forward_args<i>(
                a, input_of<i>(a.x, a.kept, a.n), last + 1 == N ? a.y : activation(a.kept, a.n, last), act_offset[N],
                inner_scratch(a.scratch, a.n));
            if constexpr (i + 1 == N) args.addend = a.addend;   // the last op writes the chain's output
            if constexpr (fuses_next_gelu<i>)
                parts_.template get<i>().forward_gelu_tanh(ctx, pass, args, i + 2 == N ? a.y : activation(a.kept, a.n, i + 1));
            else if constexpr (applies_relu<Relu, i>) parts_.template forward_relu<i>(ctx, pass, args, hook);
            else parts_.template forward<i>(ctx, pass, args, hook);
        });
    }

    // backward_refilling's two ways, in functions of their own, not branches in run_backward's lambda:
    // nvcc does not discard those. The input op I reads in backward: x, or, where this chain's buffers
    // keep it, the buffer dy is not in, written again first.
    template <std::size_t I, class Refill>
    static const T* backward_input(const T* x, const T* dy, T* const* ping, Refill refill)
    {
        if constexpr (I == 0 && !std::is_null_pointer_v<Refill> && pings_hold_input_) {
            T* free = dy == ping[0] ? ping[1] : ping[0];
            (*refill)(free);
            return free;
        } else {
            return x;
        }
    }
    // Whether op I is the first op and keeps the input in its own scratch: it then refills it itself.
    template <std::size_t I, class Refill>
    static constexpr bool first_refills = I == 0 && !std::is_null_pointer_v<Refill> && !pings_hold_input_;
    template <class Ctx, class Hook, class Refill>
    void first_backward_refilling(Ctx& ctx, const Pass& pass, const BackwardArgs<T>& args, Refill refill, Hook& hook)
    {
        if constexpr (first_may_hold_input_ && !std::is_null_pointer_v<Refill>) {
            if constexpr (syncs_of<op_t<0>> > 0)
                parts_.template get<0>().backward_refilling(ctx, pass, args, *refill,
                                                            core::SyncOnly<std::remove_cvref_t<Hook>>{&hook});
            else parts_.template get<0>().backward_refilling(ctx, pass, args, *refill);
        }
    }

    // dz: with Relu, the buffer for this chain's own output gradient (the last op's dz). refill: null,
    // or backward_refilling's; with it the first op reads the input where it was written again.
    template <bool Relu, class Ctx, class Hook, class Refill = std::nullptr_t>
    void run_backward(Ctx& ctx, const Pass& pass, const BackwardArgs<T>& a, T* dz, Hook& hook, Refill refill = nullptr)
    {
        T* ping[2] = {reinterpret_cast<T*>(a.scratch), reinterpret_cast<T*>(a.scratch) + max_inner * a.n};
        const T* dy = a.dy;
        core::static_for_reverse<N>([&](auto i) {
            // A fused ReLU's backward runs in the op before's; a view between two ops hands dy through.
            if constexpr (!fused_into_previous<i> && !(skipped_view<i> && i > 0)) {
                constexpr std::size_t last = fuses_next_relu<i> ? i + 1 : i;   // whose output dy is for
                T* dx = i == 0 ? a.dx : (dy == ping[0] ? ping[1] : ping[0]);   // the buffer dy is not in
                BackwardArgs<T> args = parts::template backward_args<i>(
                    a, input_of<i>(backward_input<i>(a.x, dy, ping, refill), a.kept, a.n),
                    last + 1 == N ? a.y : activation(a.kept, a.n, last), dy, dx, act_offset[N],
                    inner_scratch(a.scratch, a.n));
                if constexpr (i == 0) args.accumulate = a.accumulate;   // the op that writes the caller's dx
                if constexpr (first_refills<i, Refill>) {   // the first op keeps the input
                    first_backward_refilling(ctx, pass, args, refill, hook);
                } else if constexpr (applies_relu<Relu, i>) {
                    T* own = i + 1 == N ? dz : activation(a.kept, a.n, i);   // op i's output slot, unused by forward
                    if constexpr (syncs_of<op_t<i>> > 0)
                        parts_.template get<i>().backward_relu(ctx, pass, args, own,
                                                               core::SyncOnly<std::remove_cvref_t<Hook>>{&hook});
                    else parts_.template get<i>().backward_relu(ctx, pass, args, own);
                } else {
                    parts_.template backward<i>(ctx, pass, args, hook);
                }
                dy = dx;
            }
            hook(param_offset[i]);
        });
    }

    static T* activation(T* kept, std::size_t n, std::size_t i) { return kept + act_offset[i] * n; }
    static float* inner_scratch(float* scratch, std::size_t n) { return scratch + floats_for<T>(2 * max_inner * n); }

    parts parts_;
};

} // namespace replica::model
