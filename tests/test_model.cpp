// model: compile-time layout, Sequential as a model and as a layer, errors.

#include "catch.hpp"
#include "models.hpp"
#include "support.hpp"

using namespace replica;
using namespace replica::testing;

// Shapes and parameter layout are compile-time facts.
static_assert(LeNet::param_count == 431080);
static_assert(std::same_as<LeNet::output_shape, Shape<10>>);
static_assert(LeNet::graph::param_offset[0] == 0 && LeNet::graph::param_offset[1] == 520);   // 20*1*5*5 + 20
static_assert(LeNet::graph::layer_count == 8);
static_assert(LeNet::label_size == 1 && SmallFCN::label_size == 32 * 32);
static_assert(std::same_as<SmallFCN::output_shape, Shape<5, 32, 32>>);
static_assert(model::Layer<ReLU> && model::Layer<Conv2d<4, 3>> && model::Layer<SmallClassifier> && !model::Layer<int>);
static_assert(model::Op<Conv2d<4, 3>::op<Shape<1, 8, 8>>>);
static_assert(!LeNet::graph::has_data_parallel && SmallAlexNet<Threaded>::graph::has_data_parallel);
// Nesting keeps layer ids distinct and in order: features take 6, the classifier follows.
static_assert(SmallAlexNetPlain::graph::id_offset[1] == 6);

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
    C{{}}.forward(ctx, eval, {w.data(), data.inputs.data(), a.data(), 3, nullptr, scratch.data()});
    for (std::size_t i = 0; i < a.size(); ++i) b[i] = std::max(a[i], 0.0f);
    L{{}}.forward(ctx, eval, {w.data() + C::param_count, b.data(), y.data(), 3, nullptr, nullptr});
    CHECK(out == y);
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
    CHECK(error_message([] { SGD{{.lr = -1.0f}}; }).find("learning rate must be > 0") != std::string::npos);
    CHECK(error_message([] { SGD{{.lr = 0.1f, .nesterov = true}}; }).find("Nesterov momentum needs momentum > 0") != std::string::npos);
}
