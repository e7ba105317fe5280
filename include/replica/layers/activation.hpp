#pragma once
// Parameter-free elementwise layers.
//   Identity     y = x (a view: free between two ops of a model)
//   ReLU         y = max(x, 0)
//   Sigmoid      y = 1 / (1 + exp(-x))
//   Tanh         y = tanh(x)
//   GELU         y = x * Phi(x) = 0.5 * x * (1 + erf(x / sqrt(2))), PyTorch's default (exact) form
//   GELUWith<GeluApprox::tanh>
//                y = 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))), PyTorch's
//                GELU(approximate='tanh') (GPT-2's); GELUWith<GeluApprox::none> is GELU
//   Dropout<P>   in training, each element is zeroed with probability P and the rest scaled by
//                1 / (1 - P); the identity in evaluation. The mask is keyed on (seed, layer, global
//                sample index, element): the same on 1 or N replicas.

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>

#include "replica/core/config.hpp"
#include "replica/layers/decode.hpp"
#include "replica/layers/op.hpp"

namespace REPLICA_NAMESPACE::layers {

struct ReLU {
    template <class In, class T = float>
    struct op : LeafOp {
        using input_shape = In;
        using output_shape = In;
        static constexpr std::size_t param_count = 0;
        static constexpr bool is_relu = true;   // an op before it may apply it (a Chain fuses them)
        using LeafOp::LeafOp;
        void init(float*, std::uint64_t) const {}
        template <class Ctx>
        void forward(Ctx& ctx, const Pass&, const ForwardArgs<T>& a) const
        {
            relu_forward(ctx, a.x, a.y, a.n * In::size);
        }
        template <class Ctx>
        void backward(Ctx& ctx, const Pass&, const BackwardArgs<T>& a) const
        {
            if (a.dx) relu_backward(ctx, a.y, a.dy, a.dx, a.n * In::size);
        }
        // One position of a sequence (layers/decode.hpp), as every elementwise layer here.
        static void decode(const DecodeArgs& a)
            requires(In::rank == 2)
        {
            decode_map<In>(a, [](float v) { return std::max(v, 0.0f); });
        }
    };
};

// A parameter-free elementwise layer whose kernels a rule names: Rule::forward(ctx, x, y, count) and
// Rule::backward(ctx, x, y, dy, dx, count) (from the input, the output, or both); Rule::value(v), the
// function of one value, decodes (layers/decode.hpp). A rule with `is_gelu_tanh` makes the op one that
// a fully connected layer before it may apply in its forward pass (layers/op.hpp).
template <class Rule>
struct Elementwise {
    template <class In, class T = float>
    struct op : LeafOp {
        using input_shape = In;
        using output_shape = In;
        static constexpr std::size_t param_count = 0;
        static constexpr bool is_gelu_tanh = requires { Rule::is_gelu_tanh; };
        using LeafOp::LeafOp;
        void init(float*, std::uint64_t) const {}
        template <class Ctx>
        void forward(Ctx& ctx, const Pass&, const ForwardArgs<T>& a) const
        {
            Rule::forward(ctx, a.x, a.y, a.n * In::size);
        }
        template <class Ctx>
        void backward(Ctx& ctx, const Pass&, const BackwardArgs<T>& a) const
        {
            if (a.dx) Rule::backward(ctx, a.x, a.y, a.dy, a.dx, a.n * In::size);
        }
        static void decode(const DecodeArgs& a)
            requires(In::rank == 2)
        {
            decode_map<In>(a, [](float v) { return Rule::value(v); });
        }
    };
};

namespace detail {
struct SigmoidRule {   // dx = dy * y * (1 - y), from the output
    static float value(float v) { return 1.0f / (1.0f + std::exp(-v)); }
    template <class Ctx, class T>
    static void forward(Ctx& ctx, const T* x, T* y, std::size_t n) { sigmoid_forward(ctx, x, y, n); }
    template <class Ctx, class T>
    static void backward(Ctx& ctx, const T*, const T* y, const T* dy, T* dx, std::size_t n)
    {
        sigmoid_backward(ctx, y, dy, dx, n);
    }
};
struct TanhRule {   // dx = dy * (1 - y^2), from the output
    static float value(float v) { return std::tanh(v); }
    template <class Ctx, class T>
    static void forward(Ctx& ctx, const T* x, T* y, std::size_t n) { tanh_forward(ctx, x, y, n); }
    template <class Ctx, class T>
    static void backward(Ctx& ctx, const T*, const T* y, const T* dy, T* dx, std::size_t n)
    {
        tanh_backward(ctx, y, dy, dx, n);
    }
};
} // namespace detail

// GELU's forms, PyTorch's GELU(approximate=...) values.
enum class GeluApprox { none, tanh };

namespace detail {
template <GeluApprox A>
struct GeluRule;
template <>
struct GeluRule<GeluApprox::none> {   // dx = dy * (Phi(x) + x * phi(x)), from the input
    static float value(float v) { return 0.5f * v * (1.0f + std::erf(v * 0.70710678118654752f)); }
    template <class Ctx, class T>
    static void forward(Ctx& ctx, const T* x, T* y, std::size_t n) { gelu_forward(ctx, x, y, n); }
    template <class Ctx, class T>
    static void backward(Ctx& ctx, const T* x, const T*, const T* dy, T* dx, std::size_t n)
    {
        gelu_backward(ctx, x, dy, dx, n);
    }
};
template <>
struct GeluRule<GeluApprox::tanh> {   // the derivative of the tanh form, from the input
    static constexpr bool is_gelu_tanh = true;
    static float value(float v)
    {
        return 0.5f * v * (1.0f + std::tanh(0.79788456080286536f * (v + 0.044715f * v * v * v)));
    }
    template <class Ctx, class T>
    static void forward(Ctx& ctx, const T* x, T* y, std::size_t n) { gelu_tanh_forward(ctx, x, y, n); }
    template <class Ctx, class T>
    static void backward(Ctx& ctx, const T* x, const T*, const T* dy, T* dx, std::size_t n)
    {
        gelu_tanh_backward(ctx, x, dy, dx, n);
    }
};
} // namespace detail

using Sigmoid = Elementwise<detail::SigmoidRule>;
using Tanh = Elementwise<detail::TanhRule>;
// GELU stays a type (its spelling in models); the other form is GELUWith<GeluApprox::tanh>.
template <GeluApprox A>
using GELUWith = Elementwise<detail::GeluRule<A>>;
using GELU = GELUWith<GeluApprox::none>;

template <double P>
struct Dropout {
    static_assert(P >= 0.0 && P < 1.0, "Dropout probability must be in [0, 1)");

    template <class In, class T = float>
    struct op : LeafOp {
        using input_shape = In;
        using output_shape = In;
        static constexpr std::size_t param_count = 0;
        using LeafOp::LeafOp;
        void init(float*, std::uint64_t) const {}
        template <class Ctx>
        void forward(Ctx& ctx, const Pass& pass, const ForwardArgs<T>& a) const
        {
            if (pass.training && P > 0.0)
                dropout_apply(ctx, float(P), pass.seed, id, pass.first_sample, a.x, a.y, a.n, In::size, In::channels);
            else
                copy(ctx, a.x, a.y, a.n * In::size);
        }
        template <class Ctx>
        void backward(Ctx& ctx, const Pass& pass, const BackwardArgs<T>& a) const
        {
            if (!a.dx) return;
            if (pass.training && P > 0.0)
                dropout_apply(ctx, float(P), pass.seed, id, pass.first_sample, a.dy, a.dx, a.n, In::size, In::channels);
            else
                copy(ctx, a.dy, a.dx, a.n * In::size);
        }
        // Decoding evaluates: the identity.
        static void decode(const DecodeArgs& a)
            requires(In::rank == 2)
        {
            decode_map<In>(a, [](float v) { return v; });
        }
    };
};

// Identity: y = x. A view (op.hpp): between two ops of a model it does not run at all; first or last
// in a model it copies (its output, or its input gradient, is the caller's buffer).
struct Identity {
    template <class In, class T = float>
    struct op : LeafOp {
        using input_shape = In;
        using output_shape = In;
        static constexpr std::size_t param_count = 0;
        static constexpr bool is_view = true;
        using LeafOp::LeafOp;
        void init(float*, std::uint64_t) const {}
        template <class Ctx>
        void forward(Ctx& ctx, const Pass&, const ForwardArgs<T>& a) const
        {
            copy(ctx, a.x, a.y, a.n * In::size);
        }
        template <class Ctx>
        void backward(Ctx& ctx, const Pass&, const BackwardArgs<T>& a) const
        {
            if (a.dx) copy(ctx, a.dy, a.dx, a.n * In::size);
        }
        static void decode(const DecodeArgs& a)
            requires(In::rank == 2)
        {
            decode_map<In>(a, [](float v) { return v; });
        }
    };
};

// Flatten: (dims...) -> (product of dims), in (channels, pixels) order: what a fully connected layer
// after it reads, so that its parameters have one layout. Float activations are in that order on every
// backend, and the data does not move; 16-bit ones may be kept channels-last (backend/cuda/layout.hpp),
// and are then reordered.
struct Flatten {
    template <class In, class T = float>
    struct op : LeafOp {
        using input_shape = In;
        using output_shape = Shape<In::size>;
        static constexpr std::size_t param_count = 0;
        // Float: the same memory seen flat, so a Chain skips it between two ops (Chain::skipped_view);
        // forward and backward copy only where it ends or starts a chain.
        static constexpr bool is_view = std::same_as<T, float> || In::pixels == 1;
        using LeafOp::LeafOp;
        void init(float*, std::uint64_t) const {}
        template <class Ctx>
        void forward(Ctx& ctx, const Pass&, const ForwardArgs<T>& a) const
        {
            from_activation_layout(ctx, a.x, a.y, a.n, In::channels, In::pixels);
        }
        template <class Ctx>
        void backward(Ctx& ctx, const Pass&, const BackwardArgs<T>& a) const
        {
            if (a.dx) to_activation_layout(ctx, a.dy, a.dx, a.n, In::channels, In::pixels);
        }
    };
};

} // namespace replica::layers

namespace REPLICA_NAMESPACE {
using layers::Dropout;
using layers::Flatten;
using layers::GELU;
using layers::GeluApprox;
using layers::GELUWith;
using layers::Identity;
using layers::ReLU;
using layers::Sigmoid;
using layers::Tanh;
} // namespace replica
