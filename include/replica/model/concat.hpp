#pragma once
// Concat<Branches...>: every branch reads the same input; their outputs are concatenated on channels.
//   Concat<Sequential<Conv2d<64, 1>, ReLU>, Sequential<MaxPool2d<3, 1, 1>, Conv2d<32, 1>, ReLU>>
// Branches must agree on every dimension but the first (channels). The input gradient is the sum of
// the branches' input gradients.

#include <algorithm>
#include <cstddef>
#include <tuple>
#include <type_traits>

#include "replica/core/config.hpp"
#include "replica/core/meta.hpp"
#include "replica/model/concepts.hpp"
#include "replica/model/parts.hpp"

namespace REPLICA_NAMESPACE::model {

namespace detail {
template <class A, class B>
constexpr bool same_trailing_dims()
{
    if constexpr (A::rank != B::rank) return false;
    else {
        for (std::size_t i = 1; i < A::rank; ++i)
            if (A::dims[i] != B::dims[i]) return false;
        return true;
    }
}

template <std::size_t C, class S>
struct with_channels;
template <std::size_t C, std::size_t D0, std::size_t... D>
struct with_channels<C, Shape<D0, D...>> {
    using type = Shape<C, D...>;
};
} // namespace detail

template <class... Branches>
struct Concat {
    static_assert(sizeof...(Branches) >= 1, "Concat needs at least one branch");
    static_assert((Layer<Branches> && ...), "every Concat branch must be a layer or a Sequential<...> of layers");

    template <class In, class T = float>
    class op {
        using parts = Parts<bound_op<Branches, In, T>...>;
        static constexpr std::size_t B = sizeof...(Branches);
        template <std::size_t I>
        using op_t = typename parts::template op<I>;
        using first_out = typename op_t<0>::output_shape;
        static_assert((detail::same_trailing_dims<first_out, typename bound_op<Branches, In, T>::output_shape>() && ...),
                      "Concat branches must produce outputs of the same rank and spatial size (only the channel "
                      "counts may differ): adjust the branches' padding, strides or pooling");

        static constexpr std::size_t pixels = first_out::size / first_out::dims[0];
        static constexpr std::array<std::size_t, B + 1> channel_offset =
            core::prefix_sums<bound_op<Branches, In, T>::output_shape::dims[0]...>;
        static constexpr auto param_offset = parts::param_offset;
        static constexpr std::array<std::size_t, B + 1> out_offset =
            core::prefix_sums<bound_op<Branches, In, T>::output_shape::size...>;
        static constexpr std::size_t max_out = std::max({bound_op<Branches, In, T>::output_shape::size...});

    public:
        using input_shape = In;
        using output_shape = typename detail::with_channels<channel_offset[B], first_out>::type;
        static constexpr std::size_t param_count = parts::param_count;
        static constexpr auto param_ranges = parts::param_ranges;
        static constexpr std::size_t statistics_count = parts::statistics_count;
        static constexpr std::size_t syncs = parts::syncs;
        static constexpr std::uint64_t options_signature = parts::options_signature;
        static constexpr std::uint32_t layer_count = parts::layer_count;
        // Kept: each branch's output, then each branch's own kept activations.
        static constexpr std::size_t saved_size = parts::saved_offset[B];
        static constexpr std::size_t kept_size = out_offset[B] + parts::kept_offset[B];
        static constexpr bool spans_devices = parts::spans_devices;
        static constexpr bool communicates = parts::communicates;
        static constexpr bool wants_channels_last = parts::wants_channels_last;

        explicit op(const Build& b) : parts_(b) {}

        // [branch dy (max_out values) | input-gradient accumulator (In values) | branch scratch]
        template <class Ctx>
        std::size_t scratch_size(const Ctx& ctx, std::size_t n) const
        {
            return floats_for<T>((max_out + In::size) * n) + parts_.scratch_size(ctx, n);
        }

        void init(float* params, std::uint64_t seed) const { parts_.init(params, seed); }
        void init_statistics(float* s) const { parts_.init_statistics(s); }
        template <class Ctx>
        void update_statistics(Ctx& ctx, float* s, const float* sums, std::size_t batch, std::size_t shard)
        {
            parts_.update_statistics(ctx, s, sums, batch, shard);
        }

        // hook: its sync points only (core/hook.hpp), for branches that have some.
        template <class Ctx, class Hook = core::NoHook>
        void forward(Ctx& ctx, const Pass& pass, const ForwardArgs<T>& a, Hook&& hook = {})
        {
            core::static_for<B>([&](auto i) {
                using Out = typename op_t<i>::output_shape;
                T* out = a.kept + out_offset[i] * a.n;
                parts_.template forward<i>(
                    ctx, pass, parts::template forward_args<i>(a, a.x, out, out_offset[B], inner_scratch(a.scratch, a.n)),
                    hook);
                copy_channels_in(ctx, out, a.n, Out::dims[0], pixels, a.y, output_shape::dims[0], channel_offset[i]);
            });
        }

        template <class Ctx, class Hook = core::NoHook>
        void backward(Ctx& ctx, const Pass& pass, const BackwardArgs<T>& a, Hook&& hook = {})
        {
            T* dy_branch = reinterpret_cast<T*>(a.scratch);
            T* dx_branch = dy_branch + max_out * a.n;
            core::static_for<B>([&](auto i) {
                using Out = typename op_t<i>::output_shape;
                copy_channels_out(ctx, a.dy, output_shape::dims[0], channel_offset[i], a.n, Out::dims[0], pixels, dy_branch);
                T* dx = a.dx == nullptr ? nullptr : (i == 0 ? a.dx : dx_branch);
                parts_.template backward<i>(
                    ctx, pass,
                    parts::template backward_args<i>(a, a.x, a.kept + out_offset[i] * a.n, dy_branch, dx, out_offset[B],
                                                     inner_scratch(a.scratch, a.n)),
                    hook);
                if (i != 0 && a.dx != nullptr) add(ctx, dx_branch, a.dx, a.n * In::size);
            });
        }

        template <ParamRuleType Rule, std::uint32_t First, class Ctx, class Opt>
        void update(Ctx& ctx, const Opt& opt, float* w, const float* g, float* state)
        {
            parts_.template update<Rule, First>(ctx, opt, w, g, state);
        }
        template <ParamRuleType Rule, std::uint32_t First, class Ctx>
        void sync(Ctx& ctx, const float* w, const float* state, std::size_t per)
        {
            parts_.template sync<Rule, First>(ctx, w, state, per);
        }

        // See Chain::idle_forward; the branches run in order both ways.
        template <class Ctx, class Hook>
        void idle_forward(Ctx& ctx, float* statistics, Hook&& hook) { parts_.idle_forward(ctx, statistics, hook); }
        template <class Ctx, class Hook>
        void idle_backward(Ctx& ctx, Hook&& hook) { parts_.idle_backward(ctx, hook); }

    private:
        static float* inner_scratch(float* scratch, std::size_t n)
        {
            return scratch + floats_for<T>((max_out + In::size) * n);
        }

        parts parts_;
    };
};

} // namespace replica::model

namespace REPLICA_NAMESPACE {
using model::Concat;
} // namespace replica
