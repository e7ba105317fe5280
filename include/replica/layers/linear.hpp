#pragma once
// Linear<Out>: (in) -> (Out), y = W x + b with W (Out, in) as PyTorch lays it out, then b (Out).
// Initialised U(-1/sqrt(in), 1/sqrt(in)).

#include <cmath>
#include <cstddef>

#include "replica/model/concepts.hpp"

namespace replica::layers {

template <std::size_t Out>
struct Linear {
    static_assert(Out > 0, "Linear needs at least one output");

    template <class In>
    struct op : model::LeafOp {
        static_assert(In::rank == 1,
                      "Linear needs a flat (features) input: put Flatten before it (or GlobalAvgPool)");
        static constexpr std::size_t N = In::size;
        using input_shape = In;
        using output_shape = Shape<Out>;
        static constexpr std::size_t weight_count = Out * N;
        static constexpr std::size_t param_count = weight_count + Out;

        using LeafOp::LeafOp;
        void init(float* p, std::uint64_t seed) const
        {
            model::init_uniform(p, param_count, 1.0f / std::sqrt(float(N)), seed, id);
        }
        template <class Ctx>
        void forward(Ctx& ctx, const model::Pass&, const model::ForwardArgs& a) const
        {
            linear_forward(ctx, int(N), int(Out), a.params, a.params + weight_count, a.x, a.y, a.n);
        }
        template <class Ctx>
        void backward(Ctx& ctx, const model::Pass&, const model::BackwardArgs& a) const
        {
            linear_backward(ctx, int(N), int(Out), a.params, a.x, a.dy, a.dx, a.dparams, a.dparams + weight_count, a.n);
        }
    };
};

} // namespace replica::layers

namespace replica {
using layers::Linear;
} // namespace replica
