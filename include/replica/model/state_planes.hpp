#pragma once
// An optimizer's state as a model keeps it for a slice of T trainable parameters: planes, one after
// another, plane p holding w_p floats a parameter in the parameters' order. Most optimizers keep one
// plane (SGD's velocity; Adam's m and v side by side); an Accumulate keeps its sum as a plane of its
// own before its optimizer's. The model's optimizer_state() (and a checkpoint) is the whole model's
// planes.
//
// A layout whose parts hold slices of the parameters (a Pipeline's stages, a TensorParallel's ranks,
// ZeRO-1's shards) cannot concatenate its parts' states where there are several planes: each part's
// planes are its own slice's. It goes through the parameter-major order (a parameter's floats of every
// plane together), where slices concatenate as the parameters do: SlicedState converts, by the
// planes of the optimizer that last updated (adopt<Opt>()). A state set before any update, when the
// planes are not known yet, is kept whole and handed to the parts at the first update.

#include <array>
#include <cstddef>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "replica/core/config.hpp"
#include "replica/core/error.hpp"

namespace REPLICA_NAMESPACE::model {

// The widths of Opt's planes: Opt::state_planes where it says (an Accumulate, and the optimizers that
// wrap another and keep its state), else one plane of Opt::state_per_param.
template <class Opt>
constexpr auto state_planes_of()
{
    if constexpr (requires { Opt::state_planes; }) return Opt::state_planes;
    else return std::array<std::size_t, 1>{Opt::state_per_param};
}

// {width} followed by Opt's planes: an optimizer that keeps a plane of its own before Opt's.
template <std::size_t Width, class Opt>
constexpr auto plane_before()
{
    constexpr auto inner = state_planes_of<Opt>();
    std::array<std::size_t, inner.size() + 1> planes{Width};
    for (std::size_t i = 0; i < inner.size(); ++i) planes[i + 1] = inner[i];
    return planes;
}

class SlicedState {
public:
    // The planes of Opt, which updates the parts from now on; true where a whole state set before
    // (keep()) waits to be handed to the parts (take()).
    template <class Opt>
    bool adopt()
    {
        constexpr auto planes = state_planes_of<Opt>();
        planes_.assign(planes.begin(), planes.end());
        return !kept_.empty();
    }
    bool known() const { return !planes_.empty(); }
    // A whole state given while the planes are unknown, kept as it is until the first update.
    void keep(std::span<const float> state) { kept_.assign(state.begin(), state.end()); }
    const std::vector<float>& kept() const { return kept_; }
    std::vector<float> take() { return std::exchange(kept_, {}); }

    // A slice's state of `count` parameters, plane by plane, in the parameter-major order; and back.
    std::vector<float> parameter_major(std::span<const float> state, std::size_t count) const
    {
        return convert(state, count, true);
    }
    std::vector<float> plane_major(std::span<const float> state, std::size_t count) const
    {
        return convert(state, count, false);
    }

private:
    std::vector<float> convert(std::span<const float> state, std::size_t count, bool to_parameters) const
    {
        if (planes_.size() <= 1 || state.empty()) return {state.begin(), state.end()};
        const std::size_t per = std::accumulate(planes_.begin(), planes_.end(), std::size_t{0});
        core::require(state.size() == per * count, "optimizer state of " + std::to_string(state.size()) +
                                                       " values for " + std::to_string(count) + " parameters of " +
                                                       std::to_string(per) + " each");
        std::vector<float> out(state.size());
        std::size_t plane = 0, column = 0;
        for (const std::size_t w : planes_) {
            for (std::size_t i = 0; i < count; ++i)
                for (std::size_t k = 0; k < w; ++k) {
                    const std::size_t planar = plane + i * w + k, by_parameter = i * per + column + k;
                    if (to_parameters) out[by_parameter] = state[planar];
                    else out[planar] = state[by_parameter];
                }
            plane += w * count;
            column += w;
        }
        return out;
    }

    std::vector<std::size_t> planes_;   // empty: no update yet
    std::vector<float> kept_;
};

} // namespace replica::model
