// The standard networks: shapes and parameter counts at compile time, and one CPU training step each.

#include "catch.hpp"
#include "models.hpp"
#include "support.hpp"

#include <bit>
#include <cstdint>
#include <vector>

// The runner compiles the test files in groups (tests/meson.build): this file's names stay in its own
// namespace.
namespace test_models {

using namespace replica;
using namespace replica::testing;

static_assert(std::same_as<LeNet::output_shape, Shape<10>> && LeNet::param_count == 431080);
static_assert(std::same_as<AlexNetFeatures::output_shape, Shape<256, 6, 6>>);
static_assert(std::same_as<AlexNet::output_shape, Shape<1000>> && AlexNet::param_count == 61100840);
static_assert(AlexNetPlain::param_count == AlexNet::param_count);
static_assert(std::same_as<GoogLeNet::output_shape, Shape<1000>>);
// Inception v1 with biases, 5x5 branches and no auxiliary heads.
static_assert(GoogLeNet::param_count == 6998552);
static_assert(std::same_as<TextCNN::output_shape, Shape<14>> && TextCNN::param_count == 11348238);
static_assert(std::same_as<FCN::output_shape, Shape<21, 256, 256>> && FCN::param_count == 40917);
static_assert(default_batch_size<LeNet> == 64 && default_batch_size<AlexNet> == 128 &&
              default_batch_size<GoogLeNet> == 32 && default_batch_size<TextCNN> == 128 &&
              default_batch_size<FCN> == 16);

// The residual networks: torchvision's parameter counts (static_asserted in models/resnet.hpp too).
static_assert(std::same_as<ResNet18::output_shape, Shape<1000>> && ResNet18::param_count == 11689512);
static_assert(std::same_as<ResNet50::output_shape, Shape<1000>> && ResNet50::param_count == 25557032);
static_assert(std::same_as<ResNet20::output_shape, Shape<10>>);
// BatchNorm statistics: two per channel of every BatchNorm (ResNet20: 19 of them, 16 to 64 channels).
static_assert(ResNet20::statistics_count == 2 * (16 + 6 * 16 + 6 * 32 + 32 + 6 * 64 + 64));
static_assert(ResNet18::statistics_count == 2 * 4800);

// Inception 3a: 64 + 128 + 32 + 32 channels at 28x28.
static_assert(std::same_as<Inception<64, 96, 128, 16, 32, 32>::op<Shape<192, 28, 28>>::output_shape, Shape<256, 28, 28>>);

namespace {
template <class M>
void one_step_lowers_the_loss(float lr)
{
    M net{Device::cpu()};
    SGD opt{{.lr = lr}};
    const RandomBatches<M> data(2, 1);
    const auto before = net.evaluate(data.inputs.data(), data.labels.data(), 2).loss_sum;
    train_step(net, opt, data.batch(0, 2, 0));
    const auto after = net.evaluate(data.inputs.data(), data.labels.data(), 2).loss_sum;
    CAPTURE(before, after);
    CHECK(after < before);
}
// With BatchNorm the evaluation uses running estimates that one step barely moves: compare the loss
// in training mode instead.
template <class M>
void one_step_lowers_the_training_loss(float lr)
{
    M net{Device::cpu()};
    SGD opt{{.lr = lr}};
    const RandomBatches<M> data(4, 1);
    const auto before = net.forward_backward({}, data.inputs.data(), data.labels.data(), 4, 0.25f);
    train_step(net, opt, data.batch(0, 4, 0));
    const auto after = net.forward_backward({}, data.inputs.data(), data.labels.data(), 4, 0.25f);
    CAPTURE(before, after);
    CHECK(after < before);
}
} // namespace

TEST_CASE("One training step lowers the loss on a repeated batch: ResNet20", "[cpu][models]") { one_step_lowers_the_training_loss<ResNet20>(0.05f); }
TEST_CASE("One training step lowers the loss on a repeated batch: ResNet18", "[cpu][models]") { one_step_lowers_the_training_loss<ResNet18>(0.05f); }
TEST_CASE("One training step lowers the loss on a repeated batch: LeNet", "[cpu][models]") { one_step_lowers_the_loss<LeNet>(0.01f); }
TEST_CASE("One training step lowers the loss on a repeated batch: AlexNet", "[cpu][models]") { one_step_lowers_the_loss<AlexNetPlain>(0.01f); }
TEST_CASE("One training step lowers the loss on a repeated batch: AlexNet, features replicated", "[cpu][models]") { one_step_lowers_the_loss<AlexNet>(0.01f); }
TEST_CASE("One training step lowers the loss on a repeated batch: GoogLeNet", "[cpu][models]") { one_step_lowers_the_loss<GoogLeNet>(0.01f); }
TEST_CASE("One training step lowers the loss on a repeated batch: TextCNN", "[cpu][models]") { one_step_lowers_the_loss<TextCNN>(0.01f); }
TEST_CASE("One training step lowers the loss on a repeated batch: FCN", "[cpu][models]") { one_step_lowers_the_loss<FCN>(0.01f); }

// The CPU backend's own loops run with AVX2 where the CPU has it (backend/cpu/vectorized.hpp), and
// must give the baseline's bits: three steps of each network under each form, parameters and
// statistics compared bit for bit. The networks run every kind of wrapped loop (BatchNorm's sums, the
// residual add, pooling, dropout, the layout passes around im2col's products, GELU and the other
// maps, SGD and AdamW), in float and in bf16, beside the unwrapped ones.
namespace {
class IsaScope {
public:
    explicit IsaScope(backend::cpu::Isa isa) : before_(backend::cpu::isa()) { backend::cpu::set_isa(isa); }
    ~IsaScope() { backend::cpu::set_isa(before_); }
    IsaScope(const IsaScope&) = delete;
    IsaScope& operator=(const IsaScope&) = delete;

private:
    backend::cpu::Isa before_;
};

template <class M, class Opt, class Data>
std::vector<float> after_three_steps(backend::cpu::Isa isa, Opt opt, const Data& data)
{
    const IsaScope scope(isa);
    M net{Device::cpu()};
    for (std::size_t s = 0; s < 3; ++s) train_step(net, opt, data.batch(0, data.size, s * data.size));
    std::vector<float> state = net.parameters();
    const std::vector<float> statistics = net.statistics();
    state.insert(state.end(), statistics.begin(), statistics.end());
    return state;
}

template <class M, class Opt, class Data>
void same_bits_on_every_isa(Opt opt, const Data& data)
{
    const std::vector<float> baseline = after_three_steps<M>(backend::cpu::Isa::baseline, opt, data);
    const std::vector<float> wide = after_three_steps<M>(backend::cpu::Isa::avx2, opt, data);
    REQUIRE(baseline.size() == wide.size());
    std::size_t differ = 0;
    for (std::size_t i = 0; i < baseline.size(); ++i) differ += std::bit_cast<std::uint32_t>(baseline[i]) != std::bit_cast<std::uint32_t>(wide[i]);
    CAPTURE(baseline.size());
    CHECK(differ == 0);
}
} // namespace

TEST_CASE("The CPU's vectorized loops give the baseline's bits: CNNs with BatchNorm, pooling, dropout and "
          "transposed convolutions on im2col, float and bf16; a GPT under AdamW",
          "[cpu][models]")
{
    if (!backend::cpu::cpu_has(backend::cpu::Isa::avx2)) {
        WARN("this CPU has no AVX2, or this build no AVX2 form (unoptimised): only the baseline runs here");
        return;
    }
    const ConvPathScope blas(backend::cpu::ConvPath::blas);   // im2col's layout passes
    SECTION("ResNet-like, float and bf16")
    {
        same_bits_on_every_isa<SmallResNet>(SGD{{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 1e-4f}}, RandomBatches<SmallResNet>(8, 3));
        using Bf16 = model::with_precision<SmallResNet, core::bf16>;
        same_bits_on_every_isa<Bf16>(SGD{{.lr = 0.05f, .momentum = 0.9f}}, RandomBatches<Bf16>(8, 3));
    }
    SECTION("AlexNet-like (max pooling, dropout) and an FCN (transposed convolution, loss over pixels)")
    {
        same_bits_on_every_isa<SmallAlexNetPlain>(SGD{{.lr = 0.01f, .momentum = 0.9f}}, RandomBatches<SmallAlexNetPlain>(4, 5));
        same_bits_on_every_isa<SmallFCN>(SGD{{.lr = 0.01f}}, RandomBatches<SmallFCN>(2, 5));
        same_bits_on_every_isa<ConcatDropoutNet>(SGD{{.lr = 0.01f}}, RandomBatches<ConcatDropoutNet>(4, 5));
    }
    SECTION("GPT under AdamW")
    {
        same_bits_on_every_isa<TinyGpt>(AdamW{{.lr = 1e-3f}}, TokenBatches<TinyGpt>(4, 9));
    }
}

} // namespace test_models
