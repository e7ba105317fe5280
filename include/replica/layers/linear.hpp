#pragma once
// Linear<Out>: (in) -> (Out), y = W x + b with W (Out, in) as PyTorch lays it out, then b (Out).
// Over a sequence, (positions, in) -> (positions, Out): the same W and b applied to each position, as
// PyTorch's nn.Linear on a (N, positions, in) tensor (one product of n * positions rows). The rows are
// read as stored: channels-first activations (every float model; a 16-bit one on the GPU unless it has
// a convolution that wants channels-last, backend/layout_rules.hpp). Initialised U(-1/sqrt(in), 1/sqrt(in)).

#include <array>
#include <cmath>
#include <cstddef>
#include <type_traits>

#include "replica/core/config.hpp"
#include "replica/layers/decode.hpp"
#include "replica/layers/op.hpp"

namespace REPLICA_NAMESPACE::layers {

template <std::size_t Out>
struct Linear {
    static_assert(Out > 0, "Linear needs at least one output");

    template <class In, class T = float>
    struct op : LeafOp {
        static_assert(In::rank == 1 || In::rank == 2,
                      "Linear needs a (features) or (positions, features) input: put Flatten before it (or "
                      "GlobalAvgPool)");
        static constexpr std::size_t rows = In::rank == 1 ? 1 : In::dims[0];   // positions a sample
        static constexpr std::size_t N = In::size / rows;                      // features a position
        using input_shape = In;
        using output_shape = std::conditional_t<In::rank == 1, Shape<Out>, Shape<rows, Out>>;
        static constexpr std::size_t weight_count = Out * N;
        static constexpr std::size_t param_count = weight_count + Out;
        static constexpr std::array param_blocks{core::ParamBlock{weight_count, core::ParamKind::weight},
                                                 core::ParamBlock{Out, core::ParamKind::bias}};

        using LeafOp::LeafOp;
        void init(float* p, std::uint64_t seed) const
        {
            init_uniform(p, param_count, 1.0f / std::sqrt(float(N)), seed, id);
        }
        // A Residual's other branch, when its body ends here, is added in the product (layers/op.hpp:
        // takes_addend; the product's C on a GPU): no pass of its own, and backward reads no y.
        static constexpr bool takes_addend = true;
        template <class Ctx>
        void forward(Ctx& ctx, const Pass&, const ForwardArgs<T>& a) const
        {
            if (a.addend) linear_forward_add(ctx, int(N), int(Out), a.weights, a.params + weight_count, a.x, a.addend, a.y, a.n * rows);
            else linear_forward(ctx, int(N), int(Out), a.weights, a.params + weight_count, a.x, a.y, a.n * rows);
        }
        template <class Ctx>
        void backward(Ctx& ctx, const Pass&, const BackwardArgs<T>& a) const
        {
            linear_backward(ctx, int(N), int(Out), a.weights, a.x, a.dy, a.dx, a.dparams, a.dparams + weight_count, a.n * rows);
        }
        // One position of a sequence (layers/decode.hpp).
        static void decode(const DecodeArgs& a)
            requires(In::rank == 2)
        {
            decode_linear(a.params, a.params + weight_count, a.x, a.y, N, Out);
        }
        // Forward followed by a ReLU, which then does not run: on a GPU the product adds the bias and
        // applies the ReLU as it writes (one kernel instead of three).
        static constexpr bool fuses_relu = true;
        template <class Ctx>
        void forward_relu(Ctx& ctx, const Pass&, const ForwardArgs<T>& a) const
        {
            if (a.addend)
                linear_forward_add(ctx, int(N), int(Out), a.weights, a.params + weight_count, a.x, a.addend, a.y, a.n * rows, true);
            else linear_forward(ctx, int(N), int(Out), a.weights, a.params + weight_count, a.x, a.y, a.n * rows, true);
        }
        // Forward followed by the tanh form of GELU (layers/op.hpp), whose forward then does not run: a.y
        // receives this op's output and `activated` the GELU's, on a GPU both from the product's
        // epilogue (one kernel instead of two passes more).
        static constexpr bool fuses_gelu_tanh = true;
        template <class Ctx>
        void forward_gelu_tanh(Ctx& ctx, const Pass&, const ForwardArgs<T>& a, T* activated) const
        {
            linear_forward_gelu(ctx, int(N), int(Out), a.weights, a.params + weight_count, a.x, a.y, activated, a.n * rows);
        }
        // Backward of both: a.y and a.dy are the ReLU's output and its gradient; dz receives this op's.
        template <class Ctx>
        void backward_relu(Ctx& ctx, const Pass&, const BackwardArgs<T>& a, T* dz) const
        {
            linear_backward_relu(ctx, int(N), int(Out), a.weights, a.x, a.y, a.dy, dz, a.dx, a.dparams,
                                 a.dparams + weight_count, a.n * rows);
        }
    };
};

} // namespace replica::layers

namespace REPLICA_NAMESPACE {
using layers::Linear;
} // namespace replica
