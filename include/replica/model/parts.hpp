#pragma once
// Parts<Ops...>: what an op made of ops shares, whether its parts run one after the other (Chain) or
// side by side (Concat): the parts, built once with consecutive layer ids; their parameters laid out
// one after another in the composite's slice (param_offset), their saved state likewise
// (saved_offset), their kept activations after the composite's own (kept_offset), their statistics
// (statistics_offset) and sync point ids (sync_offset), their decoding caches (decode_cache_offset,
// layers/decode.hpp); each part's arguments within the
// composite's; the calls that pass a part the hook's sync points when it has any; initialisation; the update (and the
// reproducible mode's update of statistics); and the parameter sync of parts that hold replicas.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <tuple>
#include <type_traits>
#include <utility>

#include "replica/core/config.hpp"
#include "replica/core/hook.hpp"
#include "replica/core/meta.hpp"
#include "replica/layers/decode.hpp"
#include "replica/model/concepts.hpp"
#include "replica/model/param_layout.hpp"

namespace REPLICA_NAMESPACE::model {

namespace detail {
// L's op for input In and activations T. An op template written for float alone (op<In>) serves
// float models.
template <class L, class In, class T>
struct bind_op {
    static_assert(requires { typename L::template op<In, T>; },
                  "this layer's op has no element type parameter: declare it as template <class In, class T = "
                  "float> struct op, with ForwardArgs<T> and BackwardArgs<T>, to run it in bf16 or fp16");
    using type = typename L::template op<In, T>;
};
template <class L, class In>
struct bind_op<L, In, float> {
    using type = typename L::template op<In>;
};

// Applies the optimizer to one op's parameters under Rule, the op's first layer id being First. Ops
// that hold replicas (DataParallel) or parts that might define update(); a plain layer is one slice,
// its plan's segments.
template <ParamRuleType Rule, std::uint32_t First, class O, class Ctx, class Opt>
void update_op(O& op, Ctx& ctx, const Opt& opt, float* w, const float* g, float* state)
{
    if constexpr (requires { op.template update<Rule, First>(ctx, opt, w, g, state); })
        op.template update<Rule, First>(ctx, opt, w, g, state);
    else
        opt.apply(ctx, w, g, state, std::span<const core::ParamSegment>(UpdatePlan<O, Rule, First>::segments));
}

// Tells an op its parameters (and optimizer state, when not null: `per` floats a trainable parameter
// under Rule) were set from outside (initialised, loaded): replicas copy them.
template <ParamRuleType Rule, std::uint32_t First, class O, class Ctx>
void sync_op(O& op, Ctx& ctx, const float* w, const float* state, std::size_t per)
{
    if constexpr (requires { op.template sync<Rule, First>(ctx, w, state, per); })
        op.template sync<Rule, First>(ctx, w, state, per);
}
} // namespace detail

template <class L, class In, class T>
using bound_op = typename detail::bind_op<L, In, T>::type;

namespace detail {
// An op that reads another's parameters, and the tag that names an op's parameters, void for none
// (layers/op.hpp's tied weights).
template <class O>
concept tied = requires { typename O::tied_to; };
template <class O>
struct tag_of {
    using type = void;
};
template <class O>
    requires requires { typename O::tag; }
struct tag_of<O> {
    using type = typename O::tag;
};
} // namespace detail

template <class... Ops>
class Parts {
    using tuple = std::tuple<Ops...>;
    static constexpr std::size_t N = sizeof...(Ops);

public:
    template <std::size_t I>
    using op = std::tuple_element_t<I, tuple>;

    static constexpr std::array<std::size_t, N + 1> param_offset = core::prefix_sums<Ops::param_count...>;
    static constexpr std::array<std::size_t, N + 1> id_offset = core::prefix_sums<Ops::layer_count...>;
    static constexpr std::array<std::size_t, N + 1> saved_offset = core::prefix_sums<Ops::saved_size...>;
    static constexpr std::array<std::size_t, N + 1> kept_offset = core::prefix_sums<Ops::kept_size...>;
    static constexpr std::array<std::size_t, N + 1> statistics_offset = core::prefix_sums<statistics_count_of<Ops>...>;
    static constexpr std::array<std::size_t, N + 1> sync_offset = core::prefix_sums<syncs_of<Ops>...>;
    static constexpr std::size_t param_count = param_offset[N];
    static constexpr auto param_ranges = concat_param_ranges<Ops...>(param_offset, id_offset);
    static constexpr std::size_t statistics_count = statistics_offset[N];
    static constexpr std::size_t syncs = sync_offset[N];
    // The parts' options signatures (layers/op.hpp), each with its position: 0 when all are 0.
    static constexpr std::uint64_t options_signature = [] {
        const std::uint64_t each[] = {options_signature_of<Ops>..., 0};
        std::uint64_t h = 0;
        for (std::size_t i = 0; i < N; ++i)
            if (each[i] != 0) h = (h ^ each[i] ^ (std::uint64_t(i) << 56)) * 0x100000001b3ull + 1;
        return h;
    }();
    static constexpr std::uint32_t layer_count = std::uint32_t(id_offset[N]);
    static constexpr std::array<std::size_t, N + 1> decode_cache_offset = core::prefix_sums<decode_cache_of<Ops>...>;
    static constexpr std::size_t decode_scratch = std::max({std::size_t{0}, decode_scratch_of<Ops>...});
    static constexpr bool decodes = (true && ... && decodes_of<Ops>);
    static constexpr bool spans_devices = (false || ... || Ops::spans_devices);
    static constexpr bool communicates = (false || ... || communicates_of<Ops>);
    static constexpr bool wants_channels_last = (false || ... || wants_channels_last_of<Ops>);

private:
    // The parts before I whose op's tag is Tag: how many, and the last one. (Functions, not lambdas:
    // nvcc's front end loses the parameter pack of a lambda in a variable template's initializer.)
    template <class Tag, std::size_t... J>
    static consteval std::array<std::size_t, 2> tagged(std::index_sequence<J...>)
    {
        const bool is[] = {std::is_same_v<typename detail::tag_of<op<J>>::type, Tag>..., false};
        std::size_t count = 0, at = 0;
        for (std::size_t j = 0; j < sizeof...(J); ++j)
            if (is[j]) ++count, at = j;
        return {count, at};
    }
    // The part before I whose op's tag is op I's tied_to, checked: exactly one, owning parameters that
    // it can take gradients into, and op I owning none of its own.
    template <std::size_t I>
    static consteval std::size_t tie_home()
    {
        constexpr auto found = tagged<typename op<I>::tied_to>(std::make_index_sequence<I>{});
        static_assert(found[0] > 0, "TiedHead<E> names an embedding E that is not a layer before it in the same "
                                    "Sequential: put E earlier in the head's own chain");
        static_assert(found[0] < 2, "TiedHead<E>: two layers before it are E: tell them apart with a tag of their own, "
                                    "Embedding<Vocab, Dim, Tag>, and name the one it shares");
        static_assert(op<I>::param_count == 0, "a tied layer owns no parameters of its own");
        static_assert(accumulates_param_gradient_of<op<found[1]>>,
                      "the layer a tied layer names cannot add a second gradient to its parameters");
        return found[1];
    }
    template <std::size_t I>
    static consteval std::size_t home_of()
    {
        if constexpr (detail::tied<std::tuple_element_t<I, std::tuple<Ops...>>>) return tie_home<I>();
        else return I;
    }
    template <std::size_t J, std::size_t... I>
    static consteval bool shared_by_later(std::index_sequence<I...>)
    {
        return (false || ... || (I > J && home_of<I>() == J));
    }

public:
    // Where part I's parameters are: its own slice, or, for an op tied_to a tag, the slice of the one
    // part before it whose op has that tag (layers/op.hpp's tied weights).
    template <std::size_t I>
    static constexpr std::size_t param_home = home_of<I>();
    // Whether a later part shares part J's parameters: J's backward then adds its gradients to theirs.
    template <std::size_t J>
    static constexpr bool shared_later = shared_by_later<J>(std::make_index_sequence<N>{});

    explicit Parts(const Build& b) : ops_(make(b, std::make_index_sequence<N>{})) {}

    template <std::size_t I>
    auto& get() { return std::get<I>(ops_); }
    template <std::size_t I>
    const auto& get() const { return std::get<I>(ops_); }

    // The most scratch any part needs for one call on n samples.
    template <class Ctx>
    std::size_t scratch_size(const Ctx& ctx, std::size_t n) const
    {
        std::size_t most = 0;
        core::static_for<N>([&](auto i) { most = std::max(most, std::get<i>(ops_).scratch_size(ctx, n)); });
        return most;
    }

    void init(float* params, std::uint64_t seed) const
    {
        core::static_for<N>([&](auto i) { std::get<i>(ops_).init(params + param_offset[i], seed); });
    }
    void init_statistics(float* s) const
    {
        core::static_for<N>([&](auto i) { init_statistics_of(std::get<i>(ops_), s + statistics_offset[i]); });
    }
    // The reproducible mode's once-a-step update of the parts' statistics (layers/op.hpp).
    template <class Ctx>
    void update_statistics(Ctx& ctx, float* s, const float* sums, std::size_t batch, std::size_t shard)
    {
        core::static_for<N>([&](auto i) {
            update_statistics_of(std::get<i>(ops_), ctx, s + statistics_offset[i], sums + statistics_offset[i], batch, shard);
        });
    }
    // Part I's arguments within the composite's a: its parameters and weights, its saved state, its
    // kept activations after the composite's own `own_kept` values a sample, its statistics and shard
    // sums (null when the composite has none); its input, output and scratch as the composite lays
    // them out.
    template <std::size_t I, class T>
    static ForwardArgs<T> forward_args(const ForwardArgs<T>& a, const T* x, T* y, std::size_t own_kept, float* scratch)
    {
        return ForwardArgs<T>{.params = a.params + param_offset[param_home<I>],
                              .weights = a.weights + param_offset[param_home<I>],
                              .x = x,
                              .y = y,
                              .n = a.n,
                              .saved = a.saved + saved_offset[I] * a.n,
                              .kept = a.kept + (own_kept + kept_offset[I]) * a.n,
                              .scratch = scratch,
                              .statistics = a.statistics ? a.statistics + statistics_offset[I] : nullptr,
                              .shard_sums = a.shard_sums ? a.shard_sums + statistics_offset[I] : nullptr};
    }
    template <std::size_t I, class T>
    static BackwardArgs<T> backward_args(const BackwardArgs<T>& a, const T* x, const T* y, const T* dy, T* dx,
                                         std::size_t own_kept, float* scratch)
    {
        return BackwardArgs<T>{.params = a.params + param_offset[param_home<I>],
                               .weights = a.weights + param_offset[param_home<I>],
                               .x = x,
                               .y = y,
                               .dy = dy,
                               .dx = dx,
                               .dparams = a.dparams + param_offset[param_home<I>],
                               .n = a.n,
                               .saved = a.saved + saved_offset[I] * a.n,
                               .kept = a.kept + (own_kept + kept_offset[I]) * a.n,
                               .scratch = scratch,
                               .accumulate_params = shared_later<I>};
    }

    // Part I's forward and backward; a part with sync points gets the hook's (core::SyncOnly).
    template <std::size_t I, class Ctx, class T, class Hook>
    void forward(Ctx& ctx, const Pass& pass, const ForwardArgs<T>& a, Hook& hook)
    {
        if constexpr (syncs_of<op<I>> > 0) get<I>().forward(ctx, pass, a, core::SyncOnly<Hook>{&hook});
        else get<I>().forward(ctx, pass, a);
    }
    // forward<I> with the ReLU after op I applied in its pass (the op fuses_relu).
    template <std::size_t I, class Ctx, class T, class Hook>
    void forward_relu(Ctx& ctx, const Pass& pass, const ForwardArgs<T>& a, Hook& hook)
    {
        if constexpr (syncs_of<op<I>> > 0) get<I>().forward_relu(ctx, pass, a, core::SyncOnly<Hook>{&hook});
        else get<I>().forward_relu(ctx, pass, a);
    }
    template <std::size_t I, class Ctx, class T, class Hook>
    void backward(Ctx& ctx, const Pass& pass, const BackwardArgs<T>& a, Hook& hook)
    {
        if constexpr (syncs_of<op<I>> > 0) get<I>().backward(ctx, pass, a, core::SyncOnly<Hook>{&hook});
        else get<I>().backward(ctx, pass, a);
    }
    // backward<I> with the ReLU after op I undone in its passes (a.y, a.dy: the ReLU's output and its
    // gradient; dz: op I's own output gradient, layers/op.hpp's FusesReluWithHook).
    template <std::size_t I, class Ctx, class T, class Hook>
    void backward_relu(Ctx& ctx, const Pass& pass, const BackwardArgs<T>& a, T* dz, Hook& hook)
    {
        if constexpr (syncs_of<op<I>> > 0) get<I>().backward_relu(ctx, pass, a, dz, core::SyncOnly<Hook>{&hook});
        else get<I>().backward_relu(ctx, pass, a, dz);
    }

    // Part I's decode (layers/decode.hpp) of row x into row y, within the composite's a; scratch: the
    // part's decode_scratch floats.
    template <std::size_t I>
    static void decode(const DecodeArgs& a, const float* x, float* y, float* scratch)
    {
        static_assert(Decodes<op<I>>,
                      "generate runs a token model one position at a time, and this layer has no decode "
                      "(layers/decode.hpp): it is op I of the Ops in the instantiation above (a layer that mixes "
                      "positions, such as a convolution, cannot)");
        if constexpr (Decodes<op<I>>)
            op<I>::decode(DecodeArgs{.params = a.params + param_offset[param_home<I>],
                                     .x = x,
                                     .y = y,
                                     .position = a.position,
                                     .cache = a.cache + decode_cache_offset[I],
                                     .scratch = scratch});
    }

    // A replica with no samples in a step with sync points (Chain::idle_forward): each part that has
    // some takes them, in part order, contributing nothing. idle_backward likewise, for composites
    // whose backward runs the parts in order (Residual, Concat).
    template <class Ctx, class Hook>
    void idle_forward(Ctx& ctx, float* statistics, Hook& hook)
    {
        core::static_for<N>([&](auto i) { idle_forward<i>(ctx, statistics, hook); });
    }
    // Part I's share of it (statistics: the parts' whole block), for a composite whose forward runs its
    // parts in another order (Residual).
    template <std::size_t I, class Ctx, class Hook>
    void idle_forward(Ctx& ctx, float* statistics, Hook& hook)
    {
        if constexpr (syncs_of<op<I>> > 0) get<I>().idle_forward(ctx, statistics + statistics_offset[I], core::SyncOnly<Hook>{&hook});
    }
    template <class Ctx, class Hook>
    void idle_backward(Ctx& ctx, Hook& hook)
    {
        core::static_for<N>([&](auto i) {
            if constexpr (syncs_of<op<i>> > 0) get<i>().idle_backward(ctx, core::SyncOnly<Hook>{&hook});
        });
    }

    // Without parts that hold replicas, one pass over the whole slice (an optimizer is elementwise:
    // the same floats as part by part); with them, part by part, so that each applies it its way, the
    // state of part i after that of the trainable parameters before it.
    template <ParamRuleType Rule, std::uint32_t First, class Ctx, class Opt>
    void update(Ctx& ctx, const Opt& opt, float* w, const float* g, float* state)
    {
        if constexpr (!spans_devices) {
            opt.apply(ctx, w, g, state, std::span<const core::ParamSegment>(UpdatePlan<Parts, Rule, First>::segments));
        } else {
            const std::size_t per = Opt::state_per_param;
            core::static_for<N>([&](auto i) {
                const std::size_t o = param_offset[i];
                detail::update_op<Rule, First + std::uint32_t(id_offset[i])>(
                    std::get<i>(ops_), ctx, opt, w + o, g + o, state + state_offset<Rule, First>[i] * per);
            });
        }
    }

    template <ParamRuleType Rule, std::uint32_t First, class Ctx>
    void sync(Ctx& ctx, const float* w, const float* state, std::size_t per)
    {
        if constexpr (spans_devices)
            core::static_for<N>([&](auto i) {
                const std::size_t o = param_offset[i];
                detail::sync_op<Rule, First + std::uint32_t(id_offset[i])>(
                    std::get<i>(ops_), ctx, w + o, state ? state + state_offset<Rule, First>[i] * per : nullptr, per);
            });
    }

    // Trainable parameters under Rule before part i (where part i's optimizer state begins).
    template <ParamRuleType Rule, std::uint32_t First>
    static constexpr std::array<std::size_t, N + 1> state_offset = [] {
        std::array<std::size_t, N + 1> out{};
        core::static_for<N>([&](auto i) {
            out[i + 1] = out[i] + UpdatePlan<op<i>, Rule, First + std::uint32_t(id_offset[i])>::trainable;
        });
        return out;
    }();

private:
    template <std::size_t... I>
    static tuple make(const Build& b, std::index_sequence<I...>)
    {
        static_assert(((param_home<I> <= I) && ...));   // every tie resolved (and checked) with the parts
        return tuple{op<I>(Build{b.layer_id + std::uint32_t(id_offset[I]), b.devices, b.first_sync + sync_offset[I], b.group,
                                      b.group_rank})...};
    }

    tuple ops_;
};

} // namespace replica::model
