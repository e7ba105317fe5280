// model: compile-time layout, Sequential as a model and as a layer, errors.

#include "catch.hpp"
#include "models.hpp"
#include "support.hpp"

// The runner compiles the test files in groups (tests/meson.build): this file's names stay in its own
// namespace.
namespace test_model {

using namespace replica;
using namespace replica::testing;

// Shapes and parameter layout are compile-time facts.
static_assert(LeNet::param_count == 431080);
static_assert(std::same_as<LeNet::output_shape, Shape<10>>);
static_assert(LeNet::chain::param_offset[0] == 0 && LeNet::chain::param_offset[1] == 520);   // 20*1*5*5 + 20
static_assert(LeNet::chain::layer_count == 8);
static_assert(LeNet::label_size == 1 && SmallFCN::label_size == 32 * 32);
static_assert(std::same_as<SmallFCN::output_shape, Shape<5, 32, 32>>);
static_assert(model::Layer<ReLU> && model::Layer<Conv2d<4, 3>> && model::Layer<SmallClassifier> && !model::Layer<int>);
static_assert(model::Op<Conv2d<4, 3>::op<Shape<1, 8, 8>>>);
static_assert(!LeNet::chain::spans_devices && SmallAlexNet<Threaded>::chain::spans_devices);
// Nesting keeps layer ids distinct and in order: features take 6, the classifier follows.
static_assert(SmallAlexNetPlain::chain::id_offset[1] == 6);

// The training contract: what train_step, the Trainer and checkpoints rely on, and what a DataParallel
// needs of the model it replicates.
static_assert(model::TrainableModel<LeNet> && model::Replica<LeNet>);
static_assert(model::TrainableModel<DataParallel<LeNet, Threaded>> && !model::Replica<DataParallel<LeNet, Threaded>>);
static_assert(model::TrainableModel<AutoParallel<LeNet>> && model::TrainableModel<SmallAlexNet<SingleThread>>);
static_assert(!model::TrainableModel<int> && !model::TrainableModel<SmallClassifier::op<Shape<16, 8, 8>>>);
// The loss ends a model's entries; without one it is SoftmaxCrossEntropy, and the layers are the same.
using ExplicitLoss = Sequential<Input<1, 28, 28>, Conv2d<20, 5>, MaxPool2d<2>, Conv2d<50, 5>, MaxPool2d<2>, Flatten,
                                Linear<500>, ReLU, Linear<10>, SoftmaxCrossEntropy>;
static_assert(std::same_as<ExplicitLoss::loss, SoftmaxCrossEntropy> && std::same_as<LeNet::loss, SoftmaxCrossEntropy>);
static_assert(std::same_as<ExplicitLoss::chain, LeNet::chain>);

TEST_CASE("Sequential runs its layers in order", "[cpu]")
{
    using Net = Sequential<Input<2, 6, 6>, Conv2d<3, 3>, ReLU, Flatten, Linear<4>>;
    Net net{Device::cpu(), 4};
    const RandomBatches<Net> data(3, 1);
    const auto out = predict(net, data.inputs.data(), 3);

    // The same layers by hand.
    backend::cpu::Context ctx{Device::cpu()};
    const auto w = parameters(net);
    using C = Conv2d<3, 3>::op<Shape<2, 6, 6>>;
    using L = Linear<4>::op<Shape<48>>;
    std::vector<float> a(3 * 48), b(3 * 48), y(3 * 4), scratch(C{{}}.scratch_size(ctx, 3));
    const model::Pass eval{.training = false};
    C{{}}.forward(ctx, eval, {w.data(), w.data(), data.inputs.data(), a.data(), 3, nullptr, nullptr, scratch.data()});
    for (std::size_t i = 0; i < a.size(); ++i) b[i] = std::max(a[i], 0.0f);
    L{{}}.forward(ctx, eval, {w.data() + C::param_count, w.data() + C::param_count, b.data(), y.data(), 3, nullptr, nullptr,
                              nullptr});
    CHECK(out == y);
}

namespace {
// Five steps of a network whose layers fuse the ReLU after them, against the same network with a
// Dropout<0.0> between each such layer and its ReLU (nothing fused): the same bits.
template <class Fused, class Unfused>
void fused_trains_as_apart()
{
    const RandomBatches<Fused> data(100, 3);
    Fused fused{Device::cpu(), 5};
    Unfused apart{Device::cpu(), 5};
    apart.set_parameters(parameters(fused));   // the Dropouts take layer ids: other initial weights
    const auto expected = five_steps(apart, data, 7, {});
    CHECK(differences(five_steps(fused, data, 7, {}), expected) == "");
    CHECK(max_relative_difference(expected, parameters(Unfused{Device::cpu(), 5})) > 1e-3);   // it trained
}
} // namespace

TEST_CASE("A convolution fused with the ReLU after it trains to the same bits as the two apart", "[cpu]")
{
    static_assert(FusedConvNet::chain::fuses_next_relu<0> && FusedConvNet::chain::fuses_next_relu<2>);
    static_assert(!UnfusedConvNet::chain::fuses_next_relu<0> && !FusedConvNet::chain::fuses_next_relu<1>);
    fused_trains_as_apart<FusedConvNet, UnfusedConvNet>();
}

TEST_CASE("A fully connected layer fused with the ReLU after it trains to the same bits as the two apart", "[cpu]")
{
    static_assert(FusedMlpNet::chain::fuses_next_relu<1> && FusedMlpNet::chain::fuses_next_relu<3>);
    static_assert(!UnfusedMlpNet::chain::fuses_next_relu<1> && !FusedMlpNet::chain::fuses_next_relu<5>);
    fused_trains_as_apart<FusedMlpNet, UnfusedMlpNet>();
}

TEST_CASE("A fully connected layer applying the GELU after it in its forward pass trains to the same bits as the two apart",
          "[cpu][transformer]")
{
    static_assert(GeluMlpNet::chain::fuses_next_gelu<1> && GeluMlpNet::chain::fuses_next_gelu<3>);
    static_assert(!GeluMlpApart::chain::fuses_next_gelu<1> && !GeluMlpNet::chain::fuses_next_gelu<2> &&
                  !Sequential<Input<6>, Linear<8>, GELU, Linear<2>>::chain::fuses_next_gelu<0>);   // the erf form
    static_assert(Sequential<Input<4, 16>, LayerNorm<>, Linear<64>, GELUWith<GeluApprox::tanh>, Linear<16>>::chain::fuses_next_gelu<1>);
    fused_trains_as_apart<GeluMlpNet, GeluMlpApart>();
}

TEST_CASE("A Residual whose body ends in a fully connected layer or attention adds the other branch in the product: "
          "the same bits as apart", "[cpu][transformer]")
{
    fused_trains_as_apart<ResidualMlpNet, ResidualMlpApart>();
    const TokenBatches<ResidualAttentionNet> data(100, 3);
    ResidualAttentionNet fused{Device::cpu(), 5};
    ResidualAttentionApart apart{Device::cpu(), 5};
    apart.set_parameters(parameters(fused));
    const auto expected = five_steps(apart, data, 7, {});
    CHECK(differences(five_steps(fused, data, 7, {}), expected) == "");
    CHECK(max_relative_difference(expected, parameters(ResidualAttentionApart{Device::cpu(), 5})) > 1e-3);
}

// A nested model fuses the ReLU after it when its last layer does: ResNet's ConvBN, ReLU (BatchNorm
// reads the ReLU's mask in its backward), a residual block's body, a model two levels deep; a model
// ending in a ReLU does not; a Residual fuses the ReLU after it as before, not the body's.
static_assert(FusedNestedNet::chain::fuses_next_relu<0> && FusedNestedNet::chain::fuses_next_relu<2> &&
              FusedNestedNet::chain::fuses_next_relu<4>);
static_assert(!UnfusedNestedNet::chain::fuses_next_relu<0> && !UnfusedNestedNet::chain::fuses_next_relu<1> &&
              !UnfusedNestedNet::chain::fuses_next_relu<6>);
static_assert(Sequential<NestedConvBN<4>, ReLU, NestedConvBN<4>>::op<Shape<4, 8, 8>>::fuses_next_relu<0>);
static_assert(Sequential<NestedConvBN<4>, ReLU, NestedConvBN<4>>::op<Shape<4, 8, 8>>::fuses_relu);
template <class O>
constexpr bool declares_fuses_relu = requires { O::fuses_relu; };
static_assert(!declares_fuses_relu<Sequential<Conv2d<3, 3>, ReLU>::op<Shape<2, 8, 8>>>);
static_assert(ResNet20::chain::fuses_next_relu<0>);

TEST_CASE("A nested model fused with the ReLU after it trains to the same bits as the two apart", "[cpu][batchnorm]")
{
    fused_trains_as_apart<FusedNestedNet, UnfusedNestedNet>();
    fused_trains_as_apart<with_precision<FusedNestedNet, bf16>, with_precision<UnfusedNestedNet, bf16>>();
    // Over replicas (BatchNorm's sums at the hook's sync points), in the fast and the reproducible mode.
    const RandomBatches<FusedNestedNet> data(100, 3);
    for (const StepOptions options : {StepOptions{}, kReproducible}) {
        CAPTURE(options.reproducible);
        DataParallel<FusedNestedNet, Threaded> fused{cpus(2), 5};
        DataParallel<UnfusedNestedNet, Threaded> apart{cpus(2), 5};
        apart.set_parameters(parameters(fused));
        const auto expected = five_steps(apart, data, 7, options);
        CHECK(differences(five_steps(fused, data, 7, options), expected) == "");
    }
}

TEST_CASE("Models start from their seed", "[cpu]")
{
    CHECK(parameters(LeNet{Device::cpu(), 1}) == parameters(LeNet{Device::cpu(), 1}));
    CHECK(parameters(LeNet{Device::cpu(), 1}) != parameters(LeNet{Device::cpu(), 2}));
}

TEST_CASE("A training step lowers the loss and allocates nothing once warm", "[cpu]")
{
    LeNet net{Device::cpu()};
    SGD opt{{.lr = 0.05f, .momentum = 0.9f}};
    const RandomBatches<LeNet> data(16, 3);
    const float first = train_step(net, opt, data.batch(0, 16, 0));
    const float* params = net.parameter_data();
    float last = first;
    for (int i = 0; i < 20; ++i) last = train_step(net, opt, data.batch(0, 16, 0));
    CHECK(last < 0.5f * first);
    CHECK(net.parameter_data() == params);
}

TEST_CASE("Misuse at run time gets a clear error", "[cpu]")
{
    LeNet net{Device::cpu()};
    CHECK(error_message([&] { net.set_parameters(std::vector<float>(10)); }).find("the model has 431080") != std::string::npos);
    std::vector<float> x(784);
    std::vector<std::int32_t> bad_label{12};
    SGD opt;
    CHECK(error_message([&] { train_step(net, opt, Batch{x.data(), bad_label.data(), 1}); }).find("outside [0, 10)") != std::string::npos);
    // A batch with a bad label changes nothing, also when it was named as the next batch (nothing is
    // queued ahead for it) and on several replicas.
    const RandomBatches<LeNet> data(4, 3);
    std::vector<std::int32_t> labels(data.labels.begin() + 2, data.labels.end());
    labels[1] = 10;
    const Batch good = data.batch(0, 2, 0), bad{data.inputs.data() + 2 * LeNet::input_shape::size, labels.data(), 2, 2};
    auto unchanged_by_bad_batch = [&](auto& model) {
        train_step(model, opt, good, {}, &bad);
        const auto w = parameters(model), state = model.optimizer_state();
        CHECK(error_message([&] { train_step(model, opt, bad); }).find("label 10 of element 1 is outside [0, 10)") != std::string::npos);
        CHECK(parameters(model) == w);
        CHECK(model.optimizer_state() == state);
    };
    unchanged_by_bad_batch(net);
    DataParallel<LeNet, Threaded> dp{{Device::cpu(0), Device::cpu(1)}};
    unchanged_by_bad_batch(dp);
    CHECK(error_message([] { SGD{{.lr = -1.0f}}; }).find("learning rate must be > 0") != std::string::npos);
    CHECK(error_message([] { SGD{{.lr = 0.1f, .nesterov = true}}; }).find("Nesterov momentum needs momentum > 0") != std::string::npos);
}

// ---- Staging: the GPU path's bookkeeping, against a stand-in device that logs what it is asked ----

namespace {
struct LoggingDevice {
    static constexpr bool host_visible = false;
    mutable std::vector<std::string> log;
    mutable int events = 0;
    template <class T>
    core::Buffer<T> allocate(std::size_t n) const
    {
        log.push_back("allocate");
        return core::Buffer<T>::host(n);
    }
    template <class T>
    const T* stage(const T* host, T* staging, std::size_t n) const
    {
        if (n) std::copy(host, host + n, staging);
        log.push_back("stage");
        return staging;
    }
    void begin_copies() const { log.push_back("begin_copies"); }
    template <class T>
    void copy_async(T* dst, const T* host, std::size_t n) const
    {
        std::copy(host, host + n, dst);
        log.push_back("copy_async");
    }
    core::Event end_copies() const { return {reinterpret_cast<void*>(std::uintptr_t(++events))}; }
    void wait(core::Event e) const { log.push_back("wait " + std::to_string(std::uintptr_t(e.handle))); }
};
} // namespace

TEST_CASE("Staging copies a step's batch on the copy stream into the step's buffer, other inputs in order", "[cpu][model]")
{
    LoggingDevice dev;
    model::Staging<float, 2, 1> staging;
    staging.reserve(dev, 3);
    const std::vector<float> a{1, 2, 3, 4, 5, 6}, b{7, 8, 9, 10, 11, 12}, c{13, 14, 15, 16, 17, 18};
    const std::vector<std::int32_t> la{1, 2, 3}, lb{4, 5, 6}, lc{7, 8, 9};
    auto same = [](const float* xd, const std::int32_t* ld, const std::vector<float>& x, const std::vector<std::int32_t>& l) {
        return std::vector<float>(xd, xd + 6) == x && std::vector<std::int32_t>(ld, ld + 3) == l;
    };

    // Step in slot 0 on a: copied on the copy stream, and the compute stream waits for that copy.
    dev.log.clear();
    const auto [xa, la_d] = staging.take_for_step(dev, a.data(), la.data(), 3, 0);
    CHECK(same(xa, la_d, a, la));
    CHECK(dev.log == std::vector<std::string>{"begin_copies", "copy_async", "copy_async", "wait 1"});
    // The next step, queued while it computes, goes into the other buffer and leaves a's alone.
    const auto [xb, lb_d] = staging.take_for_step(dev, b.data(), lb.data(), 3, 1);
    CHECK(same(xb, lb_d, b, lb));
    CHECK(xb != xa);
    CHECK(same(xa, la_d, a, la));
    // Anything else (evaluate, predict) is copied in order on the compute stream.
    dev.log.clear();
    const auto [xc, lc_d] = staging.take(dev, c.data(), lc.data(), 3);
    CHECK(same(xc, lc_d, c, lc));
    CHECK(dev.log == std::vector<std::string>{"stage", "stage"});
}

} // namespace test_model
