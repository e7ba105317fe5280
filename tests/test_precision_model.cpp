// Models in bf16 and fp16 on the CPU: fp32 master parameters with a weight copy in the reduced type,
// inputs converted once, training close to fp32's, DataParallel equal to one model (and bit for bit in
// the reproducible mode), checkpoints that move between precisions.

#include <cmath>
#include <filesystem>
#include <vector>

#include "catch.hpp"
#include "models.hpp"
#include "replica/replica.hpp"
#include "support.hpp"

// The runner compiles the test files in groups (tests/meson.build): this file's names stay in its own
// namespace.
namespace test_precision_model {

using namespace replica;
using namespace replica::testing;

namespace {

// The model's weight copy (what its products read), as floats.
template <class M>
std::vector<float> weight_copy(M& m)
{
    std::vector<typename M::storage> w(M::param_count);
    m.visit([&](auto& ctx) {
        ctx.download(w.data(), m.weight_data(), w.size());
        ctx.synchronize();
    });
    std::vector<float> out(w.size());
    for (std::size_t i = 0; i < w.size(); ++i) out[i] = core::to_float(w[i]);
    return out;
}

template <class T>
std::vector<float> rounded(std::vector<float> v)
{
    for (float& f : v) f = core::round_through<T>(f);
    return v;
}

// Three SGD steps of Net in precision T against the same in fp32 from the same parameters: the
// updates agree to the format's precision, the master parameters stay float (not rounded to T), and
// the weight copy is the parameters rounded to T after every change.
template <class Net, class T>
void trains_close_to_fp32(double tolerance)
{
    using Reduced = with_precision<Net, T>;
    static_assert(std::same_as<typename Reduced::storage, T> && std::same_as<typename Net::storage, float>);
    const RandomBatches<Net> data(24, 5);
    Net full{Device::cpu(), 3};
    Reduced reduced{Device::cpu(), 3};
    const auto initial = parameters(full);
    REQUIRE(parameters(reduced) == initial);
    CHECK(weight_copy(reduced) == rounded<T>(initial));

    // Predictions before training: within the format's rounding of the activations.
    const auto y_full = predict(full, data.inputs.data(), 8), y_reduced = predict(reduced, data.inputs.data(), 8);
    CHECK(norm_relative(y_full, y_reduced) < tolerance);
    CHECK(norm_relative(y_full, y_reduced) > 0.0);   // it did compute in T

    SGD opt{{.lr = 0.05f, .momentum = 0.9f}};
    for (std::size_t s = 0; s < 3; ++s) {
        train_step(full, opt, data.batch(s * 8, 8, s * 8));
        train_step(reduced, opt, data.batch(s * 8, 8, s * 8));
    }
    const auto w_full = parameters(full), w_reduced = parameters(reduced);
    const double error = update_error(w_reduced, w_full, initial);
    CAPTURE(error);
    CHECK(error < 4 * tolerance);
    CHECK(w_reduced != rounded<T>(w_reduced));          // masters keep float precision
    CHECK(weight_copy(reduced) == rounded<T>(w_reduced));   // the copy follows the update
}

} // namespace

TEST_CASE("A model in bf16 or fp16 keeps fp32 parameters and trains as fp32 does, to the format's precision",
          "[cpu][precision]")
{
    trains_close_to_fp32<FusedConvNet, bf16>(2e-2);
    trains_close_to_fp32<FusedConvNet, fp16>(3e-3);
    trains_close_to_fp32<SmallResNet, bf16>(3e-2);
    trains_close_to_fp32<ConcatBatchNormNet, bf16>(3e-2);
    trains_close_to_fp32<SmallFCN, fp16>(3e-3);
    // Dropout, Linear and a nested Sequential; a nested DataParallel's replicas take the outer
    // model's precision.
    trains_close_to_fp32<SmallAlexNetPlain, bf16>(2e-2);
    trains_close_to_fp32<SmallAlexNet<Threaded>, bf16>(2e-2);
}

TEST_CASE("Max pooling in bf16 saves a byte an output: activation memory less by the positions' floats",
          "[cpu][precision][pool]")
{
    // The same network with average pooling saves nothing; everything else in the arena is the same.
    // Input (3, 9, 9); 3x3 pooling, stride 2, padding 1: (3, 5, 5).
    using WithMax = Sequential<Precision<bf16>, Input<3, 9, 9>, Conv2d<3, 3, 1, 1>, MaxPool2d<3, 2, 1>, Flatten, Linear<5>>;
    using WithAvg = Sequential<Precision<bf16>, Input<3, 9, 9>, Conv2d<3, 3, 1, 1>, AvgPool2d<3, 2, 1>, Flatten, Linear<5>>;
    constexpr std::size_t n = 6, outputs = 3 * 5 * 5;
    WithMax with_max{Device::cpu(), 3};
    WithAvg with_avg{Device::cpu(), 3};
    const std::vector<float> x(n * WithMax::input_shape::size, 0.5f);
    std::vector<float> y(n * 5);
    with_max.predict(x.data(), n, y.data());
    with_avg.predict(x.data(), n, y.data());
    // A byte an output, a sample's bytes rounded up to whole floats (75 -> 76), in place of a float
    // an output (300 bytes a sample).
    const std::size_t positions = n * ((outputs + sizeof(float) - 1) / sizeof(float)) * sizeof(float);
    CHECK(with_max.activation_bytes() == with_avg.activation_bytes() + positions);
}

TEST_CASE("A nested DataParallel in bf16 equals the plain model in bf16", "[cpu][precision][parallel]")
{
    using Nested = with_precision<SmallAlexNet<Threaded>, bf16>;
    using Plain = with_precision<SmallAlexNetPlain, bf16>;
    const RandomBatches<Plain> data(100, 3);
    Nested nested{cpus(2), 5};
    Plain plain{Device::cpu(), 5};
    plain.set_parameters(parameters(nested));
    const StepOptions fast{};
    const auto expected = five_steps(plain, data, 7, fast);
    // Two replicas sum their gradients in another order than one model: float noise, then bf16's
    // rounding of the next steps' activations.
    CHECK(max_relative_difference(five_steps(nested, data, 7, fast), expected) < 2e-2);
}

TEST_CASE("DataParallel in bf16 equals one bf16 model, and bit for bit in the reproducible mode",
          "[cpu][precision][parallel][reproducible]")
{
    using Net = with_precision<SmallResNet, bf16>;
    const RandomBatches<Net> data(100, 9);
    Net one{Device::cpu(), 2};
    const auto initial = parameters(one);
    const auto fast_one = five_steps(one, data, 3, StepOptions{});
    for (std::size_t replicas : {2, 3}) {
        DataParallel<Net, Threaded> dp{cpus(replicas), 2};
        CAPTURE(replicas);
        // The replicas' sums in another order flip a bf16 rounding now and then, and BatchNorm over a few
        // samples a replica carries the flip into the next steps: the same steps to a few percent of
        // their size (in float the same to 1e-6, test_parallel.cpp), where replicas that did not sum
        // their gradients would be off by the whole update.
        CHECK(update_error(five_steps(dp, data, 3, StepOptions{}), fast_one, initial) < 5e-2);
    }
    Net single{Device::cpu(), 2};
    const auto exact = five_steps(single, data, 3);
    const auto statistics = single.statistics();
    for (std::size_t replicas : {1, 2, 3}) {
        DataParallel<Net, Threaded> dp{cpus(replicas), 2};
        CAPTURE(replicas);
        CHECK(differences(five_steps(dp, data, 3), exact) == "");
        CHECK(differences(dp.statistics(), statistics) == "");
    }
}

TEST_CASE("Checkpoints move between precisions: they hold the fp32 master parameters", "[cpu][precision][checkpoint]")
{
    using Full = SmallResNet;
    using Reduced = with_precision<SmallResNet, bf16>;
    static_assert(model_signature<Full>() == model_signature<Reduced>());
    const RandomBatches<Full> data(40, 4);
    const auto dir = std::filesystem::temp_directory_path() / "replica-precision-checkpoint";
    std::filesystem::create_directories(dir);
    Reduced reduced{Device::cpu(), 6};
    SGD opt{{.lr = 0.05f, .momentum = 0.9f}};
    for (std::size_t s = 0; s < 2; ++s) train_step(reduced, opt, data.batch(s * 8, 8, s * 8));
    save_checkpoint(dir / "bf16.ckpt", reduced, CheckpointState{}, opt);
    Full full{Device::cpu(), 1};
    SGD opt_full{{.lr = 0.05f, .momentum = 0.9f}};
    load_checkpoint(dir / "bf16.ckpt", full, opt_full);
    CHECK(parameters(full) == parameters(reduced));
    CHECK(full.statistics() == reduced.statistics());
    CHECK(full.optimizer_state() == reduced.optimizer_state());
    // And back: fp32 to fp16.
    train_step(full, opt_full, data.batch(16, 8, 16));
    save_checkpoint(dir / "fp32.ckpt", full, CheckpointState{}, opt_full);
    with_precision<SmallResNet, fp16> half{Device::cpu(), 1};
    SGD opt_half{{.lr = 0.05f, .momentum = 0.9f}};
    load_checkpoint(dir / "fp32.ckpt", half, opt_half);
    CHECK(parameters(half) == parameters(full));
    CHECK(weight_copy(half) == rounded<fp16>(parameters(full)));
    std::filesystem::remove_all(dir);
}

namespace {

// Three steps, each queued behind the one before (train_step with the next batch), then the
// parameters, the loss sum and the predictions.
template <class M, class Data>
std::vector<float> queued_steps(M& m, const Data& data)
{
    SGD opt{{.lr = 0.05f, .momentum = 0.9f}};
    for (std::size_t s = 0; s < 3; ++s) {
        const Batch next = data.batch((s + 1) * 8, 8, (s + 1) * 8);
        train_step(m, opt, data.batch(s * 8, 8, s * 8), StepOptions{}, s < 2 ? &next : nullptr);
    }
    auto out = parameters(m);
    out.push_back(float(m.evaluate(data.inputs.data(), data.labels.data(), 8).loss_sum));
    const auto y = predict(m, data.inputs.data(), 8);
    out.insert(out.end(), y.begin(), y.end());
    return out;
}

// Convolutions whose outputs (8x4x4) are larger than the input (2x6x6): the chain's gradient buffers
// can hold the converted input. The same behind an Identity (a view first: the first convolution
// reads the input in backward while its input gradient fills a gradient buffer), which keeps the
// arena's input region; nested in a Sequential (the outer buffers, 8x2x2, are too small; the nested
// chain's hold it); and in a nested DataParallel (which holds it with one replica only).
using ConvLayers = Sequential<Conv2d<8, 3>, ReLU, Conv2d<8, 3>, ReLU>;
template <class T>
using InputInBuffer = Sequential<Precision<T>, Input<2, 6, 6>, Conv2d<8, 3>, ReLU, Conv2d<8, 3>, ReLU, Flatten, Linear<3>>;
template <class T>
using InputInRegion = Sequential<Precision<T>, Input<2, 6, 6>, Identity, Conv2d<8, 3>, ReLU, Conv2d<8, 3>, ReLU, Flatten, Linear<3>>;
template <class T>
using InputInNested = Sequential<Precision<T>, Input<2, 6, 6>, ConvLayers, Flatten, Linear<3>>;
template <class T>
using InputInReplica = Sequential<Precision<T>, Input<2, 6, 6>, DataParallel<Sequential<Input<2, 6, 6>, ConvLayers>, Threaded>,
                                  Flatten, Linear<3>>;

template <class T>
void input_in_gradient_buffer()
{
    static_assert(InputInBuffer<T>::chain::may_hold_input && !InputInRegion<T>::chain::may_hold_input);
    static_assert(InputInNested<T>::chain::may_hold_input && InputInReplica<T>::chain::may_hold_input);
    const RandomBatches<InputInBuffer<T>> data(100, 11);
    InputInRegion<T> region{Device::cpu(), 4};
    const auto w = parameters(region);
    InputInBuffer<T> buffer{Device::cpu(), 4};
    InputInNested<T> nested{Device::cpu(), 4};
    InputInReplica<T> one_replica{cpus(1), 4}, two_replicas{cpus(2), 4};
    buffer.set_parameters(w);
    nested.set_parameters(w);
    one_replica.set_parameters(w);
    two_replicas.set_parameters(w);
    const auto expected = queued_steps(region, data);
    CHECK(differences(queued_steps(buffer, data), expected) == "");
    CHECK(differences(queued_steps(nested, data), expected) == "");
    CHECK(differences(queued_steps(one_replica, data), expected) == "");
    // Two replicas keep the region (their inputs staged); their gradients sum in another order.
    CHECK(max_relative_difference(queued_steps(two_replicas, data), expected) < 2e-2);

    // The region's model keeps the Identity's output (72 values a sample) and the input (72): two
    // bf16 or fp16 regions of 8 samples more than the model whose buffers hold the input.
    const std::size_t bytes = 8 * 72 * sizeof(T);
    CHECK(region.activation_bytes() == buffer.activation_bytes() + 2 * bytes);
    // The nested chain's model holds it too; it has gradient buffers of its own for the nested
    // chain's output (2 x 32 values a sample). A nested DataParallel holds it with one replica.
    CHECK(nested.activation_bytes() == buffer.activation_bytes() + 2 * 8 * 32 * sizeof(T));
    CHECK(one_replica.activation_bytes() == nested.activation_bytes());
    CHECK(two_replicas.activation_bytes() == one_replica.activation_bytes() + bytes);

    // The reproducible mode: shards of 3 samples, each converted again before its backward.
    InputInRegion<T> region_exact{Device::cpu(), 4};
    InputInBuffer<T> buffer_exact{Device::cpu(), 4};
    buffer_exact.set_parameters(parameters(region_exact));
    const StepOptions exact{.reproducible = true, .micro_shard = 3};
    CHECK(differences(five_steps(buffer_exact, data, 2, exact), five_steps(region_exact, data, 2, exact)) == "");
}

} // namespace

TEST_CASE("bf16 and fp16 keep the converted input in a gradient buffer where it fits: the same bits, less memory",
          "[cpu][precision]")
{
    input_in_gradient_buffer<bf16>();
    input_in_gradient_buffer<fp16>();
}

} // namespace test_precision_model
