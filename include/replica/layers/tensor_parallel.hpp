#pragma once
// Split layers: one rank's share of a layer whose parameters a tensor-parallel model divides over a
// group of Ways devices (Megatron-LM's layers; parallel/tensor_parallel.hpp makes a model of them).
// Every rank runs the same samples; what each layer receives and passes on is the whole layer's,
// identical on every rank, except between a column-split and the row-split layer after it.
//
//   ColumnParallelLinear<Out, Ways>   Linear<Out>'s outputs Out / Ways * r .. Out / Ways * (r + 1):
//                                     its rows of W and b. Input: the whole input; output: its slice.
//                                     Backward sums the input gradient over the group.
//   RowParallelLinear<Out, Ways>      Linear<Out> on a column-split layer's slice: its columns of W;
//                                     b whole, added by rank 0. Forward sums the output over the group.
//   HeadParallelAttention<Heads, Ways>
//                                     CausalSelfAttention<Heads>'s heads Heads / Ways * r ..: their
//                                     rows of Wqkv and bqkv (of q, k and v each), their columns of Wo;
//                                     bo whole, added by rank 0. Forward sums the output, backward
//                                     the input gradient, over the group.
//
// So a column-split layer, an elementwise activation and a row-split layer (an MLP), or an attention
// layer, take one sum forward and one backward. Each parameter block states which part of the whole
// layer's block it holds (core::ParamSplit); a block that is not split is the whole one on every
// rank, and receives the same gradient there. The sums are the group's (layers/op.hpp's
// TensorGroup), in rank order, so every rank gets the same bits. The group sums floats: 16-bit
// activations (bf16, fp16) are converted to floats in the op's scratch, summed, and rounded back, so
// each rank's part is rounded to T before the sum, where the whole layer rounds its result once.

#include <array>
#include <cmath>
#include <cstddef>
#include <string>
#include <type_traits>

#include "replica/core/config.hpp"
#include "replica/core/error.hpp"
#include "replica/layers/op.hpp"

namespace REPLICA_NAMESPACE::layers {

namespace detail {
// The group of a split op's Build: one of Ways ranks.
inline TensorGroup* split_group(const Build& b, std::size_t ways, const char* layer)
{
    core::require(b.group != nullptr && b.group->size() == ways && b.group_rank < ways,
                  std::string(layer) + " is one rank's share of a layer split over " + std::to_string(ways) +
                      " devices: it runs in a TensorParallel<M, " + std::to_string(ways) +
                      "> model only, which splits M's layers itself; write the plain layer in M");
    return b.group;
}

// The group's sum of `count` values of T in `data`, on the rank's context: in place for floats; 16-bit
// values through `scratch` (sum_scratch<T>(count) floats), converted, summed and rounded back.
template <class T>
constexpr std::size_t sum_scratch(std::size_t count)
{
    return std::is_same_v<T, float> ? 0 : count;
}
template <class Ctx, class T>
void sum_over(Ctx& ctx, TensorGroup* group, std::size_t rank, T* data, std::size_t count, float* scratch)
{
    if constexpr (std::is_same_v<T, float>) {
        group->all_reduce(rank, data, count);
    } else {
        convert(ctx, static_cast<const T*>(data), scratch, count);
        group->all_reduce(rank, scratch, count);
        convert(ctx, static_cast<const float*>(scratch), data, count);
    }
}
} // namespace detail

template <std::size_t Out, std::size_t Ways>
struct ColumnParallelLinear {
    static_assert(Ways > 0 && Out % Ways == 0,
                  "ColumnParallelLinear<Out, Ways>: Out must be a multiple of Ways (each rank takes Out / Ways outputs)");
    static constexpr std::size_t local = Out / Ways;

    template <class In, class T = float>
    struct op : LeafOp {
        static_assert(In::rank == 1 || In::rank == 2, "ColumnParallelLinear needs a (features) or (positions, features) input");
        static constexpr std::size_t rows = In::rank == 1 ? 1 : In::dims[0];
        static constexpr std::size_t N = In::size / rows;
        using input_shape = In;
        using output_shape = std::conditional_t<In::rank == 1, Shape<local>, Shape<rows, local>>;
        static constexpr std::size_t weight_count = local * N;
        static constexpr std::size_t param_count = weight_count + local;
        static constexpr std::array param_blocks{
            core::ParamBlock{weight_count, core::ParamKind::weight, {1, weight_count}},
            core::ParamBlock{local, core::ParamKind::bias, {1, local}}};
        static constexpr bool communicates = true;

        explicit op(const Build& b) : LeafOp(b), group(detail::split_group(b, Ways, "ColumnParallelLinear")), rank(b.group_rank) {}
        void init(float* p, std::uint64_t seed) const
        {
            init_uniform(p, param_count, 1.0f / std::sqrt(float(N)), seed, id, std::uint32_t(rank * param_count));
        }
        template <class Ctx>
        std::size_t scratch_size(const Ctx&, std::size_t n) const
        {
            return detail::sum_scratch<T>(n * In::size);
        }
        template <class Ctx>
        void forward(Ctx& ctx, const Pass&, const ForwardArgs<T>& a) const
        {
            linear_forward(ctx, int(N), int(local), a.weights, a.params + weight_count, a.x, a.y, a.n * rows);
        }
        template <class Ctx>
        void backward(Ctx& ctx, const Pass&, const BackwardArgs<T>& a) const
        {
            linear_backward(ctx, int(N), int(local), a.weights, a.x, a.dy, a.dx, a.dparams, a.dparams + weight_count, a.n * rows);
            if (a.dx) detail::sum_over(ctx, group, rank, a.dx, a.n * In::size, a.scratch);
        }

        TensorGroup* group;
        std::size_t rank;
    };
};

template <std::size_t Out, std::size_t Ways>
struct RowParallelLinear {
    static_assert(Ways > 0 && Out > 0, "RowParallelLinear<Out, Ways> needs at least one output and one rank");

    template <class In, class T = float>
    struct op : LeafOp {
        static_assert(In::rank == 1 || In::rank == 2, "RowParallelLinear needs a (features) or (positions, features) input");
        static constexpr std::size_t rows = In::rank == 1 ? 1 : In::dims[0];
        static constexpr std::size_t N = In::size / rows;   // this rank's share of the whole layer's inputs
        using input_shape = In;
        using output_shape = std::conditional_t<In::rank == 1, Shape<Out>, Shape<rows, Out>>;
        static constexpr std::size_t weight_count = Out * N;
        static constexpr std::size_t param_count = weight_count + Out;
        static constexpr std::array param_blocks{core::ParamBlock{weight_count, core::ParamKind::weight, {Out, N}},
                                                 core::ParamBlock{Out, core::ParamKind::bias}};
        static constexpr bool communicates = true;

        explicit op(const Build& b) : LeafOp(b), group(detail::split_group(b, Ways, "RowParallelLinear")), rank(b.group_rank) {}
        void init(float* p, std::uint64_t seed) const
        {
            init_uniform(p, param_count, 1.0f / std::sqrt(float(N * Ways)), seed, id);
        }
        template <class Ctx>
        std::size_t scratch_size(const Ctx&, std::size_t n) const
        {
            return detail::sum_scratch<T>(n * output_shape::size);
        }
        template <class Ctx>
        void forward(Ctx& ctx, const Pass&, const ForwardArgs<T>& a) const
        {
            linear_forward(ctx, int(N), int(Out), a.weights, rank == 0 ? a.params + weight_count : nullptr, a.x, a.y, a.n * rows);
            detail::sum_over(ctx, group, rank, a.y, a.n * output_shape::size, a.scratch);
        }
        template <class Ctx>
        void backward(Ctx& ctx, const Pass&, const BackwardArgs<T>& a) const
        {
            linear_backward(ctx, int(N), int(Out), a.weights, a.x, a.dy, a.dx, a.dparams, a.dparams + weight_count, a.n * rows);
        }

        TensorGroup* group;
        std::size_t rank;
    };
};

template <std::size_t Heads, std::size_t Ways>
struct HeadParallelAttention {
    static_assert(Ways > 0 && Heads % Ways == 0,
                  "HeadParallelAttention<Heads, Ways>: Heads must be a multiple of Ways (each rank takes Heads / Ways heads)");
    static constexpr std::size_t local_heads = Heads / Ways;

    template <class In, class T = float>
    struct op : LeafOp {
        static_assert(In::rank == 2, "HeadParallelAttention needs a (positions, features) input");
        static constexpr std::size_t L = In::dims[0];
        static constexpr std::size_t D = In::dims[1];          // the whole layer's features
        static_assert(D % Heads == 0, "HeadParallelAttention<Heads, Ways>: the features must be a multiple of Heads");
        static constexpr std::size_t d = D / Ways;             // this rank's heads' features
        using input_shape = In;
        using output_shape = In;
        static constexpr std::size_t qkv_weights = 3 * d * D, qkv_count = qkv_weights + 3 * d;
        static constexpr std::size_t out_weights = D * d;
        static constexpr std::size_t param_count = qkv_count + out_weights + D;
        static constexpr std::array param_blocks{core::ParamBlock{qkv_weights, core::ParamKind::weight, {3, d * D}},
                                                 core::ParamBlock{3 * d, core::ParamKind::bias, {3, d}},
                                                 core::ParamBlock{out_weights, core::ParamKind::weight, {D, d}},
                                                 core::ParamBlock{D, core::ParamKind::bias}};
        static constexpr std::size_t kept_size = 4 * L * d;          // qkv (L, 3d), then o (L, d)
        static constexpr std::size_t saved_size = local_heads * L;   // log-sum-exp (heads, L)
        static constexpr bool communicates = true;

        explicit op(const Build& b) : LeafOp(b), group(detail::split_group(b, Ways, "HeadParallelAttention")), rank(b.group_rank) {}
        void init(float* p, std::uint64_t seed) const
        {
            init_uniform(p, param_count, 1.0f / std::sqrt(float(D)), seed, id, std::uint32_t(rank * param_count));
        }
        // Backward's gradients of o (n L d) and qkv (n L 3d) in T, then the backend's scratch, then
        // the sum's (n L D, 16-bit T only); forward uses the backend's and the sum's, at the same places.
        template <class Ctx>
        std::size_t scratch_size(const Ctx& ctx, std::size_t n) const
        {
            return floats_for<T>(n * L * d) + floats_for<T>(n * L * 3 * d) + attention_scratch<T>(ctx, n, L, d, local_heads) +
                   detail::sum_scratch<T>(n * L * D);
        }
        template <class Ctx>
        void forward(Ctx& ctx, const Pass&, const ForwardArgs<T>& a) const
        {
            T* qkv = a.kept;
            T* o = a.kept + a.n * L * 3 * d;
            linear_forward(ctx, int(D), int(3 * d), a.weights, a.params + qkv_weights, a.x, qkv, a.n * L);
            attention_forward(ctx, static_cast<const T*>(qkv), o, a.saved, a.n, L, d, local_heads, own_scratch(a.scratch, a.n));
            linear_forward(ctx, int(d), int(D), a.weights + qkv_count, rank == 0 ? a.params + qkv_count + out_weights : nullptr,
                           static_cast<const T*>(o), a.y, a.n * L);
            detail::sum_over(ctx, group, rank, a.y, a.n * L * D, sum_area(ctx, a.scratch, a.n));
        }
        template <class Ctx>
        void backward(Ctx& ctx, const Pass&, const BackwardArgs<T>& a) const
        {
            const T* qkv = a.kept;
            const T* o = a.kept + a.n * L * 3 * d;
            T* d_o = reinterpret_cast<T*>(a.scratch);
            T* dqkv = reinterpret_cast<T*>(a.scratch + floats_for<T>(a.n * L * d));
            linear_backward(ctx, int(d), int(D), a.weights + qkv_count, o, a.dy, d_o, a.dparams + qkv_count,
                            a.dparams + qkv_count + out_weights, a.n * L);
            attention_backward(ctx, qkv, o, static_cast<const float*>(a.saved), static_cast<const T*>(d_o), dqkv, a.n, L, d,
                               local_heads, own_scratch(a.scratch, a.n));
            linear_backward(ctx, int(D), int(3 * d), a.weights, a.x, static_cast<const T*>(dqkv), a.dx, a.dparams,
                            a.dparams + qkv_weights, a.n * L);
            if (a.dx) detail::sum_over(ctx, group, rank, a.dx, a.n * L * D, sum_area(ctx, a.scratch, a.n));
        }

        TensorGroup* group;
        std::size_t rank;

    private:
        static float* own_scratch(float* scratch, std::size_t n)
        {
            return scratch + floats_for<T>(n * L * d) + floats_for<T>(n * L * 3 * d);
        }
        template <class Ctx>
        static float* sum_area(const Ctx& ctx, float* scratch, std::size_t n)
        {
            return own_scratch(scratch, n) + attention_scratch<T>(ctx, n, L, d, local_heads);
        }
    };
};

} // namespace replica::layers

namespace REPLICA_NAMESPACE {
using layers::ColumnParallelLinear;
using layers::HeadParallelAttention;
using layers::RowParallelLinear;
} // namespace replica
