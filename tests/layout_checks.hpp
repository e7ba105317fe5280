#pragma once
// An optimizer that looks at the whole gradient (LossScale, an Accumulate of a ClipGradNorm) over a
// layout whose gradient lies in parts, and a TensorParallel of bf16 activations, against the plain
// model: shared by test_layouts.cpp (CPU devices) and test_cuda.cpp (stages and ranks sharing a GPU).

#include <cstddef>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "models.hpp"
#include "replica/replica.hpp"
#include "support.hpp"

namespace replica::testing {

// Batches whose input feature 0 is 2^20 in the first step's samples, and M's parameters from seed 5
// with its first Linear<16> taking nothing from feature 0 and its hidden units 8-15 dead (biases of
// -100): the weights from feature 0 of units 0-7 get a gradient about 2^20 times any other, which
// overflows at a scale that keeps every other gradient finite. That is in a pipeline's first stage,
// and on a TensorParallel's first rank (units 0-7 are its share), only.
template <class M>
struct LoudFirstStep {
    static constexpr std::size_t in = M::input_shape::size, hidden = 16;
    RandomBatches<M> data{50, 3};
    std::vector<float> w;
    LoudFirstStep()
    {
        for (std::size_t s = 0; s < 10; ++s) data.inputs[s * in] = 0x1p20f;
        M m{Device::cpu(), 5};
        w = parameters(m);
        for (std::size_t j = 0; j < hidden; ++j) w[j * in] = 0.0f;                      // weights (16, in)
        for (std::size_t j = hidden / 2; j < hidden; ++j) w[hidden * in + j] = -100.0f;   // then biases
    }
};

// 5 steps of 10 samples under the LossScale `opt` (a copy), from the first step of `loud`: whether
// each was skipped, and the scale after it.
template <class Model, class Data, class Opt>
std::pair<std::vector<bool>, std::vector<float>> five_scaled_steps(Model& model, const Data& loud, Opt opt)
{
    model.set_parameters(loud.w);
    std::pair<std::vector<bool>, std::vector<float>> seen;
    for (std::size_t s = 0; s < 5; ++s) {
        train_step(model, opt, loud.data.batch(s * 10, 10, s * 10));
        seen.first.push_back(opt.skipped_last());
        seen.second.push_back(opt.scale());
    }
    return seen;
}

// LossScale `opt` (init_scale 2^120, backoff_factor 2^-10, growth_interval 2) over the layout that
// make() builds against the plain model M on `device`: the first step overflows in one part only and
// is skipped on every part (with an Accumulate of 2: the first window), the scale backs off once to
// 2^110 and then grows every 2 clean updates, as on the plain model; the parameters are the plain
// model's within `tolerance` (the same bits where it is 0: the same sums in the same order).
template <class M, class Make, class Opt>
void check_scaled_equals_plain(Make&& make, const Opt& opt, double tolerance, Device device = Device::cpu())
{
    const LoudFirstStep<M> loud;
    M plain{device, 5};
    auto layout = make();
    const auto want = five_scaled_steps(plain, loud, opt);
    const auto got = five_scaled_steps(layout, loud, opt);
    if constexpr (requires { opt.wrapped().updates_now(); }) {
        CHECK(want.first == std::vector<bool>{false, true, false, false, false});
        CHECK(want.second == std::vector<float>{0x1p120f, 0x1p110f, 0x1p110f, 0x1p110f, 0x1p110f});
    } else {
        CHECK(want.first == std::vector<bool>{true, false, false, false, false});
        CHECK(want.second == std::vector<float>{0x1p110f, 0x1p110f, 0x1p111f, 0x1p111f, 0x1p112f});
    }
    CHECK(got.first == want.first);
    CHECK(got.second == want.second);
    if (tolerance == 0.0) CHECK(differences(parameters(layout), parameters(plain)) == "");
    else CHECK(norm_relative(parameters(layout), parameters(plain)) < tolerance);
}

// Accumulate{ClipGradNorm{opt, max_norm}, 2} over the layout that make() builds against the plain
// model M on `device`, 6 steps (three windows): a bound that clips each window's mean (the result
// differs from opt's alone by more than clip_effect), and one that none reaches (the plain model's
// result is Accumulate{opt, 2}'s bit for bit); within `tolerance`, less the parameters of no gradient.
template <class M, class Make, class Opt>
void check_accumulated_clip_equals_plain(Make&& make, const Opt& opt, double clip_effect, double tolerance,
                                         Device device = Device::cpu())
{
    const TokenBatches<M> data(60, 3);
    const std::vector<bool> noise = zero_gradient<M>(data, device);
    auto six = [&](auto& model, auto o) {
        for (std::size_t s = 0; s < 6; ++s) train_step(model, o, data.batch(s * 10, 10, s * 10));
        return without(parameters(model), noise);
    };
    M unclipped{device, 5};
    const std::vector<float> alone = six(unclipped, Accumulate{opt, 2});
    for (const float max_norm : {0.05f, 1e4f}) {
        CAPTURE(max_norm);
        M plain{device, 5};
        auto layout = make();
        const std::vector<float> want = six(plain, Accumulate{ClipGradNorm{opt, max_norm}, 2});
        const std::vector<float> got = six(layout, Accumulate{ClipGradNorm{opt, max_norm}, 2});
        CHECK(norm_relative(want, got) < tolerance);
        // The optimizer state in the plain model's layout (an Accumulate's sums, then its optimizer's
        // state: two planes, model/state_planes.hpp).
        REQUIRE(layout.optimizer_state().size() == plain.optimizer_state().size());
        CHECK(norm_relative(plain.optimizer_state(), layout.optimizer_state()) < tolerance);
        // Resumed from the plain model's parameters and state, the layout goes on as the plain model does.
        auto resumed = make();
        resumed.set_parameters(parameters(plain));
        resumed.set_optimizer_state(plain.optimizer_state());
        CHECK(differences(resumed.optimizer_state(), plain.optimizer_state()) == "");   // kept until an update
        auto two_more = [&](auto& model) {
            Accumulate o{ClipGradNorm{opt, max_norm}, 2};
            for (std::size_t s = 0; s < 2; ++s) train_step(model, o, data.batch(s * 10, 10, (s + 6) * 10));
            return without(parameters(model), noise);
        };
        CHECK(norm_relative(two_more(plain), two_more(resumed)) < tolerance);
        if (max_norm < 1.0f) CHECK(norm_relative(want, alone) > clip_effect);
        else CHECK(differences(want, alone) == "");
    }
}

// TensorParallel<PipeGpt in bf16, 2> on `devices` against the plain bf16 model on `device`, 5 AdamW
// steps: each rank's part of a sum is rounded to bf16 before the sum, so the result is as far from the
// plain bf16 model's as that is from the float model's; the whole blocks are the same bits on every
// rank.
inline void check_bf16_split_equals_plain(std::vector<Device> devices, Device device = Device::cpu())
{
    using Gpt16 = with_precision<PipeGpt, bf16>;
    using TP = TensorParallel<Gpt16, 2>;
    const TokenBatches<PipeGpt> data(50, 3);
    const std::vector<bool> noise = zero_gradient<PipeGpt>(data, device);   // key biases, absent tokens
    auto five = [&](auto& model) {
        AdamW opt{{.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.95f, .weight_decay = 0.1f}};
        for (std::size_t s = 0; s < 5; ++s) train_step(model, opt, data.batch(s * 10, 10, s * 10));
        return without(parameters(model), noise);
    };
    Gpt16 plain{device, 5};
    PipeGpt in_float{device, 5};
    TP split{std::move(devices), 5};
    const std::vector<float> want = five(plain), got = five(split), whole = five(in_float);
    const double rounding = norm_relative(want, whole);
    CHECK(rounding > 1e-3);
    CHECK(norm_relative(want, got) < 2 * rounding);
    CHECK(norm_relative(whole, got) < 2 * rounding);
    const std::vector<float> first = split.rank(0).parameters(), other = split.rank(1).parameters();
    for (const auto& range : model::param_ranges_of<typename TP::shard_type::chain>)
        if (range.split.runs == 0)
            for (std::size_t i = range.offset; i < range.offset + range.count; ++i) REQUIRE(other[i] == first[i]);
}

} // namespace replica::testing
