#pragma once
// Layer normalisation, PyTorch's nn.LayerNorm over the last axis of a sample.
//   LayerNorm<>                            (features) or (positions, features) -> the same; each row
//                                          of features normalised on its own
//   LayerNorm<LayerNormOptions{...}>       PyTorch's LayerNorm(eps, elementwise_affine) arguments
// y = (x - mean) / sqrt(var + eps) * weight + bias, the mean and the biased variance over the row's
// features. Parameters (affine): weight (features, initialised to 1), then bias (features, 0); without
// affine none. No state beyond the step: training and evaluation compute the same, and a sample's
// output depends on that sample alone, so it trains the same on any number of replicas. Saved from
// forward to backward: each row's mean and 1 / sqrt(var + eps).

#include <array>
#include <bit>
#include <cstddef>
#include <cmath>
#include <cstdint>

#include "replica/core/config.hpp"
#include "replica/layers/decode.hpp"
#include "replica/layers/op.hpp"

namespace REPLICA_NAMESPACE::layers {

// LayerNorm's options, PyTorch's LayerNorm(eps, elementwise_affine) arguments. A structural type: a
// template argument of LayerNorm.
struct LayerNormOptions {
    float eps = 1e-5f;    // added to the variance
    bool affine = true;   // a weight and a bias per feature, trained

    friend constexpr bool operator==(const LayerNormOptions&, const LayerNormOptions&) = default;
};

template <LayerNormOptions Options = LayerNormOptions{}>
struct LayerNorm {
    static_assert(Options.eps > 0.0f, "LayerNormOptions: eps must be > 0 (PyTorch's default is 1e-5)");
    static constexpr LayerNormOptions options = Options;
    static constexpr float eps = Options.eps;
    static constexpr bool affine = Options.affine;

    template <class In, class T = float>
    struct op : LeafOp {
        static_assert(In::rank == 1 || In::rank == 2,
                      "LayerNorm normalises the last axis of a (features) or (positions, features) input: put "
                      "Flatten before it for an image");
        using input_shape = In;
        using output_shape = In;
        static constexpr std::size_t rows = In::rank == 1 ? 1 : In::dims[0];   // a sample's
        static constexpr std::size_t F = In::size / rows;                      // features a row
        static constexpr std::size_t param_count = affine ? 2 * F : 0;          // weight, bias
        static constexpr std::array param_blocks{core::ParamBlock{affine ? F : 0, core::ParamKind::scale},
                                                 core::ParamBlock{affine ? F : 0, core::ParamKind::shift}};
        static constexpr std::size_t saved_size = 2 * rows;   // mean, then 1 / sqrt(var + eps), of each row
        // Options beyond the defaults, for checkpoints' model signature (0: the defaults).
        static constexpr std::uint64_t options_signature =
            Options == LayerNormOptions{}
                ? 0
                : (std::uint64_t(std::bit_cast<std::uint32_t>(Options.eps)) << 32 | std::uint64_t(Options.affine) << 1 | 1);

        using LeafOp::LeafOp;
        void init(float* p, std::uint64_t) const
        {
            if constexpr (affine)
                for (std::size_t f = 0; f < F; ++f) p[f] = 1.0f, p[F + f] = 0.0f;
        }
        template <class Ctx>
        void forward(Ctx& ctx, const Pass&, const ForwardArgs<T>& a) const
        {
            float* mean = a.saved;
            float* rstd = a.saved + a.n * rows;
            layer_norm_forward(ctx, a.x, a.y, weight(a.params), bias(a.params), a.n * rows, F, eps, mean, rstd);
        }
        template <class Ctx>
        void backward(Ctx& ctx, const Pass&, const BackwardArgs<T>& a) const
        {
            const float* mean = a.saved;
            const float* rstd = a.saved + a.n * rows;
            layer_norm_backward(ctx, a.x, a.dy, weight(a.params), mean, rstd, a.dx, affine ? a.dparams : nullptr,
                                affine ? a.dparams + F : nullptr, a.n * rows, F);
        }
        // One position of a sequence (layers/decode.hpp): forward's arithmetic on its row.
        static void decode(const DecodeArgs& a)
            requires(In::rank == 2)
        {
            float sum = 0.0f;
            for (std::size_t f = 0; f < F; ++f) sum += a.x[f];
            const float m = sum / float(F);
            float squares = 0.0f;
            for (std::size_t f = 0; f < F; ++f) squares += (a.x[f] - m) * (a.x[f] - m);
            const float s = 1.0f / std::sqrt(squares / float(F) + eps);
            for (std::size_t f = 0; f < F; ++f) {
                const float h = (a.x[f] - m) * s;
                a.y[f] = affine ? h * a.params[f] + a.params[F + f] : h;
            }
        }

    private:
        static const float* weight(const float* params) { return affine ? params : nullptr; }
        static const float* bias(const float* params) { return affine ? params + F : nullptr; }
    };
};

} // namespace replica::layers

namespace REPLICA_NAMESPACE {
using layers::LayerNorm;
using layers::LayerNormOptions;
} // namespace replica
