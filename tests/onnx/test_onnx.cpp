// ONNX export. "[onnx][networks]" writes every standard network, the residual networks, small
// networks holding every other layer of the vocabulary and two small GPTs trained a few steps (token
// ids in, logits out) as NAME.onnx, with NAME.onnx.reference (a batch of 2 random inputs and
// predict()'s outputs), into the folder $REPLICA_ONNX_DIR; tests/onnx/check.py then runs onnx.checker
// and ONNX Runtime on them. The other cases check export_onnx's refusals and the graphs' inputs.

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "../catch.hpp"
#include "../models.hpp"
#include "../support.hpp"
#include "replica/onnx/export.hpp"
#include "replica/replica.hpp"

using namespace replica;

namespace {

// Every layer the standard networks do not use, and those they use in other settings: convolutions
// without bias, BatchNorm1d on features and on (channels, length), BatchNorm in two Concat branches and
// in a residual body, GELU, Sigmoid, Tanh, average pooling with padding, a ceil-rounded max pool with
// padding, Residual with the identity, a transposed convolution with stride and padding, Identity,
// Dropout.
using Vocabulary2d = Sequential<Input<3, 14, 14>,
                                Conv2d<8, 3, 1, 1, Bias::none>, BatchNorm2d, GELU,            // 8x14x14
                                MaxPool2dCeil<3, 2, 1>,              // 8x8x8: the last window is partial
                                Residual<Sequential<Conv2d<8, 3, 1, 1>, BatchNorm2d, Tanh>>, ReLU,
                                Concat<Sequential<Conv2d<4, 1>, BatchNorm2d, Sigmoid>, Sequential<Identity>,
                                       Sequential<AvgPool2d<3, 1, 1>, BatchNorm2d>>,            // 20x8x8
                                ConvTranspose2d<6, 3, 2, 1, Bias::none>,                      // 6x15x15
                                AvgPool2d<2>, Dropout<0.3>, Flatten,                          // 294
                                Linear<24>, BatchNorm1d, Tanh, Identity, Linear<5>>;

using Vocabulary1d = Sequential<Input<4, 31>,
                                Conv1d<6, 5, 2, 2, Bias::none>, BatchNorm1d, ReLU,   // 6x16
                                MaxPool1d<3, 2>,                                     // 6x7
                                Conv1d<5, 3, 1, 1>, Sigmoid, Flatten, Linear<7>>;

// BatchNorm's options: eps 1e-3 without affine (scale ones, B zeros), the batch's statistics in
// inference (track_running_stats = false: no BatchNormalization), cumulative averaging (its batch
// count is a statistic the graph does not need), and both without affine with another eps.
using VocabularyBatchNormOptions =
    Sequential<Input<3, 6, 6>,
               Conv2d<4, 3, 1, 1, Bias::none>, BatchNorm2dWith<BatchNormOptions{.eps = 1e-3f, .momentum = 0.01f, .affine = false}>,
               ReLU, Conv2d<5, 3>, BatchNorm2dWith<BatchNormOptions{.track_running_stats = false}>, Tanh,   // 5x4x4
               Flatten, Linear<6>, BatchNorm1dWith<BatchNormOptions{.cumulative = true}>, Sigmoid, Linear<4>,
               BatchNorm1dWith<BatchNormOptions{.eps = 1e-2f, .affine = false, .track_running_stats = false}>>;

// Issue 43's layers that export: Linear over a sequence (MatMul, Add) and GELU's tanh form.
using VocabularySequence = Sequential<Input<5, 8>, Linear<6>, GELUWith<GeluApprox::tanh>, Linear<3>, Flatten, Linear<4>>;

// The transformer's layers on token ids, beside testing::TinyGpt (4 heads, LayerNorm's defaults): one
// head, LayerNorm with eps 1e-3 and no affine (its activations' variance, the embeddings' N(0, 0.02)
// squared, is below that eps, so a wrong eps shows), a PositionEmbedding with more positions than the
// input has (the graph adds the first 8 of its 12 rows), and Linear over the sequence.
constexpr LayerNormOptions kPlainNorm{.eps = 1e-3f, .affine = false};
using GptOneHead = Sequential<Input<Tokens<8>>, Embedding<40, 16>, PositionEmbedding<12>,
                              Residual<Sequential<LayerNorm<kPlainNorm>, CausalSelfAttention<1>>>,
                              Residual<Sequential<LayerNorm<kPlainNorm>, Linear<32>, GELUWith<GeluApprox::tanh>, Linear<16>>>,
                              LayerNorm<kPlainNorm>, Linear<40>, SequenceCrossEntropy>;

// Random BatchNorm running estimates: means in [-0.3, 0.3], variances spread over [1e-4, 2] in the
// small networks (where the epsilon of 1e-5 then matters) and [0.5, 1.5] in the deep ones.
template <class M>
void randomise_statistics(M& m, std::uint32_t seed, bool small_variances)
{
    std::vector<float> s = m.statistics();   // a fresh model's: 0 for every mean, 1 for every variance
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    for (float& v : s) {
        if (v == 0.0f) v = 0.6f * u(rng) - 0.3f;
        else v = small_variances ? std::pow(10.0f, -4.0f + 4.3f * u(rng)) : 0.5f + u(rng);
    }
    m.set_statistics(s);
}

std::vector<float> random_inputs(std::size_t count, std::uint32_t seed)
{
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> x(count);
    for (float& v : x) v = u(rng);
    return x;
}

template <class M>
void write(M& m, const std::filesystem::path& dir, const std::string& name, bool small_variances = false)
{
    constexpr std::size_t n = 2;
    randomise_statistics(m, std::uint32_t(name.size()), small_variances);
    const auto x = random_inputs(n * M::input_shape::size, 7);
    const std::string path = (dir / (name + ".onnx")).string();
    export_onnx(m, path);
    write_reference(m, x.data(), n, path + ".reference");
    INFO(name);
    REQUIRE(std::filesystem::file_size(path) > M::param_count * sizeof(float));
}

// A token model trained `steps` SGD steps on next-token batches of 4 (so that LayerNorm's weights
// and every bias are off their initial 1 and 0), written with 2 other samples' ids and its logits.
template <class M>
void write_trained(M& m, const std::filesystem::path& dir, const std::string& name, std::size_t steps)
{
    const testing::TokenBatches<M> data(4 * steps + 2, 21);
    SGD opt{{.lr = 0.1f}};
    for (std::size_t i = 0; i < steps; ++i) REQUIRE(std::isfinite(train_step(m, opt, data.batch(4 * i, 4, 4 * i))));
    const std::string path = (dir / (name + ".onnx")).string();
    export_onnx(m, path);
    write_reference(m, data.inputs.data() + 4 * steps * M::input_shape::size, 2, path + ".reference");
    INFO(name);
    REQUIRE(std::filesystem::file_size(path) > M::param_count * sizeof(float));
}

std::vector<Device> cpus(std::size_t n)
{
    std::vector<Device> d;
    for (std::size_t i = 0; i < n; ++i) d.push_back(Device::cpu(int(i)));
    return d;
}

} // namespace

TEST_CASE("every network exports with its predict() outputs beside it", "[onnx][networks]")
{
    const char* dir_env = std::getenv("REPLICA_ONNX_DIR");
    if (dir_env == nullptr) REPLICA_SKIP("set REPLICA_ONNX_DIR to a folder (tests/onnx/check.py does)");
    const std::filesystem::path dir = dir_env;
    std::filesystem::create_directories(dir);
    const Device cpu = Device::cpu();
    { LeNet m{cpu, 1}; write(m, dir, "lenet"); }
    { AlexNet m{cpus(2), 2}; write(m, dir, "alexnet"); }   // features in a nested DataParallel on 2 replicas
    { GoogLeNet m{cpu, 3}; write(m, dir, "googlenet"); }
    { TextCNN m{cpu, 4}; write(m, dir, "textcnn"); }
    { FCN m{cpu, 5}; write(m, dir, "fcn"); }
    { ResNet20 m{cpu, 6}; write(m, dir, "resnet20"); }
    { ResNet18 m{cpu, 7}; write(m, dir, "resnet18"); }
    { ResNet50 m{cpu, 8}; write(m, dir, "resnet50"); }
    { Vocabulary2d m{cpu, 9}; write(m, dir, "vocabulary2d", true); }
    { Vocabulary1d m{cpu, 10}; write(m, dir, "vocabulary1d", true); }
    { VocabularyBatchNormOptions m{cpu, 13}; write(m, dir, "batch_norm_options", true); }
    { VocabularySequence m{cpu, 14}; write(m, dir, "sequence"); }
    { testing::TinyGpt m{cpu, 15}; write_trained(m, dir, "gpt", 3); }
    { GptOneHead m{cpu, 16}; write_trained(m, dir, "gpt_one_head", 3); }
    // A DataParallel and an AutoParallel are exported as the model they replicate.
    { DataParallel<Vocabulary1d, Threaded> m{cpus(2), 11}; write(m, dir, "data_parallel", true); }
    { auto m = auto_parallel(Vocabulary2d{cpu, 12}, cpus(2)); write(m, dir, "auto_parallel", true); }
}

TEST_CASE("export_onnx refuses what it cannot write", "[onnx]")
{
    Vocabulary1d m{Device::cpu()};
    const testing::TempDir temp;
    const auto& dir = temp.path();
    SECTION("a folder that does not exist")
    {
        const auto path = (dir / "missing" / "m.onnx").string();
        REQUIRE_THROWS_WITH(export_onnx(m, path), Catch::Contains("cannot write '" + path));
    }
    SECTION("non-finite parameters")
    {
        auto w = m.parameters();
        w[3] = std::nanf("");
        m.set_parameters(w);
        REQUIRE_THROWS_WITH(export_onnx(m, (dir / "m.onnx").string()),
                            Catch::Contains("parameter 3 is NaN"));
        REQUIRE_FALSE(std::filesystem::exists(dir / "m.onnx"));
    }
    SECTION("non-finite statistics")
    {
        auto s = m.statistics();
        s.back() = INFINITY;
        m.set_statistics(s);
        REQUIRE_THROWS_WITH(export_onnx(m, (dir / "m.onnx").string()),
                            Catch::Contains("is infinite"));
    }
    SECTION("a reference of no samples")
    {
        REQUIRE_THROWS_WITH(write_reference(m, nullptr, 0, (dir / "m.ref").string()),
                            Catch::Contains("at least one sample"));
    }
    SECTION("a written model names its input and output and declares opset 17")
    {
        const auto proto = to_onnx(m);
        REQUIRE(proto.opset_import(0).version() == 17);
        REQUIRE(proto.graph().input(0).name() == "input");
        REQUIRE(proto.graph().output(0).name() == "output");
        REQUIRE(proto.graph().input(0).type().tensor_type().shape().dim(0).dim_param() == "N");
        REQUIRE(proto.graph().input(0).type().tensor_type().shape().dim(2).dim_value() == 31);
        export_onnx(m, (dir / "m.onnx").string());
        REQUIRE(std::filesystem::exists(dir / "m.onnx"));
        REQUIRE_FALSE(std::filesystem::exists(dir / "m.onnx.tmp"));
    }
}

TEST_CASE("a token model's graph reads int32 ids (N, T) and gives logits (N, T, V)", "[onnx]")
{
    const auto proto = to_onnx(testing::TinyGpt{Device::cpu()});
    const auto& input = proto.graph().input(0).type().tensor_type();
    REQUIRE(input.elem_type() == ::onnx::TensorProto::INT32);
    REQUIRE(input.shape().dim_size() == 2);
    REQUIRE(input.shape().dim(0).dim_param() == "N");
    REQUIRE(input.shape().dim(1).dim_value() == 16);
    const auto& output = proto.graph().output(0).type().tensor_type();
    REQUIRE(output.elem_type() == ::onnx::TensorProto::FLOAT);
    REQUIRE(output.shape().dim_size() == 3);
    REQUIRE(output.shape().dim(1).dim_value() == 16);
    REQUIRE(output.shape().dim(2).dim_value() == 64);
}
