// The CUDA backend against the CPU backend: one test body per layer, run on both contexts; the
// standard networks trained on both; the documented errors. Built as CUDA (nvcc) only; every test
// skips with a message on a machine without a GPU.
//
// Tolerances (TF32 off for these comparisons): layers 1e-4 relative to the magnitude of the result;
// models after 3 SGD steps: 1e-4 in the norm of the parameter difference over the norm of the
// parameters (cuDNN and im2col+BLAS sum in different orders, and the differences grow through training).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <future>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "catch.hpp"
#include "cuda_support.hpp"
#include "fixtures.hpp"
#include "layout_checks.hpp"
#include "models.hpp"
#include "support.hpp"

using namespace replica;
using namespace replica::testing;
namespace cuda = replica::backend::cuda;

namespace {

std::vector<float> random_vector(std::size_t n, std::uint64_t seed, float scale = 1.0f)
{
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i)
        v[i] = scale * (2.0f * core::random_uniform(seed, core::Stream::synthetic, 9, i / 65536, std::uint32_t(i % 65536)) - 1.0f);
    return v;
}

struct Results {
    std::vector<float> y, dx, dparams;
};

// Forward and backward of layer L on input shape In, on the CPU or on cuda:0, from the same data.
template <class L, class In, class Ctx>
Results run_layer(Ctx& ctx, std::size_t n, const model::Pass& pass)
{
    using O = typename L::template op<In>;
    using Out = typename O::output_shape;
    O op{model::Build{.layer_id = 5, .devices = {}}};
    std::vector<float> params(O::param_count + 1);
    op.init(params.data(), 3);
    for (float& p : params) p += 0.01f * std::sin(float(&p - params.data()));
    const auto x = random_vector(n * In::size, 1);
    const auto dy = random_vector(n * Out::size, 2);

    auto dev = [&](const std::vector<float>& host) {
        auto b = ctx.template allocate<float>(host.size() + 1);
        ctx.upload(b.data(), host.data(), host.size());
        return b;
    };
    auto p_d = dev(params), x_d = dev(x), dy_d = dev(dy);
    auto y_d = ctx.template allocate<float>(n * Out::size + 1);
    auto dx_d = ctx.template allocate<float>(n * In::size + 1);
    auto dp_d = ctx.template allocate<float>(O::param_count + 1);
    auto saved = ctx.template allocate<float>(n * O::saved_size + 1);
    auto kept = ctx.template allocate<float>(n * O::kept_size + 1);
    auto scratch = ctx.template allocate<float>(op.scratch_size(ctx, n) + 1);
    op.forward(ctx, pass, model::ForwardArgs<>{p_d.data(), p_d.data(), x_d.data(), y_d.data(), n, saved.data(), kept.data(),
                                             scratch.data()});
    op.backward(ctx, pass, model::BackwardArgs<>{p_d.data(), p_d.data(), x_d.data(), y_d.data(), dy_d.data(), dx_d.data(),
                                               dp_d.data(), n, saved.data(), kept.data(), scratch.data()});
    Results r{std::vector<float>(n * Out::size), std::vector<float>(n * In::size), std::vector<float>(O::param_count)};
    ctx.download(r.y.data(), y_d.data(), r.y.size());
    ctx.download(r.dx.data(), dx_d.data(), r.dx.size());
    ctx.download(r.dparams.data(), dp_d.data(), r.dparams.size());
    ctx.synchronize();
    return r;
}

template <class L, class In>
void same_on_cpu_and_gpu(std::size_t n = 3, bool training = true)
{
    INFO(__PRETTY_FUNCTION__);   // the layer and its input shape
    const model::Pass pass{.seed = 17, .first_sample = 40, .training = training};
    backend::cpu::Context cpu;
    cuda::Context gpu{Device::cuda(0)};
    const auto a = run_layer<L, In>(cpu, n, pass);
    const auto b = run_layer<L, In>(gpu, n, pass);
    CHECK(relative_error(a.y, b.y) < 1e-4);
    CHECK(relative_error(a.dx, b.dx) < 1e-4);
    if (!a.dparams.empty()) CHECK(relative_error(a.dparams, b.dparams) < 1e-4);
}

} // namespace

TEST_CASE("CUDA layers equal CPU layers: convolutions", "[cuda]")
{
    REQUIRE_GPU();
    static_assert(cuda::detail::direct_conv<core::Window{1, 28, 28, 5, 5, 1, 1, 0, 0, 24, 24}> &&
                  !cuda::detail::direct_conv<core::Window{4, 17, 17, 5, 5, 2, 2, 2, 2, 9, 9}>);
    same_on_cpu_and_gpu<Conv2d<8, 3, 1, 1>, Shape<3, 12, 10>>();   // these four: our forward and filter gradient (few weights)
    same_on_cpu_and_gpu<Conv2d<20, 5>, Shape<1, 28, 28>>(5);       // LeNet's first layer
    same_on_cpu_and_gpu<Conv2d<4, 5, 2, 2>, Shape<1, 17, 17>>(4);  // stride and padding
    same_on_cpu_and_gpu<Conv2d<7, 3, 1, 1>, Shape<2, 9, 9>>(300);  // more samples than parts
    same_on_cpu_and_gpu<Conv2d<6, 5, 2, 2>, Shape<4, 17, 17>>();
    same_on_cpu_and_gpu<Conv2d<64, 11, 4, 2>, Shape<3, 64, 64>>(2);
    same_on_cpu_and_gpu<Conv2d<16, 1>, Shape<32, 7, 7>>(5);
    same_on_cpu_and_gpu<Conv1d<8, 7>, Shape<5, 40>>();
    same_on_cpu_and_gpu<Conv1d<4, 3, 2, 1>, Shape<3, 21>>();
    same_on_cpu_and_gpu<ConvTranspose2d<5, 4, 2, 1>, Shape<6, 8, 8>>();
    same_on_cpu_and_gpu<ConvTranspose2d<3, 3, 1, 0>, Shape<4, 5, 7>>();
}

TEST_CASE("Each timed convolution choice is logged once, with what each pass runs", "[cuda]")
{
    REQUIRE_GPU();
    LoggedTimedChoices logged;
    const std::ostringstream& out = logged.out;
    constexpr core::Window g{20, 12, 12, 5, 5, 1, 1, 0, 0, 8, 8};   // LeNet's second layer
    const std::size_t n = 59;                                       // a batch no other test uses
    cuda::Context a{Device::cuda(0)}, b{Device::cuda(0)};
    const cuda::ConvPlan& p = cuda::detail::plan_of<g>(a, 50, n);
    cuda::detail::plan_of<g>(b, 50, n);   // timed already: not logged again
    std::string line;                     // the convolution's (the products' own cuBLASLt choices have lines too)
    std::istringstream lines(out.str());
    int convolutions = 0;
    for (std::string l; std::getline(lines, l);)
        if (l.find(": convolution ") != std::string::npos) {
            ++convolutions;
            line = l;
        }
    CAPTURE(out.str());
    CHECK(convolutions == 1);
    CHECK(line.find("convolution 20x12x12 -> 50x8x8 (5x5, stride 1x1, pad 0x0), batch 59: cuDNN forward algorithm ") !=
          std::string::npos);
    CHECK(line.find(std::string("forward by ") + (p.gemm_forward ? "products" : "cuDNN") + ", gradients by " +
                    (p.gemm_backward ? "products" : "cuDNN")) != std::string::npos);
}

TEST_CASE("Each timed cuBLASLt choice is logged once, with every candidate and the one chosen", "[cuda]")
{
    REQUIRE_GPU();
    std::ostringstream out;
    const OptionScope timed{&cuda::Options::benchmark, true};
    const OptionScope log{&cuda::Options::log, static_cast<std::ostream*>(&out)};
    const int in = 37, classes = 11;
    const std::size_t n = 61;   // shapes no other test uses
    cuda::Context a{Device::cuda(0)}, b{Device::cuda(0)};
    for (cuda::Context* ctx : {&a, &b}) {   // b: timed already, not logged again
        auto w = ctx->allocate<float>(std::size_t(in) * classes), bias = ctx->allocate<float>(classes);
        auto x = ctx->allocate<float>(n * in), y = ctx->allocate<float>(n * classes);
        cuda::linear_forward(*ctx, in, classes, w.data(), bias.data(), x.data(), y.data(), n);
        ctx->synchronize();
    }
    const std::string text = out.str();
    CAPTURE(text);
    // One product (D = op(A) op(B) + bias: A 37x11, B 37x61, D 11x61); cuBLASLt offers several FP32
    // candidates for it (with one, nothing would be timed or logged).
    CHECK(std::count(text.begin(), text.end(), '\n') == 1);
    CHECK(text.find(": product A 37x11, B 37x61 -> D 11x61 (") != std::string::npos);
    CHECK(text.find(" chosen; [0] algo ") != std::string::npos);
    CHECK(text.find(" [1] algo ") != std::string::npos);
}

TEST_CASE("Convolution algorithms are timed once per shape and kind of GPU; deterministic mode takes cuDNN's choice", "[cuda]")
{
    REQUIRE_GPU();
    const OptionScope timed{&cuda::Options::benchmark, true};
    constexpr core::Window g{20, 12, 12, 5, 5, 1, 1, 0, 0, 8, 8};   // LeNet's second layer
    const std::size_t n = 61;                                       // a batch no other test uses
    const auto before = cuda::detail::measured_conv_choices().size();
    cuda::Context a{Device::cuda(0)}, b{Device::cuda(0)};
    const cuda::ConvPlan& pa = cuda::detail::conv_plan(a, g, 50, n);
    CHECK(cuda::detail::measured_conv_choices().size() == before + 1);
    const cuda::ConvPlan& pb = cuda::detail::conv_plan(b, g, 50, n);   // another model's context: not timed again
    CHECK(cuda::detail::measured_conv_choices().size() == before + 1);
    CHECK((pa.fwd == pb.fwd && pa.bwd_data == pb.bwd_data && pa.bwd_filter == pb.bwd_filter));
    if (cuda_devices().size() >= 2 && cuda::detail::device_kind(a) == cuda::detail::device_kind(cuda::Context{Device::cuda(1)})) {
        cuda::Context c{Device::cuda(1)};   // an identical GPU: the same algorithms, timed once
        const cuda::ConvPlan& pc = cuda::detail::conv_plan(c, g, 50, n);
        CHECK(cuda::detail::measured_conv_choices().size() == before + 1);
        CHECK((pa.fwd == pc.fwd && pa.bwd_data == pc.bwd_data && pa.bwd_filter == pc.bwd_filter));
    }

    // Deterministic: cuDNN's first deterministic candidate, whatever timing says.
    const OptionScope deterministic{&cuda::Options::deterministic, true};
    cuda::Context d{Device::cuda(0)};
    const cuda::ConvPlan& p = cuda::detail::conv_plan(d, g, 50, n);
    CHECK(cuda::detail::measured_conv_choices().size() == before + 1);
    int found = 0;
    cudnnConvolutionFwdAlgoPerf_t f[16];
    REQUIRE(cudnnGetConvolutionForwardAlgorithm_v7(d.cudnn(), p.x, p.w, p.conv, p.y, 16, &found, f) == CUDNN_STATUS_SUCCESS);
    CHECK(p.fwd == f[cuda::detail::pick(f, found, true)].algo);
    cudnnConvolutionBwdDataAlgoPerf_t bd[16];
    REQUIRE(cudnnGetConvolutionBackwardDataAlgorithm_v7(d.cudnn(), p.w, p.y, p.conv, p.x, 16, &found, bd) == CUDNN_STATUS_SUCCESS);
    CHECK(p.bwd_data == bd[cuda::detail::pick(bd, found, true)].algo);
    cudnnConvolutionBwdFilterAlgoPerf_t bf[16];
    REQUIRE(cudnnGetConvolutionBackwardFilterAlgorithm_v7(d.cudnn(), p.x, p.y, p.conv, p.w, 16, &found, bf) == CUDNN_STATUS_SUCCESS);
    CHECK(p.bwd_filter == bf[cuda::detail::pick(bf, found, true)].algo);
}

TEST_CASE("Timed choices are kept in the tuning cache: a new process takes the same ones from it and times nothing",
          "[cuda]")
{
    REQUIRE_GPU();
    using Net = Sequential<Input<3, 18, 18>, Conv2d<16, 3, 1, 1>, ReLU, MaxPool2d<2>, Conv2d<24, 3>, ReLU, Flatten,
                           Linear<10>>;
    TempDir dir;
    LoggedTimedChoices logged;   // benchmark on, ConvPath::timed, every choice logged
    const OptionScope cache{&cuda::Options::tuning_cache, true};
    const OptionScope folder{&cuda::Options::tuning_cache_dir, (dir / "cache").string()};
    const std::size_t batch = 13;
    const RandomBatches<Net> data(batch, 5);
    auto one_step = [&] {   // a new model: new contexts, their plans made afresh
        Net net{Device::cuda(0), 4};
        SGD opt{{.lr = 0.01f, .momentum = 0.9f}};
        return train_step(net, opt, data.batch(0, batch, 0));
    };

    cuda::detail::forget_timed_choices();   // as a new process: nothing timed, no cache read
    const cuda::TuningCounts before = cuda::tuning_counts();
    const float cold_loss = one_step();
    const cuda::TuningCounts cold = cuda::tuning_counts();
    CHECK(cold.candidates_timed > before.candidates_timed);
    CHECK(cold.choices_cached == before.choices_cached);
    REQUIRE(std::filesystem::is_regular_file(dir / "cache" / "tuning.bin"));
    const auto conv = cuda::detail::measured_conv_choices();   // copies: what the first process chose
    const auto gemm = cuda::detail::measured_gemm_choices();
    REQUIRE(conv.size() >= 2);   // the two convolutions
    REQUIRE(!gemm.empty());      // the classifier's products at least
    const std::string cold_log = logged.out.str();
    logged.out.str("");

    cuda::detail::forget_timed_choices();   // the second process
    const float warm_loss = one_step();
    const cuda::TuningCounts warm = cuda::tuning_counts();
    CHECK(warm.candidates_timed == cold.candidates_timed);   // nothing timed
    CHECK(warm.records_refused == cold.records_refused);
    const auto& conv_now = cuda::detail::measured_conv_choices();
    const auto& gemm_now = cuda::detail::measured_gemm_choices();
    CHECK(warm.choices_cached - cold.choices_cached == conv_now.size() + gemm_now.size());
    // The same choices: every convolution's, and each product's that the step ran (the first process
    // also timed the products of the product path's candidates).
    CHECK(conv_now.size() == conv.size());
    for (const auto& [key, a] : conv_now) {
        REQUIRE(conv.count(key) == 1);
        const cuda::detail::ConvAlgorithms& b = conv.at(key);
        CHECK((a.cudnn.fwd == b.cudnn.fwd && a.cudnn.bwd_data == b.cudnn.bwd_data && a.cudnn.bwd_filter == b.cudnn.bwd_filter));
        CHECK((a.products_timed == b.products_timed && a.gemm_forward == b.gemm_forward && a.gemm_backward == b.gemm_backward));
    }
    CHECK(!gemm_now.empty());
    for (const auto& [key, algo] : gemm_now) {
        REQUIRE(gemm.count(key) == 1);
        CHECK(std::memcmp(&algo, &gemm.at(key), sizeof algo) == 0);
    }
    CHECK(std::abs(warm_loss - cold_loss) <= 1e-6f * std::abs(cold_loss));
    // Each choice taken is logged as the line it was timed with, " (from the tuning cache)" after it.
    const std::string suffix = " (from the tuning cache)";
    std::istringstream lines(logged.out.str());
    std::size_t taken = 0;
    for (std::string line; std::getline(lines, line); ++taken) {
        CAPTURE(line, cold_log);
        REQUIRE(line.size() > suffix.size());
        CHECK(line.substr(line.size() - suffix.size()) == suffix);
        CHECK(cold_log.find(line.substr(0, line.size() - suffix.size()) + "\n") != std::string::npos);
    }
    CHECK(taken == warm.choices_cached - cold.choices_cached);
    cuda::detail::forget_timed_choices();   // the cases after this one time their own
}

TEST_CASE("CUDA layers equal CPU layers: pooling", "[cuda]")
{
    REQUIRE_GPU();
    same_on_cpu_and_gpu<MaxPool2d<2>, Shape<3, 8, 8>>();
    same_on_cpu_and_gpu<MaxPool2d<3, 2>, Shape<4, 13, 13>>();
    same_on_cpu_and_gpu<MaxPool2dCeil<3, 2>, Shape<4, 14, 14>>();
    same_on_cpu_and_gpu<MaxPool2d<3, 1, 1>, Shape<5, 7, 9>>();
    same_on_cpu_and_gpu<MaxPool1d<3>, Shape<6, 31>>();
    same_on_cpu_and_gpu<AvgPool2d<3, 2, 1>, Shape<3, 9, 9>>();
    same_on_cpu_and_gpu<GlobalAvgPool, Shape<7, 5, 5>>();
    // Backward takes tiles of inputs: partial tiles, inputs no window covers, stride above the
    // window, the tile's cap of 4 per axis, ceil mode with padding.
    same_on_cpu_and_gpu<MaxPool2d<2>, Shape<3, 7, 5>>();
    same_on_cpu_and_gpu<MaxPool2d<2, 3>, Shape<2, 13, 11>>();
    same_on_cpu_and_gpu<MaxPool2d<5, 4, 2>, Shape<2, 13, 11>>();
    same_on_cpu_and_gpu<AvgPool2d<5, 4, 2>, Shape<2, 13, 11>>();
    same_on_cpu_and_gpu<MaxPool2dCeil<3, 2, 1>, Shape<3, 10, 9>>();
    same_on_cpu_and_gpu<MaxPool1d<3, 2>, Shape<3, 12>>();
}

TEST_CASE("CUDA layers equal CPU layers: linear, activations, dropout, flatten, concat", "[cuda]")
{
    REQUIRE_GPU();
    same_on_cpu_and_gpu<Linear<10>, Shape<37>>(7);
    same_on_cpu_and_gpu<Linear<300>, Shape<800>>(64);
    same_on_cpu_and_gpu<ReLU, Shape<4, 5, 6>>();
    same_on_cpu_and_gpu<Dropout<0.5>, Shape<100>>(9, true);
    same_on_cpu_and_gpu<Dropout<0.5>, Shape<100>>(9, false);
    same_on_cpu_and_gpu<Flatten, Shape<3, 4, 5>>();
    same_on_cpu_and_gpu<Inception<4, 3, 5, 2, 3, 2>, Shape<6, 9, 9>>(2);
}

namespace {
template <class M>
void trains_the_same_on_cpu_and_gpu(std::size_t batch, double tolerance = 1e-4)
{
    const RandomBatches<M> data(3 * batch, 21);
    M cpu{Device::cpu(), 4};
    M gpu{Device::cuda(0), 4};
    REQUIRE(differences(parameters(cpu), parameters(gpu)) == "");
    SGD opt_cpu{{.lr = 0.01f, .momentum = 0.9f}}, opt_gpu{{.lr = 0.01f, .momentum = 0.9f}};
    for (std::size_t s = 0; s < 3; ++s) {
        const float a = train_step(cpu, opt_cpu, data.batch(s * batch, batch, s * batch));
        const float b = train_step(gpu, opt_gpu, data.batch(s * batch, batch, s * batch));
        CHECK(std::abs(a - b) < 1e-3 * std::abs(a) + 1e-5);
    }
    const auto a = parameters(cpu), b = parameters(gpu);
    const double err = norm_relative(a, b);
    CAPTURE(err, max_relative_difference(a, b));
    CHECK(err < tolerance);
}
} // namespace

TEST_CASE("The standard networks train the same on CPU and GPU: LeNet", "[cuda]") { REQUIRE_GPU(); trains_the_same_on_cpu_and_gpu<LeNet>(16); }

// ---- transformer layers (issue 43) ----

TEST_CASE("CUDA transformer layers equal CPU ones: LayerNorm, GELU's tanh form, Linear over a sequence, CausalSelfAttention",
          "[cuda][transformer]")
{
    REQUIRE_GPU();
    same_on_cpu_and_gpu<LayerNorm<>, Shape<5, 8>>();
    same_on_cpu_and_gpu<LayerNorm<>, Shape<300>>(4);   // a row longer than a block
    same_on_cpu_and_gpu<LayerNorm<>, Shape<3, 264>>(2);   // a warp a row, a lane's second pack partial
    same_on_cpu_and_gpu<LayerNorm<>, Shape<2, 768>>(2);   // GPT-2's rows: three packs a lane
    same_on_cpu_and_gpu<LayerNorm<LayerNormOptions{.eps = 1e-3f, .affine = false}>, Shape<7, 12>>();
    same_on_cpu_and_gpu<GELUWith<GeluApprox::tanh>, Shape<4, 5, 6>>();
    same_on_cpu_and_gpu<GELUWith<GeluApprox::tanh>, Shape<17>>();
    same_on_cpu_and_gpu<Linear<6>, Shape<5, 8>>();
    same_on_cpu_and_gpu<CausalSelfAttention<2>, Shape<5, 8>>();
    same_on_cpu_and_gpu<CausalSelfAttention<4>, Shape<8, 16>>();
    same_on_cpu_and_gpu<CausalSelfAttention<3>, Shape<33, 12>>(2);
    same_on_cpu_and_gpu<CausalSelfAttention<2>, Shape<200, 16>>(2);   // several tiles of positions
}

namespace {

template <class T>
std::vector<float> widened(const std::vector<T>& v)
{
    std::vector<float> r(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) r[i] = core::to_float(v[i]);
    return r;
}

// The attention kernels of the GPU against the CPU's on the same T inputs (qkv, do in [-1, 1] rounded to
// T): forward's o and lse; backward's dqkv, both backends from the CPU's o and lse, so that each pass is
// compared alone. The GPU runs twice: the same bits. o and dqkv are rounded to T once on each side, from
// floats a few float steps apart: at most one step of T apart (2^-7 of a value in bf16, 2^-10 in fp16),
// hence `tolerance`; lse is float on both sides. On tensor cores (16-bit T, heads of at most 64
// features) the GPU also rounds each weight to T as a product's operand: errors of half a step a
// term, which mostly cancel over a sum, so the results stay within `tolerance` in norm.
template <class T>
void attention_same_on_cpu_and_gpu(std::size_t n, std::size_t t, std::size_t hd, std::size_t heads, double tolerance)
{
    INFO(core::storage_name<T> << ": n " << n << ", t " << t << ", head size " << hd << ", heads " << heads);
    const std::size_t d = hd * heads;
    std::vector<T> qkv(n * t * 3 * d), d_o(n * t * d), o(n * t * d), dqkv(n * t * 3 * d);
    const auto qkv_f = random_vector(qkv.size(), 11, 2.0f), d_o_f = random_vector(d_o.size(), 12);
    for (std::size_t i = 0; i < qkv.size(); ++i) qkv[i] = core::from_float<T>(qkv_f[i]);
    for (std::size_t i = 0; i < d_o.size(); ++i) d_o[i] = core::from_float<T>(d_o_f[i]);
    std::vector<float> lse(n * heads * t);
    backend::cpu::Context cpu;
    std::vector<float> cpu_scratch(backend::cpu::attention_scratch<T>(cpu, n, t, d, heads));
    backend::cpu::attention_forward(cpu, static_cast<const T*>(qkv.data()), o.data(), lse.data(), n, t, d, heads,
                                    cpu_scratch.data());
    backend::cpu::attention_backward(cpu, static_cast<const T*>(qkv.data()), static_cast<const T*>(o.data()),
                                     static_cast<const float*>(lse.data()), static_cast<const T*>(d_o.data()),
                                     dqkv.data(), n, t, d, heads, cpu_scratch.data());

    cuda::Context gpu{Device::cuda(0)};
    struct Run {
        std::vector<T> o, dqkv;
        std::vector<float> lse;
    };
    auto run = [&] {
        auto dev = [&](const auto& host) {
            auto b = gpu.allocate<std::remove_cvref_t<decltype(host[0])>>(host.size());
            gpu.upload(b.data(), host.data(), host.size());
            return b;
        };
        auto qkv_d = dev(qkv), d_o_d = dev(d_o), o_in = dev(o);
        auto lse_in = dev(lse);
        auto o_d = gpu.allocate<T>(o.size()), dqkv_d = gpu.allocate<T>(dqkv.size());
        auto lse_d = gpu.allocate<float>(lse.size());
        auto scratch = gpu.allocate<float>(cuda::attention_scratch<T>(gpu, n, t, d, heads) + 1);
        cuda::attention_forward(gpu, static_cast<const T*>(qkv_d.data()), o_d.data(), lse_d.data(), n, t, d, heads,
                                scratch.data());
        cuda::attention_backward(gpu, static_cast<const T*>(qkv_d.data()), static_cast<const T*>(o_in.data()),
                                 static_cast<const float*>(lse_in.data()), static_cast<const T*>(d_o_d.data()),
                                 dqkv_d.data(), n, t, d, heads, scratch.data());
        Run r{std::vector<T>(o.size()), std::vector<T>(dqkv.size()), std::vector<float>(lse.size())};
        gpu.download(r.o.data(), o_d.data(), r.o.size());
        gpu.download(r.dqkv.data(), dqkv_d.data(), r.dqkv.size());
        gpu.download(r.lse.data(), lse_d.data(), r.lse.size());
        gpu.synchronize();
        return r;
    };
    const Run a = run(), b = run();
    CHECK(relative_error(widened(o), widened(a.o)) < tolerance);
    CHECK(relative_error(lse, a.lse) < 1e-5);
    CHECK(relative_error(widened(dqkv), widened(a.dqkv)) < tolerance);
    CHECK(differences(widened(a.o), widened(b.o)) == "");   // widening is exact: the same floats are the same bits
    CHECK(differences(a.lse, b.lse) == "");
    CHECK(differences(widened(a.dqkv), widened(b.dqkv)) == "");
}

template <class T>
void attention_shapes_same_on_cpu_and_gpu(double tolerance)
{
    // (t, head size, heads), n = 2: tiles are 64 positions (32 in backward for heads over 64 features).
    constexpr std::size_t shapes[][3] = {{1, 64, 2},  {37, 8, 2},   {37, 128, 2}, {130, 64, 1}, {130, 20, 3},
                                         {64, 64, 2}, {65, 32, 4},  {70, 100, 2}, {301, 64, 2}, {300, 128, 1}};
    for (const auto& s : shapes) attention_same_on_cpu_and_gpu<T>(2, s[0], s[1], s[2], tolerance);
}

} // namespace

TEST_CASE("CUDA attention kernels equal the CPU's in float bf16 and fp16 for head sizes 8 to 128 and positions no "
          "multiple of a tile; the same bits every run",
          "[cuda][transformer]")
{
    REQUIRE_GPU();
    attention_shapes_same_on_cpu_and_gpu<float>(1e-5);
    attention_shapes_same_on_cpu_and_gpu<core::bf16>(1e-2);
    attention_shapes_same_on_cpu_and_gpu<core::fp16>(1e-2);
}

TEST_CASE("CUDA attention over a sequence of 6200 positions equals the CPU's",
          "[cuda][transformer]")
{
    REQUIRE_GPU();
    // Sums of up to 6200 terms in another order than the CPU's: a looser bound than the short rows'.
    attention_same_on_cpu_and_gpu<float>(1, 6200, 8, 1, 1e-4);
}

TEST_CASE("A small transformer trains the same on CPU and GPU", "[cuda][transformer]")
{
    REQUIRE_GPU();
    trains_the_same_on_cpu_and_gpu<TinyTransformer>(6);
}

TEST_CASE("CUDA embeddings equal the CPU's: a gather forward, the tables' gradients summed in the same order",
          "[cuda][tokens]")
{
    REQUIRE_GPU();
    // Ids with repeats (every row's sum has several terms) and rows no id names (their gradient zero).
    constexpr std::size_t count = 40, vocabulary = 13, dim = 37, n = 4, positions = 10, context = 12;
    std::vector<std::int32_t> ids(count);
    for (std::size_t i = 0; i < count; ++i) ids[i] = std::int32_t((i * 7 + i / 5) % (vocabulary - 2));
    const auto table = random_vector(vocabulary * dim, 3), dy = random_vector(count * dim, 4);
    const auto ptable = random_vector(context * dim, 5), x = random_vector(n * positions * dim, 6);
    backend::cpu::Context cpu;
    cuda::Context gpu{Device::cuda(0)};
    auto run = [&](auto& ctx) {
        auto dev = [&](const auto& host) {
            auto b = ctx.template allocate<std::remove_cvref_t<decltype(host[0])>>(host.size());
            ctx.upload(b.data(), host.data(), host.size());
            return b;
        };
        auto ids_d = dev(ids);
        auto table_d = dev(table), dy_d = dev(dy), ptable_d = dev(ptable), x_d = dev(x);
        auto y = ctx.template allocate<float>(count * dim), dtable = ctx.template allocate<float>(vocabulary * dim);
        auto py = ctx.template allocate<float>(n * positions * dim), pdx = ctx.template allocate<float>(n * positions * dim);
        auto pdtable = ctx.template allocate<float>(context * dim);
        embedding_forward(ctx, ids_d.data(), table_d.data(), y.data(), count, dim);
        embedding_backward(ctx, ids_d.data(), static_cast<const float*>(dy_d.data()), dtable.data(), count, vocabulary, dim);
        position_embedding_forward(ctx, static_cast<const float*>(x_d.data()), ptable_d.data(), py.data(), n, positions, dim);
        position_embedding_backward(ctx, static_cast<const float*>(x_d.data()), pdx.data(), pdtable.data(), n, positions,
                                    context, dim);
        std::vector<std::vector<float>> out{std::vector<float>(count * dim), std::vector<float>(vocabulary * dim),
                                            std::vector<float>(n * positions * dim), std::vector<float>(n * positions * dim),
                                            std::vector<float>(context * dim)};
        ctx.download(out[0].data(), y.data(), out[0].size());
        ctx.download(out[1].data(), dtable.data(), out[1].size());
        ctx.download(out[2].data(), py.data(), out[2].size());
        ctx.download(out[3].data(), pdx.data(), out[3].size());
        ctx.download(out[4].data(), pdtable.data(), out[4].size());
        ctx.synchronize();
        return out;
    };
    const auto a = run(cpu), b = run(gpu);
    for (std::size_t k = 0; k < a.size(); ++k) {
        CAPTURE(k);
        CHECK(differences(a[k], b[k]) == "");   // the same floats added in the same order
    }
    CHECK(std::all_of(a[1].end() - 2 * dim, a[1].end(), [](float v) { return v == 0.0f; }));   // rows no id names
}

TEST_CASE("LayerNorm's weight and bias gradients over thousands of rows equal the CPU's, the same bits every run; "
          "ClipGradNorm's norm over millions of values too", "[cuda][transformer][clip]")
{
    REQUIRE_GPU();
    backend::cpu::Context cpu;
    cuda::Context gpu{Device::cuda(0)};
    // 4100 rows of 96 features: 65 chunks of 64 rows, the last one partial.
    constexpr std::size_t rows = 4100, features = 96;
    const auto x = random_vector(rows * features, 31), dy = random_vector(rows * features, 32);
    const auto w = random_vector(features, 33), b = random_vector(features, 35);
    const auto ln = [&](auto& ctx) {
        auto xd = ctx.template allocate<float>(x.size()), dyd = ctx.template allocate<float>(dy.size());
        auto wd = ctx.template allocate<float>(2 * features), grads = ctx.template allocate<float>(2 * features);
        auto y = ctx.template allocate<float>(x.size()), stats = ctx.template allocate<float>(2 * rows);
        ctx.upload(xd.data(), x.data(), x.size());
        ctx.upload(dyd.data(), dy.data(), dy.size());
        ctx.upload(wd.data(), w.data(), features);
        ctx.upload(wd.data() + features, b.data(), features);
        layer_norm_forward(ctx, static_cast<const float*>(xd.data()), y.data(), static_cast<const float*>(wd.data()),
                           static_cast<const float*>(wd.data() + features), rows, features, 1e-5f, stats.data(),
                           stats.data() + rows);
        layer_norm_backward(ctx, static_cast<const float*>(xd.data()), static_cast<const float*>(dyd.data()),
                            static_cast<const float*>(wd.data()), static_cast<const float*>(stats.data()),
                            static_cast<const float*>(stats.data() + rows), static_cast<float*>(nullptr), grads.data(),
                            grads.data() + features, rows, features);
        std::vector<float> out(2 * features);
        ctx.download(out.data(), grads.data(), out.size());
        ctx.synchronize();
        return out;
    };
    // The sums in float64. Each backend's float sums of 4100 terms (the CPU's in row order, the GPU's in
    // chunks of 64) err by about sqrt(4100) roundings of sums of magnitude 10-60, so a near-zero sum has
    // no useful relative error: compared in norm and with a floor of 1. A chunk lost or counted twice is
    // off by about 1/65.
    std::vector<float> exact(2 * features);
    {
        std::vector<double> dw(features, 0.0), db(features, 0.0);
        for (std::size_t r = 0; r < rows; ++r) {
            double mean = 0.0, var = 0.0;
            for (std::size_t f = 0; f < features; ++f) mean += x[r * features + f];
            mean /= double(features);
            for (std::size_t f = 0; f < features; ++f) var += (x[r * features + f] - mean) * (x[r * features + f] - mean);
            const double rstd = 1.0 / std::sqrt(var / double(features) + 1e-5);
            for (std::size_t f = 0; f < features; ++f) {
                dw[f] += double(dy[r * features + f]) * (x[r * features + f] - mean) * rstd;
                db[f] += double(dy[r * features + f]);
            }
        }
        for (std::size_t f = 0; f < features; ++f) exact[f] = float(dw[f]), exact[features + f] = float(db[f]);
    }
    const auto want = ln(cpu), got = ln(gpu);
    CHECK(norm_relative(exact, want) < 1e-5);
    CHECK(norm_relative(exact, got) < 1e-5);
    CHECK(max_relative_difference(exact, got, 1.0) < 1e-4);
    CHECK(differences(ln(gpu), got) == "");
    // 3,000,017 values whose norm exceeds the bound: scaled as the CPU's double sum says.
    const auto g = random_vector(3'000'017, 34);
    const auto clip = [&](auto& ctx, float max_norm) {
        auto d = ctx.template allocate<float>(g.size());
        ctx.upload(d.data(), g.data(), g.size());
        clip_by_norm(ctx, d.data(), g.size(), max_norm);
        std::vector<float> out(g.size());
        ctx.download(out.data(), d.data(), out.size());
        ctx.synchronize();
        return out;
    };
    const auto clipped = clip(gpu, 10.0f);
    CHECK(max_relative_difference(clip(cpu, 10.0f), clipped, 1e-3) < 1e-6);
    CHECK(differences(clip(gpu, 10.0f), clipped) == "");
    CHECK(differences(clip(gpu, 1e6f), g) == "");   // within the bound: untouched
    // Its two halves: the sum of squares as the CPU's double sum, and clip_to_norm by it clip_by_norm's bits.
    {
        auto d = gpu.allocate<float>(g.size());
        auto squares = gpu.allocate<double>(1);
        gpu.upload(d.data(), g.data(), g.size());
        sum_of_squares(gpu, d.data(), g.size(), squares.data());
        clip_to_norm(gpu, d.data(), g.size(), squares.data(), 10.0f);
        double got = 0.0, want = 0.0;
        std::vector<float> out(g.size());
        gpu.download(&got, squares.data(), 1);
        gpu.download(out.data(), d.data(), out.size());
        gpu.synchronize();
        sum_of_squares(cpu, g.data(), g.size(), &want);
        CHECK(got == Approx(want).epsilon(1e-9));   // double sums in two orders
        CHECK(differences(out, clipped) == "");
    }
}

TEST_CASE("The token embedding's gradient over GPT-2's vocabulary equals the CPU's bit for bit and is the same every run, "
          "for float, bf16 and fp16 gradients, assigned and accumulated", "[cuda][tokens]")
{
    REQUIRE_GPU();
    // Long runs of one id (0: every 7th position; the last row: every 11th; 5 a block of 64 in a row),
    // the rest random, so some rows are summed from hundreds of terms, some from a few, most from none.
    // 300 columns: two blocks of columns, the second partly empty.
    constexpr std::size_t vocabulary = 50304, dim = 300;
    const auto ids_for = [](std::size_t count) {
        std::vector<std::int32_t> ids(count);
        for (std::size_t i = 0; i < count; ++i)
            ids[i] = i % 7 == 0                 ? 0
                     : i % 11 == 0              ? std::int32_t(vocabulary - 1)
                     : i >= 1000 && i < 1064    ? 5
                                                : std::int32_t(core::random_bits(8, core::Stream::synthetic, 1, i, 0) % vocabulary);
        return ids;
    };
    const auto start = random_vector(vocabulary * dim, 9);   // dtable before: kept with accumulate, else overwritten
    backend::cpu::Context cpu;
    cuda::Context gpu{Device::cuda(0)};
    const auto run = [&]<class T>(auto& ctx, std::type_identity<T>, std::size_t count, bool accumulate) {
        const auto ids = ids_for(count);
        const auto dy_float = random_vector(count * dim, 10);
        std::vector<T> dy(dy_float.size());
        for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = core::from_float<T>(dy_float[i]);
        auto ids_d = ctx.template allocate<std::int32_t>(count);
        auto dy_d = ctx.template allocate<T>(dy.size());
        auto dtable = ctx.template allocate<float>(start.size());
        ctx.upload(ids_d.data(), ids.data(), count);
        ctx.upload(dy_d.data(), dy.data(), dy.size());
        ctx.upload(dtable.data(), start.data(), start.size());
        embedding_backward(ctx, ids_d.data(), static_cast<const T*>(dy_d.data()), dtable.data(), count, vocabulary, dim,
                           accumulate);
        std::vector<float> out(start.size());
        ctx.download(out.data(), dtable.data(), out.size());
        ctx.synchronize();
        return out;
    };
    const auto check = [&]<class T>(std::type_identity<T> t) {
        for (const bool accumulate : {false, true})
            for (const std::size_t count : {std::size_t{4099}, std::size_t{1}}) {
                CAPTURE(accumulate, count, sizeof(T));
                const auto a = run(cpu, t, count, accumulate), b = run(gpu, t, count, accumulate);
                CHECK(differences(a, b) == "");   // the same floats added in the same order
                CHECK(differences(run(gpu, t, count, accumulate), b) == "");
                const auto ids = ids_for(count);
                std::size_t unnamed = 0;
                while (std::find(ids.begin(), ids.end(), std::int32_t(unnamed)) != ids.end()) ++unnamed;
                const auto row = b.begin() + std::ptrdiff_t(unnamed * dim);
                if (!accumulate)   // a row no id names is zero (the table held other values before)
                    CHECK(std::all_of(row, row + dim, [](float v) { return v == 0.0f; }));
            }
    };
    check(std::type_identity<float>{});
    check(std::type_identity<core::bf16>{});
    check(std::type_identity<core::fp16>{});
}

TEST_CASE("A bf16 GPT (tied head, attention kernels on bf16) trains as the CPU's bf16 rounding of it; on replicas sharing the GPU too",
          "[cuda][tokens][precision]")
{
    REQUIRE_GPU();
    using Net = with_precision<TinyGpt, bf16>;
    const TokenBatches<Net> data(3 * 8, 23);
    auto steps = [&](auto& model) {
        SGD opt{{.lr = 0.05f, .momentum = 0.9f}};
        std::vector<float> losses;
        for (std::size_t s = 0; s < 3; ++s) losses.push_back(train_step(model, opt, data.batch(s * 8, 8, s * 8)));
        return losses;
    };
    // The CPU rounds where the GPU stores: the runs differ by summation orders and their effect on later
    // roundings (one bf16 ulp is 2^-8 of a value).
    Net cpu{Device::cpu(), 5}, gpu{Device::cuda(0), 5};
    const auto la = steps(cpu), lb = steps(gpu);
    for (std::size_t s = 0; s < 3; ++s) CHECK(std::abs(la[s] - lb[s]) < 2e-2 * std::abs(la[s]));
    CHECK(norm_relative(parameters(cpu), parameters(gpu)) < 2e-2);
    DataParallel<Net, Threaded> two{std::vector<Device>(2, Device::cuda(0)), 5};
    steps(two);
    CHECK(norm_relative(parameters(two), parameters(gpu)) < 2e-2);
    // Far from the float model's start: bf16 changed what was computed, not nothing.
    TinyGpt plain{Device::cuda(0), 5};
    steps(plain);
    CHECK(differences(parameters(plain), parameters(gpu)) != "");
}

TEST_CASE("A small GPT trains the same on CPU and GPU; replicas sharing the GPU as one, the reproducible mode bit for bit",
          "[cuda][tokens]")
{
    REQUIRE_GPU();
    const TokenBatches<TinyGpt> data(3 * 6, 21);
    // SGD: Adam would turn the float noise of gradients that are zero in exact arithmetic (the key
    // projection's bias: softmax does not see a shift common to a query's scores) into full steps.
    auto steps = [&](auto& model, StepOptions options = {}) {
        SGD opt{{.lr = 0.05f, .momentum = 0.9f}};
        std::vector<float> losses;
        for (std::size_t s = 0; s < 3; ++s) losses.push_back(train_step(model, opt, data.batch(s * 6, 6, s * 6), options));
        return losses;
    };
    TinyGpt cpu{Device::cpu(), 4}, gpu{Device::cuda(0), 4};
    REQUIRE(differences(parameters(cpu), parameters(gpu)) == "");
    const auto la = steps(cpu), lb = steps(gpu);
    for (std::size_t s = 0; s < 3; ++s) CHECK(std::abs(la[s] - lb[s]) < 1e-4 * std::abs(la[s]));
    const auto a = parameters(cpu), b = parameters(gpu);
    CAPTURE(norm_relative(a, b), max_relative_difference(a, b));
    CHECK(norm_relative(a, b) < 1e-4);
    std::vector<float> pa(6 * 16 * 64), pb(pa.size());
    cpu.predict(data.inputs.data(), 6, pa.data());
    gpu.predict(data.inputs.data(), 6, pb.data());
    CHECK(norm_relative(pa, pb) < 1e-4);
    // Two replicas sharing the GPU, CUDA graphs off and on; then the reproducible mode on one and three.
    for (const bool graphs : {false, true}) {
        const OptionScope graphs_scope{&cuda::Options::graphs, graphs};
        CAPTURE(graphs);
        TinyGpt one{Device::cuda(0), 4};
        DataParallel<TinyGpt, Threaded> two{std::vector<Device>(2, Device::cuda(0)), 4};
        steps(one);
        steps(two);
        CHECK(norm_relative(parameters(one), parameters(two)) < 1e-5);
    }
    TinyGpt shards{Device::cuda(0), 2};
    DataParallel<TinyGpt, Threaded> three{std::vector<Device>(3, Device::cuda(0)), 2};
    steps(shards, kReproducible);
    steps(three, kReproducible);
    CHECK(differences(parameters(shards), parameters(three)) == "");
    // An id outside the vocabulary is refused before anything reaches the GPU.
    std::vector<std::int32_t> bad(data.inputs.begin(), data.inputs.begin() + 6 * 16);
    bad[20] = 64;
    AdamW opt{{.lr = 3e-3f}};
    CHECK_THROWS_WITH(train_step(gpu, opt, TokenBatch{bad.data(), data.labels.data(), 6, 0, 7}),
                      Catch::Contains("sample 1, position 4"));
}

TEST_CASE("A convolution run as products over its windows (im2row, cuBLASLt) equals the CPU's", "[cuda]")
{
    REQUIRE_GPU();
    // Both passes as products, and each alone beside cuDNN's other (what ConvPath::timed may choose).
    const auto path = GENERATE(cuda::ConvPath::gemm, cuda::ConvPath::gemm_forward, cuda::ConvPath::gemm_backward);
    CAPTURE(int(path));
    const OptionScope products{&cuda::Options::conv_path, path};
    static_assert(!cuda::detail::direct_conv<core::Window{20, 12, 12, 5, 5, 1, 1, 0, 0, 8, 8}>);   // our kernels take those
    static_assert(!cuda::detail::direct_conv<core::Window{5, 9, 9, 3, 3, 2, 2, 1, 1, 5, 5}>);
    same_on_cpu_and_gpu<Conv2d<50, 5>, Shape<20, 12, 12>>(5);        // LeNet's second layer
    same_on_cpu_and_gpu<Conv2d<6, 5, 2, 2>, Shape<4, 17, 17>>();      // stride and padding
    same_on_cpu_and_gpu<Conv2d<5, 3, 2, 1>, Shape<12, 10, 9>>();      // odd sizes
    same_on_cpu_and_gpu<Conv2d<5, 3, 2, 1>, Shape<5, 9, 9>>(3);       // rows of 45 values, 3375 in all: im2row's quads
                                                                       // cross rows, the last is partial
    same_on_cpu_and_gpu<Conv2d<64, 11, 4, 2>, Shape<3, 64, 64>>(2);   // AlexNet's first layer
    same_on_cpu_and_gpu<Conv2d<16, 1>, Shape<40, 7, 7>>(5);           // 1 x 1
    same_on_cpu_and_gpu<Conv2d<7, 3, 1, 1>, Shape<4, 9, 9>>(300);     // more samples than a transpose's grid
    same_on_cpu_and_gpu<Conv1d<8, 7>, Shape<5, 40>>();
    same_on_cpu_and_gpu<Conv1d<6, 5, 2, 2>, Shape<9, 33>>();
    // Branches reading one input (a backward may reuse the rows its forward left, only its own).
    same_on_cpu_and_gpu<Inception<4, 3, 5, 2, 3, 2>, Shape<40, 9, 9>>(2);
    // Through whole networks: the ReLU fused into the products' epilogue and the transposes' backward.
    trains_the_same_on_cpu_and_gpu<LeNet>(16);
    trains_the_same_on_cpu_and_gpu<TextCNN>(4);
}
TEST_CASE("The standard networks train the same on CPU and GPU: AlexNet", "[cuda]") { REQUIRE_GPU(); trains_the_same_on_cpu_and_gpu<AlexNetPlain>(4); }
TEST_CASE("The standard networks train the same on CPU and GPU: GoogLeNet", "[cuda]") { REQUIRE_GPU(); trains_the_same_on_cpu_and_gpu<GoogLeNet>(4); }
TEST_CASE("The standard networks train the same on CPU and GPU: TextCNN", "[cuda]") { REQUIRE_GPU(); trains_the_same_on_cpu_and_gpu<TextCNN>(4); }
TEST_CASE("The standard networks train the same on CPU and GPU: FCN", "[cuda]") { REQUIRE_GPU(); trains_the_same_on_cpu_and_gpu<FCN>(2); }

TEST_CASE("CUDA errors are clear: bad device index, out of memory", "[cuda]")
{
    REQUIRE_GPU();
    const int count = int(cuda_devices().size());
    const auto bad = error_message([&] { LeNet net{Device::cuda(count + 3)}; });
    CAPTURE(bad);
    CHECK(bad.find("no device cuda:" + std::to_string(count + 3)) != std::string::npos);
    CHECK(bad.find("CUDA_VISIBLE_DEVICES") != std::string::npos);
    cuda::Context ctx{Device::cuda(0)};
    const auto oom = error_message([&] { auto b = ctx.allocate<float>(std::size_t(1) << 40); });   // 4 TiB
    CAPTURE(oom);
    CHECK(oom.find("out of memory on cuda:0") != std::string::npos);
    CHECK(oom.find("smaller batch size") != std::string::npos);
    // The device still works after the failed allocation.
    LeNet net{Device::cuda(0)};
    CHECK(parameters(net).size() == LeNet::param_count);
}

TEST_CASE("A warm training step on the GPU allocates nothing", "[cuda]")
{
    REQUIRE_GPU();
    LeNet net{Device::cuda(0)};
    SGD opt;
    const RandomBatches<LeNet> data(64, 2);
    train_step(net, opt, data.batch(0, 64, 0));
    std::size_t reserved = 0;
    net.visit([&](auto& ctx) {
        if constexpr (requires { ctx.reserved_bytes(); }) reserved = ctx.reserved_bytes();
    });
    for (int i = 0; i < 5; ++i) train_step(net, opt, data.batch(0, 64, 0));
    std::size_t after = 0;
    net.visit([&](auto& ctx) {
        if constexpr (requires { ctx.reserved_bytes(); }) after = ctx.reserved_bytes();
    });
    CHECK(reserved > 0);
    CHECK(after == reserved);
}

namespace {
// Keeps one thread of the GPU busy for about `cycles` clock ticks.
__global__ void spin(long long cycles)
{
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
}
} // namespace

// The zero fill must be ordered before the context's streams, which do not wait for the legacy
// default stream: with that stream kept busy, a fill queued there would run after the compute
// stream had already read the reused block's old values.
TEST_CASE("Memory is zero when allocate() returns, for every stream, even while the legacy default stream is busy",
          "[cuda]")
{
    REQUIRE_GPU();
    cuda::Context ctx{Device::cuda(0)};
    constexpr std::size_t n = 1 << 20;
    {
        auto used = ctx.allocate<float>(n);
        const std::vector<float> ones(n, 1.0f);
        ctx.upload(used.data(), ones.data(), n);
    }   // back to the allocator's cache, holding ones
    ctx.activate();
    spin<<<1, 1, 0, cudaStreamLegacy>>>(std::int64_t{2} << 30);   // about a second
    REQUIRE(cudaGetLastError() == cudaSuccess);
    auto reused = ctx.allocate<float>(n);
    std::vector<float> host(n, -1.0f);
    ctx.download(host.data(), reused.data(), n);
    ctx.synchronize();
    CHECK(std::count(host.begin(), host.end(), 0.0f) == std::ptrdiff_t(n));
    REQUIRE(cudaStreamSynchronize(cudaStreamLegacy) == cudaSuccess);
}

// ---- several replicas: DataParallel over NCCL (distinct GPUs) or over one shared GPU ----

namespace {
// n replicas sharing cuda:0 (summed on it, parallel/shared_gpu.hpp).
std::vector<Device> shared_gpu(std::size_t n) { return std::vector<Device>(n, Device::cuda(0)); }

// n replicas: on n distinct GPUs (NCCL) where as many are visible, else all on cuda:0, so that the
// multi-replica tests run on a one-GPU machine too.
std::vector<Device> gpus(std::size_t n)
{
    if (cuda_devices().size() < n) return shared_gpu(n);
    std::vector<Device> d;
    for (std::size_t i = 0; i < n; ++i) d.push_back(Device::cuda(int(i)));
    return d;
}

// The replica counts above one that the multi-replica tests take: 2 .. every visible GPU, or 2 and 3
// replicas sharing the one GPU.
std::vector<std::size_t> replica_counts()
{
    std::vector<std::size_t> counts{2, 3};
    if (cuda_devices().size() >= 2) {
        counts.clear();
        for (std::size_t n = 2; n <= cuda_devices().size(); ++n) counts.push_back(n);
    }
    return counts;
}


template <class Model, class Data>
std::vector<float> three_steps(Model& model, const Data& data, std::size_t batch)
{
    SGD opt{{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f}};
    for (std::size_t s = 0; s < 3; ++s) train_step(model, opt, data.batch(s * batch, batch, s * batch));
    return parameters(model);
}

// 3 steps on 1 GPU and on every GPU (both dispatch policies), batch sizes that split unevenly.
// Tolerance: 1e-5 in norm (NCCL, or the shared GPU's sum, adds in another order than one GPU's
// single backward pass).
template <class M>
void many_gpus_match_one(std::size_t batch)
{
    const RandomBatches<M> data(3 * batch, 13);
    M one{Device::cuda(0), 2};
    const auto expected = three_steps(one, data, batch);
    for (std::size_t n : replica_counts()) {
        CAPTURE(n, batch);
        DataParallel<M, SingleThread> single{gpus(n), 2, {.bucket_floats = 4096}};
        DataParallel<M, Threaded> threaded{gpus(n), 2, {.bucket_floats = 4096}};
        const auto a = three_steps(single, data, batch);
        const auto b = three_steps(threaded, data, batch);
        CHECK(norm_relative(expected, a) < 1e-5);
        CHECK(norm_relative(a, b) < 1e-6);
    }
}

// The nested form: features on every GPU, classifier on the first.
template <class Plain, class Nested>
void nested_matches_plain(std::size_t batch)
{
    const RandomBatches<Plain> data(3 * batch, 17);
    Plain plain{Device::cuda(0), 6};
    const auto expected = three_steps(plain, data, batch);
    for (std::size_t n : replica_counts()) {
        CAPTURE(n, batch);
        Nested nested{gpus(n), 6};
        CHECK(norm_relative(expected, three_steps(nested, data, batch)) < 1e-5);
    }
}

// 3 SGD steps clipped to a norm every step exceeds; the parameters after, less those of no gradient.
template <class Model, class Data>
std::vector<float> clipped_steps(Model& model, const Data& data, const std::vector<bool>& noise)
{
    ClipGradNorm opt{SGD{{.lr = 0.1f, .momentum = 0.9f}}, 0.05f};
    for (std::size_t s = 0; s < 3; ++s) train_step(model, opt, data.batch(s * 10, 10, s * 10));
    return without(parameters(model), noise);
}
} // namespace

TEST_CASE("A Pipeline on stages sharing the GPU equals the plain GPU model: 2 and 3 stages, both schedules, bf16",
          "[cuda][same-gpu][pipeline]")
{
    REQUIRE_GPU();
    const TokenBatches<PipeGpt> data(50, 3);
    auto five_steps = [&](auto& model) {
        AdamW opt{{.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.95f, .weight_decay = 0.1f}};
        for (std::size_t s = 0; s < 5; ++s) train_step(model, opt, data.batch(s * 10, 10, s * 10));
        return parameters(model);
    };
    const std::vector<bool> noise = zero_gradient<PipeGpt>(data, Device::cuda(0));   // key biases, absent tokens
    PipeGpt plain{Device::cuda(0), 5};
    const std::vector<float> want = without(five_steps(plain), noise);
    {
        Pipeline<PipeGpt, Cuts<3>, OneFOneB> two{shared_gpu(2), 5, {.micro_batches = 4}};
        CHECK(norm_relative(want, without(five_steps(two), noise)) < 1e-5);
        Pipeline<PipeGpt, Cuts<2, 4>, GPipe> three{shared_gpu(3), 5, {.micro_batches = 3}};
        CHECK(norm_relative(want, without(five_steps(three), noise)) < 1e-5);
        std::vector<float> a(10 * PipeGpt::output_shape::size), b(a.size());
        plain.predict(data.inputs.data(), 10, a.data());
        three.predict(data.inputs.data(), 10, b.data());
        CHECK(norm_relative(a, b) < 1e-5);
    }
    // One micro-batch: the plain model's kernels on the same shapes, the same bits; and in bf16.
    Pipeline<PipeGpt, Cuts<3, 5>, OneFOneB> whole{shared_gpu(3), 5, {.micro_batches = 1}};
    CHECK(differences(five_steps(whole), parameters(plain)) == "");
    using Bf16Gpt = with_precision<PipeGpt, bf16>;
    Bf16Gpt plain16{Device::cuda(0), 5};
    Pipeline<Bf16Gpt, Cuts<3>, GPipe> whole16{shared_gpu(2), 5, {.micro_batches = 1}};
    CHECK(differences(five_steps(whole16), five_steps(plain16)) == "");
    Pipeline<Bf16Gpt, Cuts<3>, OneFOneB> piped16{shared_gpu(2), 5, {.micro_batches = 4}};
    const std::vector<float> p16 = without(five_steps(piped16), noise);
    CHECK(norm_relative(without(parameters(plain16), noise), p16) < 2e-2);   // bf16 activations: other roundings
    // ClipGradNorm: the stages' sums of squares added on the host give the plain model's norm.
    PipeGpt plain_clipped{Device::cuda(0), 5};
    Pipeline<PipeGpt, Cuts<3>, OneFOneB> two_clipped{shared_gpu(2), 5, {.micro_batches = 2}};
    CHECK(norm_relative(clipped_steps(plain_clipped, data, noise), clipped_steps(two_clipped, data, noise)) < 1e-5);
}

TEST_CASE("ZeRO-1 on replicas sharing the GPU gives the unsharded bits, both policies, bf16 too",
          "[cuda][same-gpu][zero]")
{
    REQUIRE_GPU();
    const TokenBatches<PipeGpt> data(50, 3);
    auto five_steps = [&](auto& model) {
        ClipGradNorm opt{AdamW{{.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.95f, .weight_decay = 0.1f}}, 0.5f};
        for (std::size_t s = 0; s < 5; ++s) train_step(model, opt, data.batch(s * 10, 10, s * 10));
        return std::pair{parameters(model), model.optimizer_state()};
    };
    auto check = [&]<class Model>(std::type_identity<Model>, std::size_t replicas) {
        CAPTURE(replicas);
        Model whole{shared_gpu(replicas), 5};
        Model sharded{shared_gpu(replicas), 5, {.shard = Shard::optimizer_state}};
        const auto want = five_steps(whole), got = five_steps(sharded);
        // Unsharded, every replica updates alike from the same summed gradient.
        for (std::size_t r = 1; r < replicas; ++r) CHECK(differences(whole.replica(r).parameters(), want.first) == "");
        CHECK(differences(got.first, want.first) == "");
        CHECK(differences(got.second, want.second) == "");
        for (std::size_t r = 0; r < replicas; ++r) CHECK(differences(sharded.replica(r).parameters(), want.first) == "");
        CHECK(sharded.optimizer_state_floats(0) < want.second.size());
        if constexpr (std::is_same_v<typename Model::replica_type, PipeGpt>) {   // the plain model, up to the sums' order
            // Without the parameters whose gradient is zero in exact arithmetic (key biases, absent
            // tokens): AdamW turns the float noise of their sums into steps of the learning rate's size.
            const std::vector<bool> noise = zero_gradient<PipeGpt>(data, Device::cuda(0));
            PipeGpt plain{Device::cuda(0), 5};
            CHECK(norm_relative(without(five_steps(plain).first, noise), without(want.first, noise)) < 1e-5);
        }
    };
    check(std::type_identity<DataParallel<PipeGpt, Threaded>>{}, 2);
    check(std::type_identity<DataParallel<PipeGpt, SingleThread>>{}, 3);
    check(std::type_identity<DataParallel<with_precision<PipeGpt, bf16>, Threaded>>{}, 2);
}

TEST_CASE("TensorParallel on ranks sharing the GPU, and on distinct GPUs where there are 2, equals the plain model",
          "[cuda][same-gpu][tensor]")
{
    REQUIRE_GPU();
    auto check = [&]<class M, std::size_t Ways>(std::type_identity<M>, std::integral_constant<std::size_t, Ways>,
                                                std::vector<Device> devices) {
        CAPTURE(Ways, devices.size(), devices.back().name());
        const TokenBatches<M> data(50, 3);
        auto five_steps = [&](auto& model) {
            AdamW opt{{.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.95f, .weight_decay = 0.1f}};
            for (std::size_t s = 0; s < 5; ++s) train_step(model, opt, data.batch(s * 10, 10, s * 10));
            return parameters(model);
        };
        const std::vector<bool> noise = zero_gradient<M>(data, Device::cuda(0));   // key biases, absent tokens
        M plain{Device::cuda(0), 5};
        TensorParallel<M, Ways> split{devices, 5};
        REQUIRE(differences(parameters(split), parameters(plain)) == "");
        const std::vector<float> want = without(five_steps(plain), noise);
        CHECK(norm_relative(want, without(five_steps(split), noise)) < 1e-5);
        std::vector<float> a(10 * M::output_shape::size), b(a.size());
        plain.predict(data.inputs.data(), 10, a.data());
        split.predict(data.inputs.data(), 10, b.data());
        CHECK(norm_relative(a, b) < 1e-5);
        // Every rank holds the same whole blocks, bit for bit.
        const std::vector<float> first = split.rank(0).parameters();
        for (std::size_t r = 1; r < Ways; ++r) {
            const std::vector<float> other = split.rank(r).parameters();
            for (const auto& range : model::param_ranges_of<typename TensorParallel<M, Ways>::shard_type::chain>)
                if (range.split.runs == 0)
                    for (std::size_t i = range.offset; i < range.offset + range.count; ++i) REQUIRE(other[i] == first[i]);
        }
        // ClipGradNorm: the ranks' sums of squares (the whole blocks once) give the plain model's norm.
        M plain_clipped{Device::cuda(0), 5};
        TensorParallel<M, Ways> split_clipped{devices, 5};
        const std::vector<float> want_clipped = clipped_steps(plain_clipped, data, noise);
        CHECK(norm_relative(want_clipped, clipped_steps(split_clipped, data, noise)) < 1e-5);
    };
    check(std::type_identity<PipeGpt>{}, std::integral_constant<std::size_t, 2>{}, shared_gpu(2));
    check(std::type_identity<TinyGpt>{}, std::integral_constant<std::size_t, 4>{}, shared_gpu(4));
    if (cuda_devices().size() >= 2) check(std::type_identity<TinyGpt>{}, std::integral_constant<std::size_t, 2>{}, gpus(2));
}

TEST_CASE("LossScale and an Accumulate of a ClipGradNorm over stages, ranks and replicas of pipelines sharing the "
          "GPU: the plain GPU model's skips, scales and clipped means",
          "[cuda][same-gpu][pipeline][tensor][loss_scale]")
{
    REQUIRE_GPU();
    const LossScaleOptions o{.init_scale = 0x1p120f, .backoff_factor = 0x1p-10f, .growth_interval = 2};
    const AdamW adamw{{.lr = 0.01f, .weight_decay = 0.1f}};
    const Device gpu = Device::cuda(0);
    // An overflow in the first stage, on the first rank, only (layout_checks.hpp).
    check_scaled_equals_plain<PipeMlp>([] { return Pipeline<PipeMlp, Cuts<3>, GPipe>{shared_gpu(2), 5, {.micro_batches = 2}}; },
                                       LossScale{ClipGradNorm{adamw, 0.5f}, o}, 1e-5, gpu);
    check_scaled_equals_plain<PipeMlp>(
        [] { return Pipeline<PipeMlp, Cuts<2, 4>, OneFOneB>{shared_gpu(3), 5, {.micro_batches = 1}}; }, LossScale{adamw, o},
        0.0, gpu);   // one micro-batch: the plain model's kernels on the same shapes, the same bits
    check_scaled_equals_plain<SplitMlp>([] { return TensorParallel<SplitMlp, 2>{shared_gpu(2), 5}; },
                                        LossScale{Accumulate{ClipGradNorm{adamw, 0.5f}, 2}, o}, 1e-5, gpu);
    using Both = DataParallel<Pipeline<PipeMlp, Cuts<3>>, Threaded>;
    check_scaled_equals_plain<PipeMlp>([] { return Both{shared_gpu(4), 5, {}, {.micro_batches = 2}}; }, LossScale{adamw, o},
                                       1e-5, gpu);
    // Each window's mean clipped by the norm over the parts.
    const SGD sgd{{.lr = 0.1f, .momentum = 0.9f}};
    check_accumulated_clip_equals_plain<PipeGpt>([] { return TensorParallel<PipeGpt, 2>{shared_gpu(2), 5}; }, sgd, 1e-3,
                                                 1e-5, gpu);
    check_accumulated_clip_equals_plain<PipeGpt>(
        [] { return Pipeline<PipeGpt, Cuts<2, 4>, OneFOneB>{shared_gpu(3), 5, {.micro_batches = 2}}; }, sgd, 1e-3, 1e-5, gpu);
    using BothGpt = DataParallel<Pipeline<PipeGpt, Cuts<3>, GPipe>, SingleThread>;
    check_accumulated_clip_equals_plain<PipeGpt>([] { return BothGpt{shared_gpu(4), 5, {}, {.micro_batches = 2}}; }, sgd,
                                                 1e-3, 1e-5, gpu);
}

TEST_CASE("TensorParallel with bf16 activations on ranks sharing the GPU: the plain bf16 GPU model within bf16 "
          "rounding, the whole blocks the same bits on every rank",
          "[cuda][same-gpu][tensor][precision]")
{
    REQUIRE_GPU();
    check_bf16_split_equals_plain(shared_gpu(2), Device::cuda(0));
}

TEST_CASE("DataParallel over GPUs matches one GPU: LeNet", "[cuda][multi-gpu]") { REQUIRE_GPU(); many_gpus_match_one<LeNet>(63); }
TEST_CASE("DataParallel over GPUs matches one GPU: AlexNet-style", "[cuda][multi-gpu]") { REQUIRE_GPU(); many_gpus_match_one<SmallAlexNetPlain>(13); }
TEST_CASE("DataParallel over GPUs matches one GPU: GoogLeNet-style (Concat, Dropout)", "[cuda][multi-gpu]") { REQUIRE_GPU(); many_gpus_match_one<ConcatDropoutNet>(11); }
TEST_CASE("DataParallel over GPUs matches one GPU: FCN", "[cuda][multi-gpu]") { REQUIRE_GPU(); many_gpus_match_one<SmallFCN>(5); }
TEST_CASE("Nested DataParallel over GPUs (features only) matches one GPU", "[cuda][multi-gpu]")
{
    REQUIRE_GPU();
    nested_matches_plain<SmallAlexNetPlain, SmallAlexNet<SingleThread>>(9);
    nested_matches_plain<SmallAlexNetPlain, SmallAlexNet<Threaded>>(9);
    // Features whose gradient is two buckets, each all-reduced as backward produces it.
    nested_matches_plain<WidePlain, WideNested<SingleThread>>(9);
    nested_matches_plain<WidePlain, WideNested<Threaded>>(9);
}

TEST_CASE("A top-level DataParallel holds as much memory on GPU 0 as on the others", "[cuda][multi-gpu]")
{
    REQUIRE_GPU();
    DataParallel<LeNet, Threaded> dp{gpus(2)};
    SGD opt{{.lr = 0.01f, .momentum = 0.9f}};
    const RandomBatches<LeNet> data(64, 1);
    train_step(dp, opt, data.batch(0, 64, 0));
    std::vector<double> held;
    for (std::size_t r = 0; r < 2; ++r)
        dp.replica(r).visit([&](auto& ctx) {
            if constexpr (requires { ctx.reserved_bytes(); }) held.push_back(double(ctx.reserved_bytes()));
        });
    REQUIRE(held.size() == 2);
    CAPTURE(held[0], held[1]);
    CHECK(std::abs(held[0] - held[1]) <= 0.1 * std::max(held[0], held[1]));
}

// ---- the reproducible mode on GPUs ----

namespace {

template <class M>
void bit_identical_on_any_gpu_count()
{
    const RandomBatches<M> data(100, 4);
    {   // The exact sum must still be the gradient: close to the fast mode (TF32 off in both).
        M fast{Device::cuda(0), 1}, exact{Device::cuda(0), 1};
        const auto a = five_steps(fast, data, 7, {}), b = five_steps(exact, data, 7);
        CHECK(norm_relative(a, b) < 1e-4);
        CHECK(norm_relative(parameters(M{Device::cpu(), 1}), b) > 1e-3);   // and it did train
    }
    const OptionScope defaults{&cuda::Options::allow_tf32, true};   // TF32 convolutions, as users get them
    M one{Device::cuda(0), 1};
    const auto expected = five_steps(one, data, 7);
    M again{Device::cuda(0), 1};
    CHECK(differences(five_steps(again, data, 7), expected) == "");   // run to run
    M other_seed{Device::cuda(0), 2};
    CHECK(differences(five_steps(other_seed, data, 8), expected) != "");
    for (std::size_t n : replica_counts()) {
        CAPTURE(n);
        DataParallel<M, SingleThread> single{gpus(n), 1};
        DataParallel<M, Threaded> threaded{gpus(n), 1};
        CHECK(differences(five_steps(single, data, 7), expected) == "");
        CHECK(differences(five_steps(threaded, data, 7), expected) == "");
    }
}
} // namespace

TEST_CASE("Reproducible mode on GPUs: LeNet is bit-identical on every GPU count and across runs", "[cuda][reproducible]")
{
    REQUIRE_GPU();
    bit_identical_on_any_gpu_count<LeNet>();
}

TEST_CASE("Reproducible mode on GPUs: a nested DataParallel equals the plain model bit for bit", "[cuda][reproducible]")
{
    REQUIRE_GPU();
    const RandomBatches<SmallAlexNetPlain> data(100, 4);
    SmallAlexNetPlain plain{Device::cuda(0), 6};
    const auto expected = five_steps(plain, data, 7);
    auto counts = replica_counts();
    counts.insert(counts.begin(), 1);
    for (std::size_t n : counts) {
        CAPTURE(n);
        SmallAlexNet<Threaded> nested{gpus(n), 6};
        CHECK(differences(five_steps(nested, data, 7), expected) == "");
    }
}

TEST_CASE("Reproducible mode on GPUs: Concat and Dropout are bit-identical on every GPU count and across runs",
          "[cuda][reproducible]")
{
    REQUIRE_GPU();
    bit_identical_on_any_gpu_count<ConcatDropoutNet>();
}

TEST_CASE("A convolution fused with the ReLU after it trains to the same bits on the GPU", "[cuda]")
{
    REQUIRE_GPU();
    const OptionScope deterministic{&cuda::Options::deterministic, true};
    const RandomBatches<FusedConvNet> data(100, 3);
    FusedConvNet fused{Device::cuda(0), 5};
    UnfusedConvNet apart{Device::cuda(0), 5};
    apart.set_parameters(parameters(fused));
    CHECK(differences(five_steps(fused, data, 7, {}), five_steps(apart, data, 7, {})) == "");
}

TEST_CASE("A fully connected layer fused with the ReLU after it trains as the two apart on the GPU", "[cuda]")
{
    REQUIRE_GPU();
    const RandomBatches<FusedMlpNet> data(100, 3);
    FusedMlpNet fused{Device::cuda(0), 5};
    UnfusedMlpNet apart{Device::cuda(0), 5};
    apart.set_parameters(parameters(fused));
    // The fused product (bias and ReLU in its epilogue) may take another cuBLASLt kernel: equal up to
    // float rounding, not bit for bit.
    const auto expected = five_steps(apart, data, 7, {});
    CHECK(max_relative_difference(five_steps(fused, data, 7, {}), expected) < 1e-5);
    CHECK(max_relative_difference(expected, parameters(UnfusedMlpNet{Device::cuda(0), 5})) > 1e-3);   // it trained
    // And as on the CPU.
    FusedMlpNet cpu{Device::cpu(), 5};
    CHECK(max_relative_difference(five_steps(cpu, data, 7, {}), expected) < 1e-4);
}

TEST_CASE("A fully connected layer applying the GELU after it in its product's epilogue trains as the two apart on the GPU, "
          "float and bf16", "[cuda][transformer]")
{
    REQUIRE_GPU();
    const auto check = [&]<class Fused, class Apart>(std::type_identity<Fused>, std::type_identity<Apart>, double tolerance) {
        const RandomBatches<Fused> data(100, 3);
        Fused fused{Device::cuda(0), 5};
        Apart apart{Device::cuda(0), 5};
        apart.set_parameters(parameters(fused));
        // The epilogue's GELU is of the float sum before its rounding to T, and cuBLASLt's own: equal up
        // to rounding, not bit for bit.
        const auto expected = five_steps(apart, data, 7, {});
        CHECK(max_relative_difference(five_steps(fused, data, 7, {}), expected) < tolerance);
        CHECK(max_relative_difference(expected, parameters(Apart{Device::cuda(0), 5})) > 1e-3);   // it trained
        Fused cpu{Device::cpu(), 5};
        CHECK(max_relative_difference(five_steps(cpu, data, 7, {}), expected) < tolerance);
    };
    check(std::type_identity<GeluMlpNet>{}, std::type_identity<GeluMlpApart>{}, 1e-4);
    check(std::type_identity<with_precision<GeluMlpNet, bf16>>{}, std::type_identity<with_precision<GeluMlpApart, bf16>>{},
          3e-2);
}

TEST_CASE("A Residual whose body ends in a fully connected layer or attention adds the other branch in the product on "
          "the GPU: as apart, float and bf16", "[cuda][transformer]")
{
    REQUIRE_GPU();
    // float: every parameter within 1e-4 of the two apart. bf16 (one rounding of the sum fewer): in norm,
    // since LayerNorm's biases start at 0 and stay near it, where a rounding's worth is a large fraction.
    const auto check = [&]<class Fused, class Apart, class Data>(std::type_identity<Fused>, std::type_identity<Apart>,
                                                                 const Data& data) {
        constexpr bool in_float = std::is_same_v<typename Fused::chain::storage, float>;
        const auto distance = [&](const std::vector<float>& a, const std::vector<float>& b) {
            return in_float ? max_relative_difference(a, b) : norm_relative(a, b);
        };
        const double tolerance = in_float ? 1e-4 : 3e-2;
        Fused fused{Device::cuda(0), 5};
        Apart apart{Device::cuda(0), 5};
        apart.set_parameters(parameters(fused));
        // The branch is the product's C, added in float before the epilogue's bias and one rounding.
        const auto expected = five_steps(apart, data, 7, {});
        const auto got = five_steps(fused, data, 7, {});
        CAPTURE(in_float, max_relative_difference(got, expected), norm_relative(got, expected));
        CHECK(distance(got, expected) < tolerance);
        CHECK(max_relative_difference(expected, parameters(Apart{Device::cuda(0), 5})) > 1e-3);   // it trained
        Fused cpu{Device::cpu(), 5};
        CHECK(distance(five_steps(cpu, data, 7, {}), got) < tolerance);
    };
    const RandomBatches<ResidualMlpNet> images(100, 3);
    const TokenBatches<ResidualAttentionNet> tokens(100, 3);
    check(std::type_identity<ResidualMlpNet>{}, std::type_identity<ResidualMlpApart>{}, images);
    check(std::type_identity<with_precision<ResidualMlpNet, bf16>>{}, std::type_identity<with_precision<ResidualMlpApart, bf16>>{},
          images);
    check(std::type_identity<ResidualAttentionNet>{}, std::type_identity<ResidualAttentionApart>{}, tokens);
    check(std::type_identity<with_precision<ResidualAttentionNet, bf16>>{},
          std::type_identity<with_precision<ResidualAttentionApart, bf16>>{}, tokens);
}

// ---- the next step queued ahead (train_step's `next`) ----

namespace {
// 5 steps of 20 samples; with `ahead`, each step names the next batch so that the model queues that
// step behind it; `detour` names a batch the following step does not train on (the work queued ahead
// must be dropped, not used); `interrupt` evaluates after step 1 (on 30 samples: the buffers grow
// while a step is queued ahead) and sets new parameters after step 2 (the step ahead is dropped).
template <class Model, class Data>
std::vector<float> five_steps_ahead(Model& model, const Data& data, bool ahead, bool detour = false, bool interrupt = false)
{
    SGD opt{{.lr = 0.05f, .momentum = 0.9f}};
    for (std::size_t s = 0; s < 5; ++s) {
        const auto b = data.batch(s * 20, 20, s * 20), next = data.batch((s + 1) * 20 % 100, 20, (s + 1) * 20);
        const auto wrong = data.batch(80, 20, 0);
        train_step(model, opt, b, {}, !ahead ? nullptr : detour && s % 2 == 0 ? &wrong : &next);
        if (interrupt && s == 1) model.evaluate(data.inputs.data(), data.labels.data(), 30);
        if (interrupt && s == 2) {
            auto w = parameters(model);
            for (float& v : w) v *= 0.5f;
            model.set_parameters(w);
        }
    }
    return parameters(model);
}
} // namespace

TEST_CASE("Queueing the next step ahead changes nothing but the time", "[cuda]")
{
    REQUIRE_GPU();
    // Only deterministic cuDNN algorithms: the default ones may sum with atomics, so two identical runs
    // differ in the last bits (measured: 165 of LeNet's 431,080 parameters after 5 steps, by 1e-5).
    const OptionScope deterministic{&cuda::Options::deterministic, true};
    const RandomBatches<LeNet> data(100, 6);
    LeNet plain{Device::cuda(0), 3}, ahead{Device::cuda(0), 3}, detour{Device::cuda(0), 3};
    const auto expected = five_steps_ahead(plain, data, false);
    CHECK(differences(five_steps_ahead(ahead, data, true), expected) == "");
    CHECK(differences(five_steps_ahead(detour, data, true, true), expected) == "");
    LeNet interrupted{Device::cuda(0), 3}, interrupted_ahead{Device::cuda(0), 3};
    const auto expected_interrupted = five_steps_ahead(interrupted, data, false, false, true);
    CHECK(differences(five_steps_ahead(interrupted_ahead, data, true, false, true), expected_interrupted) == "");
    CHECK(differences(expected_interrupted, expected) != "");
    // Dropout reads its step's seed and first sample from device memory, one copy per step slot: with a
    // slow update (16.8M parameters), a step is queued ahead before the step before it has begun.
    using Wide = Sequential<Input<4096>, Linear<4096>, ReLU, Dropout<0.5>, Linear<10>>;
    const RandomBatches<Wide> wide_data(100, 7);
    Wide wide_plain{Device::cuda(0), 3}, wide_ahead{Device::cuda(0), 3};
    CHECK(differences(five_steps_ahead(wide_ahead, wide_data, true), five_steps_ahead(wide_plain, wide_data, false)) == "");
    // One GPU: the DataParallel's own bookkeeping, both policies.
    DataParallel<LeNet, SingleThread> one{gpus(1), 3}, one_ahead{gpus(1), 3};
    CHECK(differences(five_steps_ahead(one_ahead, data, true, true, true), five_steps_ahead(one, data, false, false, true)) == "");
    {   // Two replicas: two GPUs, or two sharing the one.
        DataParallel<LeNet, Threaded> two{gpus(2), 3}, two_ahead{gpus(2), 3};
        CHECK(differences(five_steps_ahead(two_ahead, data, true), five_steps_ahead(two, data, false)) == "");
        DataParallel<LeNet, SingleThread> single{gpus(2), 3}, single_ahead{gpus(2), 3};
        CHECK(differences(five_steps_ahead(single_ahead, data, true, true, true),
                          five_steps_ahead(single, data, false, false, true)) == "");
    }
}

// ---- CUDA graphs (backend::cuda::Options::graphs) ----

namespace {
// 6 steps of 16 samples, the two step slots (staging buffers) alternating as each step queues the next (one
// graph per buffer: steps 1-2 eager, 3-4 captured, 5-6 replayed), then one of 10 (a new size: eager).
template <class Model, class Data>
std::vector<float> steps_for_graphs(Model& model, const Data& data)
{
    SGD opt{{.lr = 0.05f, .momentum = 0.9f}};
    for (std::size_t s = 0; s < 6; ++s) {
        const auto b = data.batch(s * 16, 16, s * 16, 5), next = data.batch((s + 1) * 16, 16, (s + 1) * 16, 5);
        train_step(model, opt, b, {}, &next);
    }
    train_step(model, opt, data.batch(96, 10, 96, 5));
    return parameters(model);
}
} // namespace

std::size_t graphs_held(auto& model)
{
    std::size_t count = 0;
    model.visit([&](auto& ctx) {
        if constexpr (requires { ctx.graph_cache(); }) count = ctx.graph_cache().size();
    });
    return count;
}
// The places where a replay calls the step's hook, over all graphs held.
std::size_t cuts_held(auto& model)
{
    std::size_t count = 0;
    model.visit([&](auto& ctx) {
        if constexpr (requires { ctx.graph_cache(); }) count += ctx.graph_cache().cuts();
    });
    return count;
}

TEST_CASE("A training step replayed from a CUDA graph equals the eager step, bit for bit", "[cuda][graphs]")
{
    REQUIRE_GPU();
    const OptionScope deterministic{&cuda::Options::deterministic, true};   // see the copy-ahead test
    const RandomBatches<ConcatDropoutNet> drop(112, 8);   // dropout: masks move with the sample index
    const RandomBatches<LeNet> lenet(112, 8);
    std::vector<float> expected, lenet_expected;
    {
        const OptionScope eager{&cuda::Options::graphs, false};
        ConcatDropoutNet net{Device::cuda(0), 4};
        LeNet lenet_net{Device::cuda(0), 4};
        expected = steps_for_graphs(net, drop);
        lenet_expected = steps_for_graphs(lenet_net, lenet);
        CHECK(graphs_held(lenet_net) == 0);
    }
    const OptionScope on{&cuda::Options::graphs, true};
    ConcatDropoutNet replayed{Device::cuda(0), 4};
    LeNet lenet_replayed{Device::cuda(0), 4};
    CHECK(differences(steps_for_graphs(replayed, drop), expected) == "");
    CHECK(differences(steps_for_graphs(lenet_replayed, lenet), lenet_expected) == "");
    CHECK(graphs_held(replayed) == 2);   // batch 16 in each of the two staging buffers
    CHECK(graphs_held(lenet_replayed) == 2);
}

TEST_CASE("The reproducible mode replays its micro-shards from a CUDA graph: the same bits as eager", "[cuda][graphs][reproducible]")
{
    REQUIRE_GPU();
    const RandomBatches<ConcatDropoutNet> data(100, 3);   // dropout: each shard's masks at its samples
    std::vector<float> expected, expected_dp;
    {
        const OptionScope eager{&cuda::Options::graphs, false};
        ConcatDropoutNet net{Device::cuda(0), 5};
        DataParallel<ConcatDropoutNet, Threaded> dp{{Device::cuda(0)}, 5};
        expected = five_steps(net, data, 7);   // kReproducible: shards of 8, 8 and 4
        expected_dp = five_steps(dp, data, 7);
        CHECK(graphs_held(net) == 0);
    }
    const OptionScope on{&cuda::Options::graphs, true};
    ConcatDropoutNet net{Device::cuda(0), 5};
    DataParallel<ConcatDropoutNet, Threaded> dp{{Device::cuda(0)}, 5};
    CHECK(differences(five_steps(net, data, 7), expected) == "");
    CHECK(differences(five_steps(dp, data, 7), expected_dp) == "");
    CHECK(graphs_held(net) == 1);   // the shards of a 20-sample batch: eager, captured, then replayed
    CHECK(differences(expected_dp, expected) == "");
}

TEST_CASE("A DataParallel over one GPU replays its deferred graph segments and equals the plain model bit for bit",
          "[cuda][graphs]")
{
    REQUIRE_GPU();
    const OptionScope deterministic{&cuda::Options::deterministic, true};
    const RandomBatches<LeNet> lenet(112, 8);
    const OptionScope on{&cuda::Options::graphs, true};
    LeNet plain{Device::cuda(0), 4};
    const auto expected = steps_for_graphs(plain, lenet);
    DataParallel<LeNet, SingleThread> one{gpus(1), 4};   // segments launched by launch_deferred
    REQUIRE(one.bucket_count() == 2);
    CHECK(differences(steps_for_graphs(one, lenet), expected) == "");
    CHECK(graphs_held(one.replica(0)) == 2);
    CHECK(cuts_held(one.replica(0)) == 2 * 2);
}

TEST_CASE("DataParallel replicas replay their steps from CUDA graphs cut at every bucket, and match the eager steps",
          "[cuda][multi-gpu]")
{
    REQUIRE_GPU();
    const OptionScope deterministic{&cuda::Options::deterministic, true};
    const RandomBatches<LeNet> lenet(112, 8);
    const DataParallelOptions buckets{.bucket_floats = 1 << 16};   // LeNet's gradient in 2 buckets
    std::vector<float> expected;
    {
        const OptionScope eager{&cuda::Options::graphs, false};
        DataParallel<LeNet, Threaded> two{gpus(2), 4, buckets};
        expected = steps_for_graphs(two, lenet);
        CHECK(graphs_held(two.replica(0)) == 0);
    }
    const OptionScope on{&cuda::Options::graphs, true};
    DataParallel<LeNet, Threaded> replayed{gpus(2), 4, buckets};
    REQUIRE(replayed.bucket_count() == 2);
    CHECK(differences(steps_for_graphs(replayed, lenet), expected) == "");
    for (std::size_t r : {0, 1}) {
        CAPTURE(r);
        CHECK(graphs_held(replayed.replica(r)) == 2);   // batch 8 in each of the two staging buffers
        CHECK(cuts_held(replayed.replica(r)) == 2 * 2);   // each graph cut where a bucket is complete
    }
    DataParallel<LeNet, SingleThread> single{gpus(2), 4, buckets};   // grouped all-reduce after all replicas
    CHECK(norm_relative(steps_for_graphs(single, lenet), expected) < 1e-6);
    CHECK(cuts_held(single.replica(1)) == 2 * 2);
}

// ---- backend contract and owned resources ----

static_assert(backend::Context<cuda::Context> && backend::Context<backend::cpu::Context>);
static_assert(!backend::Context<int> && !backend::Context<cuda::Stream>);
static_assert(backend::kernels::Kernels<cuda::Context> && backend::kernels::Kernels<backend::cpu::Context>);
static_assert(!backend::kernels::Kernels<int> && !backend::kernels::ElementwiseKernels<cuda::Stream>);
static_assert(!std::is_copy_constructible_v<cuda::Event> && std::is_nothrow_move_constructible_v<cuda::Event>);
static_assert(!std::is_copy_constructible_v<cuda::ConvPlan> && !std::is_copy_constructible_v<cuda::Gemm>);

namespace owned_test {
// A fake handle kind for Owned, counting what was given back: no GPU needed.
int given_back = 0;
struct Give {
    void operator()(int) const noexcept { ++given_back; }
};
using Handle = cuda::Owned<int, Give>;
Handle make(int raw)
{
    if (raw == 3) throw Error("the third handle cannot be made");
    return Handle(raw);
}
// Makes three handles in its member initialisers, as a context's parts do.
struct Three {
    Handle a = make(1), b = make(2), c = make(3);
};
} // namespace owned_test

TEST_CASE("An object whose third owned handle fails gives back the two it made", "[cuda]")
{
    owned_test::given_back = 0;
    CHECK_THROWS_WITH(owned_test::Three{}, "the third handle cannot be made");
    CHECK(owned_test::given_back == 2);

    owned_test::given_back = 0;
    {
        owned_test::Handle h(7);
        const int raw = h.release();   // ownership given up: nothing is given back
        CHECK(raw == 7);
        CHECK(!h);
        owned_test::Handle other(8);
        other = owned_test::Handle(9);   // 8 given back by the assignment
        CHECK(owned_test::given_back == 1);
    }
    CHECK(owned_test::given_back == 2);   // and 9 as `other` goes
}

TEST_CASE("An owned CUDA handle moves to its new owner and is given back once", "[cuda]")
{
    REQUIRE_GPU();
    cuda::Context ctx{Device::cuda(0)};
    ctx.activate();
    cuda::Event a = cuda::make_event();
    const cudaEvent_t raw = a;
    REQUIRE(raw != nullptr);
    cuda::Event b = std::move(a);
    CHECK(!a);
    CHECK(b.get() == raw);
    CHECK(cudaEventRecord(b, ctx.stream()) == cudaSuccess);
    cuda::Event c = cuda::make_event();
    c = std::move(b);   // c's own event is given back, b's is now c's
    CHECK(!b);
    CHECK(c.get() == raw);
    CHECK(cudaEventSynchronize(c) == cudaSuccess);
    c.reset();
    CHECK(!c);

    cuda::Pinned<double> pinned(3);   // page-locked and value-initialised
    cudaPointerAttributes where{};
    REQUIRE(cudaPointerGetAttributes(&where, pinned.data()) == cudaSuccess);
    CHECK(where.type == cudaMemoryTypeHost);
    CHECK((pinned[0] == 0.0 && pinned[1] == 0.0 && pinned[2] == 0.0));
}

TEST_CASE("A context's watchdog is called while the host waits, and stops the wait by throwing", "[cuda]")
{
    REQUIRE_GPU();
    cuda::Context ctx{Device::cuda(0)};
    ctx.activate();
    auto slow = [&] {   // 50 ms of host work queued on the compute stream
        REQUIRE(cudaLaunchHostFunc(ctx.stream(), [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(50)); },
                                   nullptr) == cudaSuccess);
    };
    int calls = 0;
    ctx.set_watchdog([&](double waited) {
        ++calls;
        if (waited > 0.0) throw Error("stopped by the watchdog");
    });
    slow();
    std::string message;
    try {
        ctx.synchronize();
    } catch (const Error& e) {
        message = e.what();
    }
    CHECK(message == "stopped by the watchdog");
    CHECK(calls >= 1);
    cuda::Context copy = ctx;   // copies share the watchdog
    copy.set_watchdog(nullptr);
    calls = 0;
    slow();
    ctx.synchronize();   // blocks, no watchdog
    CHECK(calls == 0);
}

TEST_CASE("The autotuner keeps cuDNN unless a candidate is 3% faster; make_deterministic drops the plans", "[cuda]")
{
    REQUIRE_GPU();
    CHECK(cuda::detail::CallTimer::clearly_faster(1.0, 1.031));
    CHECK(!cuda::detail::CallTimer::clearly_faster(1.0, 1.029));
    CHECK(!cuda::detail::CallTimer::clearly_faster(cuda::detail::CallTimer::never, 1.0));

    const OptionScope products{&cuda::Options::conv_path, cuda::ConvPath::gemm_forward};
    constexpr core::Window g{20, 12, 12, 5, 5, 1, 1, 0, 0, 8, 8};
    cuda::Context ctx{Device::cuda(0)};
    const cuda::ConvPlan& p = cuda::detail::plan_of<g>(ctx, 50, 7);
    CHECK((p.gemm_forward && !p.gemm_backward));   // the path forces the forward pass to the products
    CHECK((p.x && p.y && p.w && p.conv));          // cuDNN's descriptors, owned by the plan
    CHECK(p.workspace >= cuda::ProductConv<g>::workspace(50, 7));
    CHECK(ctx.plan_cache().conv_plans.size() == 1);
    cuda::make_deterministic(ctx);
    CHECK(ctx.plan_cache().conv_plans.empty());
    CHECK(ctx.plan_cache().gemms.empty());
    const cuda::ConvPlan& q = cuda::detail::plan_of<g>(ctx, 50, 7);   // made again, deterministic
    CHECK(ctx.plan_cache().conv_plans.size() == 1);
    CHECK(q.gemm_forward);
}

// ---- several replicas on one GPU ----
// A device list that repeats one GPU (cuda:0,cuda:0) gives each replica its own context (streams,
// allocator, CUDA graphs); their gradients are summed on the GPU in rank order (backend/cuda/shared_gpu.hpp).

namespace {
// One process that claims to be one of two (no other exists: the communicator must refuse first).
class TwoProcesses final : public parallel::ProcessGroup {
public:
    int rank() const override { return 0; }
    int size() const override { return 2; }
    std::unique_ptr<parallel::Communicator> span(std::unique_ptr<parallel::Communicator> local, std::size_t) override
    {
        return local;
    }
    void broadcast(void*, std::size_t) override {}
    void sum(double*, std::size_t) override {}
};

// `steps` SGD steps of `batch` samples, each naming the next (train_step's queue-ahead). With CUDA
// graphs each of the two step slots runs its first step eagerly, captures its second and replays
// the rest.
template <class Model, class Data>
std::vector<float> queued_steps(Model& model, const Data& data, std::size_t batch, std::size_t steps = 6)
{
    SGD opt{{.lr = 0.01f, .momentum = 0.9f, .weight_decay = 5e-4f}};
    for (std::size_t s = 0; s < steps; ++s) {
        const std::size_t t = std::min(s + 1, steps - 1);
        const auto b = data.batch(s * batch, batch, s * batch), next = data.batch(t * batch, batch, t * batch);
        train_step(model, opt, b, {}, s + 1 < steps ? &next : nullptr);
    }
    return parameters(model);
}

// "" when every replica of dp holds replica 0's parameters bit for bit.
template <class DP>
std::string replicas_disagree(DP& dp)
{
    const auto first = dp.replica(0).parameters();
    for (std::size_t r = 1; r < dp.replica_count(); ++r)
        if (const auto d = differences(dp.replica(r).parameters(), first); d != "") return "replica " + std::to_string(r) + ": " + d;
    return "";
}
// Three contexts on GPU 0, each with n floats split at `half` into buckets 0 and 1, and the two forms
// of a communicator driven over them: one thread for every rank (SingleThread), a thread per rank
// (Threaded); each replica's result checked against the expected sums.
struct SharedGpuRanks {
    static constexpr std::size_t ranks = 3;
    std::size_t n, half;
    std::vector<cuda::Context> ctx;
    std::vector<backend::AnyContext> any;
    std::vector<core::Buffer<float>> buffers;
    std::vector<float*> lower, upper;   // buckets 0 and 1: [0, half) and [half, n)

    SharedGpuRanks(std::size_t n_, std::size_t half_) : n(n_), half(half_)
    {
        for (std::size_t r = 0; r < ranks; ++r) {
            ctx.emplace_back(Device::cuda(0));
            any.emplace_back(ctx.back());
            buffers.push_back(ctx.back().allocate<float>(n));
            lower.push_back(buffers.back().data());
            upper.push_back(buffers.back().data() + half);
        }
    }
    void load(const std::vector<std::vector<float>>& host)
    {
        for (std::size_t r = 0; r < ranks; ++r) ctx[r].upload(buffers[r].data(), host[r].data(), n);
    }
    void check_every_replica(const std::vector<float>& expected, const std::string& how)
    {
        for (std::size_t r = 0; r < ranks; ++r) {
            std::vector<float> got(n);
            ctx[r].download(got.data(), buffers[r].data(), n);   // on r's compute stream: after wait(r)
            ctx[r].synchronize();
            CAPTURE(how, r);
            CHECK(differences(got, expected) == "");
        }
    }
    void one_thread(parallel::Communicator& comm)
    {
        for (std::size_t b : {0, 1})
            for (std::size_t r = 0; r < ranks; ++r) comm.produced(r, b);
        comm.group_all_reduce(lower, half, 0);
        comm.group_all_reduce(upper, n - half, 1);
        for (std::size_t r = 0; r < ranks; ++r) comm.wait(r);
    }
    void thread_per_rank(parallel::Communicator& comm)
    {
        std::vector<std::future<void>> threads;
        for (std::size_t r = 0; r < ranks; ++r)
            threads.push_back(std::async(std::launch::async, [&, r] {
                try {
                    comm.all_reduce(r, lower[r], half, 0);
                    comm.all_reduce(r, upper[r], n - half, 1);
                    comm.wait(r);
                } catch (...) {
                    comm.abort();   // the others would wait for this rank for ever
                    throw;
                }
            }));
        for (auto& t : threads) t.get();
    }
};
} // namespace

TEST_CASE("Replicas sharing one GPU: the sum adds in rank order into every replica, in both forms; abort releases a "
          "waiting rank", "[cuda][same-gpu]")
{
    REQUIRE_GPU();
    SharedGpuRanks g(10000, 4099);
    const std::size_t n = g.n, half = g.half, ranks = g.ranks;
    auto& ctx = g.ctx;
    auto& lower = g.lower;
    auto comm = parallel::make_communicator(g.any, 2);
    REQUIRE(dynamic_cast<backend::cuda::SharedGpuCommunicator*>(comm.get()) != nullptr);

    // Magnitudes far apart, so that another order of addition gives other floats.
    const std::vector<std::vector<float>> host{random_vector(n, 31, 1e4f), random_vector(n, 32), random_vector(n, 33, 1e4f)};
    std::vector<float> expected(n), reversed(n);
    for (std::size_t i = 0; i < n; ++i) {
        expected[i] = (host[0][i] + host[1][i]) + host[2][i];
        reversed[i] = (host[2][i] + host[1][i]) + host[0][i];
    }
    REQUIRE(differences(expected, reversed) != "");

    // One thread for every rank (SingleThread).
    g.load(host);
    g.one_thread(*comm);
    g.check_every_replica(expected, "one thread");

    // Each rank from its own thread (Threaded), twice: each bucket's sum has rounds.
    for (int round = 0; round < 2; ++round) {
        g.load(host);
        g.thread_per_rank(*comm);
        g.check_every_replica(expected, "a thread per rank, round " + std::to_string(round));
    }

    // The reproducible mode's integers.
    std::vector<std::vector<std::int64_t>> ints(ranks, std::vector<std::int64_t>(n));
    std::vector<std::int64_t> int_sum(n, 0);
    std::vector<core::Buffer<std::int64_t>> int_buffers;
    std::vector<std::int64_t*> int_ptrs;
    for (std::size_t r = 0; r < ranks; ++r) {
        for (std::size_t i = 0; i < n; ++i) {
            ints[r][i] = (std::int64_t(i * 7919 + r * 104729) - 40000000) * (std::int64_t{1} << 30);
            int_sum[i] += ints[r][i];
        }
        int_buffers.push_back(ctx[r].allocate<std::int64_t>(n));
        int_ptrs.push_back(int_buffers.back().data());
        ctx[r].upload(int_ptrs.back(), ints[r].data(), n);
    }
    comm->exact_all_reduce(int_ptrs, n);
    for (std::size_t r = 0; r < ranks; ++r) {
        std::vector<std::int64_t> got(n);
        ctx[r].download(got.data(), int_ptrs[r], n);   // on r's compute stream, which the sum orders
        ctx[r].synchronize();
        CAPTURE(r);
        CHECK(got == int_sum);
    }

    // A rank waiting for the others is released by abort(), with an Error.
    auto fresh = parallel::make_communicator(g.any, 2);
    auto waiting = std::async(std::launch::async, [&] {
        fresh->all_reduce(0, lower[0], half, 0);
        return error_message([&] { fresh->wait(0); });
    });
    CHECK(waiting.wait_for(std::chrono::milliseconds(300)) == std::future_status::timeout);   // ranks 1 and 2 never come
    fresh->abort();
    const bool released = waiting.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
    if (!released)   // let it go, so that the test ends
        for (std::size_t r : {1, 2}) fresh->all_reduce(r, lower[r], half, 0);
    CHECK(released);
    CHECK(waiting.get().find("all_reduce aborted: another replica failed") != std::string::npos);
    CHECK(error_message([&] { fresh->all_reduce(1, lower[1], half, 0); }).find("aborted") != std::string::npos);
}

TEST_CASE("Replicas sharing one GPU: a bf16 all-reduce gives the host rule's bits in both forms; sync points stay "
          "float", "[cuda][same-gpu]")
{
    REQUIRE_GPU();
    SharedGpuRanks g(10000, 4099);
    const std::size_t n = g.n, half = g.half;
    // Bucket 0 is a gradient bucket in bf16; id 1 is a sync point (floats).
    auto comm = parallel::make_communicator(g.any, 2, nullptr, {.buckets = 1, .largest = half, .reduction = GradientReduction::bf16});
    REQUIRE(dynamic_cast<backend::cuda::SharedGpuCommunicator*>(comm.get()) != nullptr);
    const std::vector<std::vector<float>> host{random_vector(n, 31, 1e4f), random_vector(n, 32), random_vector(n, 33, 1e4f)};
    const std::vector<const float*> columns{host[0].data(), host[1].data(), host[2].data()};
    std::vector<float> expected(n);
    for (std::size_t i = 0; i < half; ++i) expected[i] = backend::sum_rounded_to_bf16(columns, i);
    for (std::size_t i = half; i < n; ++i) expected[i] = (host[0][i] + host[1][i]) + host[2][i];
    g.load(host);
    g.one_thread(*comm);
    g.check_every_replica(expected, "one thread");
    g.load(host);
    g.thread_per_rank(*comm);
    g.check_every_replica(expected, "a thread per rank");
}

TEST_CASE("DataParallel with a bf16 all-reduce: replicas sharing one GPU train alike under both policies, "
          "with gradients that bf16 holds; one GPU through NCCL too", "[cuda][same-gpu]")
{
    REQUIRE_GPU();
    const OptionScope deterministic{&cuda::Options::deterministic, true};
    const DataParallelOptions bf16_reduce{.bucket_floats = 1 << 16, .gradient_reduction = GradientReduction::bf16};
    const RandomBatches<LeNet> data(6 * 61, 23);
    auto held_by_bf16 = [](const std::vector<float>& g) {
        for (float v : g)
            if (core::round_through<core::bf16>(v) != v) return false;
        return true;
    };
    LeNet one{Device::cuda(0), 2};
    const auto initial = parameters(one);
    const auto expected = queued_steps(one, data, 61);
    DataParallel<LeNet, SingleThread> single{shared_gpu(3), 2, bf16_reduce};
    DataParallel<LeNet, Threaded> threaded{shared_gpu(3), 2, bf16_reduce};
    DataParallel<LeNet, Threaded> in_fp32{shared_gpu(3), 2, {.bucket_floats = 1 << 16}};
    const auto a = queued_steps(single, data, 61), b = queued_steps(threaded, data, 61);
    CHECK(differences(a, b) == "");
    CHECK(replicas_disagree(threaded) == "");
    CHECK(held_by_bf16(threaded.gradients()));
    CHECK(differences(queued_steps(in_fp32, data, 61), a) != "");
    // A few of 2^-9, bf16's rounding, of the parameters' change (test_parallel.cpp has the CPU's).
    CAPTURE(update_error(a, expected, initial));
    CHECK(update_error(a, expected, initial) < 4.0 / 512.0);
    // One GPU: NCCL with one rank, each bucket rounded to bf16, summed as ncclBfloat16 and widened.
    DataParallel<LeNet, Threaded> alone{{Device::cuda(0)}, 2, bf16_reduce};
    const auto c = queued_steps(alone, data, 61);
    CHECK(held_by_bf16(alone.gradients()));
    CAPTURE(update_error(c, expected, initial));
    CHECK(update_error(c, expected, initial) < 4.0 / 512.0);
}

TEST_CASE("Replicas sharing one GPU train as one GPU: uneven splits, a batch smaller than the replica count, both "
          "policies bit for bit, CUDA graphs on and off", "[cuda][same-gpu]")
{
    REQUIRE_GPU();
    // Deterministic algorithms: the two policies' replicas then compute the same floats, and the sum
    // adds them in rank order in both, so they agree bit for bit.
    const OptionScope deterministic{&cuda::Options::deterministic, true};
    const bool graphs = GENERATE(false, true);
    const OptionScope graphs_scope{&cuda::Options::graphs, graphs};
    const DataParallelOptions buckets{.bucket_floats = 1 << 16};   // LeNet's gradient in 2 buckets
    const std::pair<std::size_t, std::size_t> cases[] = {{2, 61}, {3, 61}, {3, 2}};   // replicas, batch
    for (const auto& [replicas, batch] : cases) {
        CAPTURE(graphs, replicas, batch);
        const RandomBatches<LeNet> data(6 * batch, 23);
        LeNet one{Device::cuda(0), 2};
        const auto expected = queued_steps(one, data, batch);
        DataParallel<LeNet, SingleThread> single{shared_gpu(replicas), 2, buckets};
        DataParallel<LeNet, Threaded> threaded{shared_gpu(replicas), 2, buckets};
        REQUIRE(single.bucket_count() == 2);
        const auto a = queued_steps(single, data, batch), b = queued_steps(threaded, data, batch);
        CHECK(norm_relative(expected, a) < 1e-5);
        CHECK(differences(a, b) == "");
        CHECK(replicas_disagree(single) == "");
        CHECK(replicas_disagree(threaded) == "");
        CHECK(norm_relative(parameters(LeNet{Device::cuda(0), 2}), a) > 1e-4);   // and it trained
        // With graphs: each step slot's step captured, cut where each bucket is complete, then replayed.
        CHECK(graphs_held(single.replica(0)) == (graphs ? 2u : 0u));
        CHECK(cuts_held(threaded.replica(0)) == (graphs ? 2u * 2u : 0u));
    }
}

TEST_CASE("Replicas sharing one GPU: a nested DataParallel gives the same bits with either policy",
          "[cuda][same-gpu]")
{
    REQUIRE_GPU();
    const OptionScope deterministic{&cuda::Options::deterministic, true};
    const RandomBatches<SmallAlexNetPlain> data(27, 17);
    SmallAlexNetPlain plain{Device::cuda(0), 6};
    const auto expected = three_steps(plain, data, 9);
    SmallAlexNet<SingleThread> single{shared_gpu(2), 6};
    SmallAlexNet<Threaded> threaded{shared_gpu(2), 6};
    const auto a = three_steps(single, data, 9);
    // Another split of the batch, deterministic algorithms and TF32 convolutions: float rounding only.
    CHECK(norm_relative(expected, a) < 1e-4);
    CHECK(differences(three_steps(threaded, data, 9), a) == "");
}

TEST_CASE("Replicas sharing one GPU: the reproducible mode gives the bits of one replica on 2 and 3", "[cuda][same-gpu][reproducible]")
{
    REQUIRE_GPU();
    const RandomBatches<LeNet> data(100, 4);
    LeNet one{Device::cuda(0), 1};
    const auto expected = five_steps(one, data, 7);
    DataParallel<LeNet, Threaded> alone{{Device::cuda(0)}, 1};
    CHECK(differences(five_steps(alone, data, 7), expected) == "");
    for (std::size_t n : {2, 3}) {
        CAPTURE(n);
        DataParallel<LeNet, SingleThread> single{shared_gpu(n), 1};
        DataParallel<LeNet, Threaded> threaded{shared_gpu(n), 1};
        CHECK(differences(five_steps(single, data, 7), expected) == "");
        CHECK(differences(five_steps(threaded, data, 7), expected) == "");
        CHECK(replicas_disagree(threaded) == "");
    }
}

TEST_CASE("Replicas sharing one GPU cannot span processes", "[cuda][same-gpu]")
{
    REQUIRE_GPU();
    TwoProcesses processes;
    const auto message = error_message([&] { DataParallel<LeNet> dp{shared_gpu(2), 0, {.processes = &processes}}; });
    CAPTURE(message);
    CHECK(message.find("replicas sharing a GPU (cuda:0,cuda:0) cannot span processes") != std::string::npos);
    CHECK(message.find("give each process distinct GPUs") != std::string::npos);
}

// ---- BatchNorm and Residual (issue 22) ----

TEST_CASE("BatchNorm and Residual train the same on CPU and GPU: parameters, running estimates, predictions",
          "[cuda][batchnorm]")
{
    REQUIRE_GPU();
    const std::size_t batch = 6;
    const RandomBatches<SmallResNet> data(3 * batch, 21);
    SmallResNet cpu{Device::cpu(), 4}, gpu{Device::cuda(0), 4};
    const auto a = three_steps(cpu, data, batch), b = three_steps(gpu, data, batch);
    CAPTURE(norm_relative(a, b), max_relative_difference(a, b));
    CHECK(norm_relative(a, b) < 1e-4);
    CHECK(norm_relative(cpu.statistics(), gpu.statistics()) < 1e-4);
    std::vector<float> pa(batch * 5), pb(batch * 5);
    cpu.predict(data.inputs.data(), batch, pa.data());
    gpu.predict(data.inputs.data(), batch, pb.data());
    CHECK(norm_relative(pa, pb) < 1e-4);
}

TEST_CASE("BatchNorm over the global batch: replicas sharing one GPU train as one GPU, CUDA graphs on and off",
          "[cuda][same-gpu][batchnorm]")
{
    REQUIRE_GPU();
    const bool graphs = GENERATE(false, true);
    const OptionScope graphs_scope{&cuda::Options::graphs, graphs};
    const std::pair<std::size_t, std::size_t> cases[] = {{2, 7}, {3, 7}, {3, 2}};   // replicas, batch
    for (const auto& [replicas, batch] : cases) {
        CAPTURE(graphs, replicas, batch);
        const RandomBatches<SmallResNet> data(6 * batch, 23);
        SmallResNet one{Device::cuda(0), 2};
        const auto expected = queued_steps(one, data, batch);
        DataParallel<SmallResNet, Threaded> dp{shared_gpu(replicas), 2};
        const auto got = queued_steps(dp, data, batch);
        CHECK(norm_relative(expected, got) < 1e-5);
        CHECK(norm_relative(one.statistics(), dp.statistics()) < 1e-5);
        CHECK(replicas_disagree(dp) == "");
        for (std::size_t r = 1; r < replicas; ++r) CHECK(differences(dp.replica(r).statistics(), dp.statistics()) == "");
        // Captured, cut at each sync point, replayed.
        if (batch > 2) CHECK(graphs_held(dp.replica(0)) == (graphs ? 2u : 0u));
    }
}

TEST_CASE("Reproducible mode with BatchNorm on GPUs: replicas sharing one GPU give one replica's bits, statistics included",
          "[cuda][same-gpu][reproducible][batchnorm]")
{
    REQUIRE_GPU();
    const bool graphs = GENERATE(false, true);
    const OptionScope graphs_scope{&cuda::Options::graphs, graphs};
    CAPTURE(graphs);
    const RandomBatches<SmallResNet> data(100, 4);
    SmallResNet one{Device::cuda(0), 1};
    const auto expected = five_steps(one, data, 7);
    const auto stats = one.statistics();
    for (std::size_t n : {2, 3}) {
        CAPTURE(n);
        DataParallel<SmallResNet, Threaded> dp{shared_gpu(n), 1};
        CHECK(differences(five_steps(dp, data, 7), expected) == "");
        for (std::size_t r = 0; r < n; ++r) CHECK(differences(dp.replica(r).statistics(), stats) == "");
    }
    // The CPU's reproducible run: the same function, another backend's float rounding.
    SmallResNet cpu{Device::cpu(), 1};
    CHECK(norm_relative(five_steps(cpu, data, 7), expected) < 1e-4);
    CHECK(norm_relative(cpu.statistics(), stats) < 1e-4);
}

TEST_CASE("BatchNorm inside Concat branches on the GPU: replicas sharing one GPU train as one GPU", "[cuda][same-gpu][batchnorm]")
{
    REQUIRE_GPU();
    const RandomBatches<ConcatBatchNormNet> data(42, 8);
    ConcatBatchNormNet one{Device::cuda(0), 3};
    const auto expected = queued_steps(one, data, 7);
    DataParallel<ConcatBatchNormNet, Threaded> dp{shared_gpu(3), 3};
    CHECK(norm_relative(expected, queued_steps(dp, data, 7)) < 1e-5);
    CHECK(norm_relative(one.statistics(), dp.statistics()) < 1e-5);
    ConcatBatchNormNet cpu{Device::cpu(), 3};
    CHECK(norm_relative(queued_steps(cpu, data, 7), expected) < 1e-4);
}

TEST_CASE("BatchNorm and Residual on the GPU against PyTorch: 3 SGD steps, running estimates, evaluation",
          "[cuda][batchnorm][pytorch]")
{
    REQUIRE_GPU();
    // The CPU test's fixture and tolerances (test_normalization.cpp); the GPU sums in other orders,
    // well inside them.
    const auto f = read_fixture("resnet.txt");
    TorchResNet net{Device::cuda(0)};
    const auto losses = train_resnet_fixture(net, f);
    std::vector<float> eval(6 * 5);
    net.predict(to_float(f.at("inputs")).data(), 6, eval.data());
    const double eloss = max_error(losses, f.at("losses")), ew = max_error(parameters(net), f.at("final")),
                 es = max_error(net.statistics(), f.at("statistics")), ee = max_error(eval, f.at("eval_y"));
    CAPTURE(eloss, ew, es, ee);
    CHECK(eloss < 1e-5);
    CHECK(ew < 1e-4);
    CHECK(es < 1e-4);
    CHECK(ee < 1e-4);
}

// BatchNorm's options (test_normalization.cpp on the CPU): eps and momentum without affine, cumulative
// averaging (the batch count read in the kernels that move the estimates, so a replayed graph reads
// its own step's), no running statistics.
template <BatchNormOptions O>
void batch_norm_options_on_gpu()
{
    using Net = BatchNormOptionsNet<O>;
    const std::size_t batch = 6;
    const RandomBatches<Net> data(6 * batch, 21);
    Net cpu{Device::cpu(), 4}, gpu{Device::cuda(0), 4};
    const auto a = queued_steps(cpu, data, batch), b = queued_steps(gpu, data, batch);
    CAPTURE(norm_relative(a, b));
    CHECK(norm_relative(a, b) < 1e-4);
    if constexpr (Net::statistics_count > 0) CHECK(norm_relative(cpu.statistics(), gpu.statistics()) < 1e-4);
    std::vector<float> pa(batch * 5), pb(batch * 5);
    cpu.predict(data.inputs.data(), batch, pa.data());
    gpu.predict(data.inputs.data(), batch, pb.data());
    CHECK(norm_relative(pa, pb) < 1e-4);
    for (const bool graphs : {false, true}) {
        const OptionScope graphs_scope{&cuda::Options::graphs, graphs};
        CAPTURE(graphs);
        Net one{Device::cuda(0), 4};
        DataParallel<Net, Threaded> dp{shared_gpu(3), 4};
        CHECK(norm_relative(queued_steps(one, data, batch), queued_steps(dp, data, batch)) < 1e-5);
        if constexpr (Net::statistics_count > 0) {   // untracked: none to compare (norm_relative of nothing is NaN)
            CHECK(norm_relative(one.statistics(), dp.statistics()) < 1e-5);
            CHECK(norm_relative(one.statistics(), gpu.statistics()) < 1e-5);
        }
    }
    const RandomBatches<Net> shard_data(100, 4);
    Net shards{Device::cuda(0), 1};
    DataParallel<Net, Threaded> three{shared_gpu(3), 1};
    CHECK(differences(five_steps(shards, shard_data, 7), five_steps(three, shard_data, 7)) == "");
    CHECK(differences(shards.statistics(), three.statistics()) == "");
}

TEST_CASE("BatchNorm's options on the GPU: as on the CPU, replicas sharing one GPU, CUDA graphs, the reproducible mode",
          "[cuda][same-gpu][batchnorm]")
{
    REQUIRE_GPU();
    batch_norm_options_on_gpu<kNonAffine>();
    batch_norm_options_on_gpu<kCumulative>();
    batch_norm_options_on_gpu<kUntracked>();
}

TEST_CASE("ClipGradNorm on the GPU clips as on the CPU", "[cuda][optim][clip]")
{
    REQUIRE_GPU();
    const RandomBatches<FusedMlpNet> data(9, 3);
    FusedMlpNet cpu{Device::cpu(), 1}, gpu{Device::cuda(0), 1}, free{Device::cuda(0), 1};
    const auto w0 = parameters(gpu);
    auto step_norm = [&](const std::vector<float>& w) {
        double s = 0.0;
        for (std::size_t i = 0; i < w0.size(); ++i) s += (double(w0[i]) - w[i]) * (double(w0[i]) - w[i]);
        return std::sqrt(s);
    };
    SGD plain{{.lr = 1.0f}};
    train_step(free, plain, data.batch(0, 9, 0));
    const double bound = step_norm(parameters(free)) / 4;   // SGD at lr 1: the step is the gradient
    REQUIRE(bound > 1e-4);
    ClipGradNorm a{SGD{{.lr = 1.0f}}, float(bound)}, b{SGD{{.lr = 1.0f}}, float(bound)};
    train_step(cpu, a, data.batch(0, 9, 0));
    train_step(gpu, b, data.batch(0, 9, 0));
    CHECK(step_norm(parameters(gpu)) == Approx(bound).epsilon(1e-3));
    CHECK(norm_relative(parameters(cpu), parameters(gpu)) < 1e-5);
}

TEST_CASE("LossScale on the GPU skips an overflow with nothing changed, and otherwise updates as on the CPU",
          "[cuda][optim][loss_scale]")
{
    REQUIRE_GPU();
    const RandomBatches<FusedMlpNet> data(18, 3);
    RandomBatches<FusedMlpNet> loud(18, 3);
    for (float& v : loud.inputs) v *= 100.0f;   // with a scale of 2^127, the gradient overflows
    FusedMlpNet cpu{Device::cpu(), 1}, gpu{Device::cuda(0), 1};
    LossScale a{Adam{{.lr = 0.01f}}, {.init_scale = 1024.0f}}, b{Adam{{.lr = 0.01f}}, {.init_scale = 1024.0f}};
    train_step(cpu, a, data.batch(0, 9, 0));
    train_step(gpu, b, data.batch(0, 9, 0));
    CHECK(!b.skipped_last());
    const auto w = parameters(gpu);
    const auto state = gpu.optimizer_state();
    b.set_scale_state({.scale = 0x1p127f});
    const auto next = data.batch(9, 9, 9);
    train_step(gpu, b, loud.batch(9, 9, 9), {}, &next);   // the fast mode: the next step is queued ahead
    CHECK(b.skipped_last());
    CHECK(b.scale() == 0x1p126f);
    CHECK(b.wrapped().step_count() == 1);
    CHECK(parameters(gpu) == w);
    CHECK(gpu.optimizer_state() == state);
    b.set_scale_state({.scale = 1024.0f});   // the step queued ahead at 2^126 is computed again at 1024
    train_step(gpu, b, next);
    train_step(cpu, a, next);
    CHECK(!b.skipped_last());
    CHECK(b.wrapped().step_count() == 2);
    CHECK(norm_relative(parameters(cpu), parameters(gpu)) < 1e-4);
}

// ---- convolutions without bias (issue 22) ----

TEST_CASE("Convolutions without bias equal the CPU's through cuDNN and the products, alone and with a fused ReLU",
          "[cuda][bias]")
{
    REQUIRE_GPU();
    // cuDNN's algorithms; both passes as products; each pass alone as products beside cuDNN's other.
    const auto path = GENERATE(cuda::ConvPath::cudnn, cuda::ConvPath::gemm, cuda::ConvPath::gemm_forward,
                               cuda::ConvPath::gemm_backward);
    CAPTURE(int(path));
    const OptionScope forced{&cuda::Options::conv_path, path};
    static_assert(!cuda::detail::direct_conv<core::Window{4, 17, 17, 5, 5, 2, 2, 2, 2, 9, 9}>);   // not our kernels'
    static_assert(!cuda::detail::direct_conv<core::Window{12, 10, 9, 3, 3, 2, 2, 1, 1, 5, 5}>);
    static_assert(!cuda::detail::direct_conv<core::Window{5, 1, 40, 1, 7, 1, 1, 0, 0, 1, 34}>);
    same_on_cpu_and_gpu<Conv2d<6, 5, 2, 2, Bias::none>, Shape<4, 17, 17>>();
    same_on_cpu_and_gpu<Sequential<Conv2d<6, 5, 2, 2, Bias::none>, ReLU>, Shape<4, 17, 17>>();
    same_on_cpu_and_gpu<Conv2d<5, 3, 2, 1, Bias::none>, Shape<12, 10, 9>>(4);      // odd sizes
    same_on_cpu_and_gpu<Sequential<Conv2d<5, 3, 2, 1, Bias::none>, ReLU>, Shape<12, 10, 9>>(4);
    same_on_cpu_and_gpu<Conv2d<16, 1, 1, 0, Bias::none>, Shape<40, 7, 7>>(5);     // 1 x 1, as a ResNet's projection
    same_on_cpu_and_gpu<Conv1d<8, 7, 1, 0, Bias::none>, Shape<5, 40>>();
    same_on_cpu_and_gpu<Sequential<Conv1d<8, 7, 1, 0, Bias::none>, ReLU>, Shape<5, 40>>();
}

TEST_CASE("Convolutions without bias equal the CPU's through our direct kernels, and transposed ones through cuDNN",
          "[cuda][bias]")
{
    REQUIRE_GPU();
    // Our forward and filter-gradient kernels (few weights per filter), alone and with a fused ReLU.
    static_assert(cuda::detail::direct_conv<core::Window{3, 12, 10, 3, 3, 1, 1, 1, 1, 12, 10}> &&
                  cuda::detail::direct_conv<core::Window{3, 1, 21, 1, 3, 1, 2, 0, 1, 1, 11}>);
    same_on_cpu_and_gpu<Conv2d<8, 3, 1, 1, Bias::none>, Shape<3, 12, 10>>();
    same_on_cpu_and_gpu<Sequential<Conv2d<8, 3, 1, 1, Bias::none>, ReLU>, Shape<3, 12, 10>>();
    same_on_cpu_and_gpu<Sequential<Conv2d<7, 3, 1, 1, Bias::none>, ReLU>, Shape<2, 9, 9>>(300);   // more samples than parts
    same_on_cpu_and_gpu<Conv1d<4, 3, 2, 1, Bias::none>, Shape<3, 21>>();
    same_on_cpu_and_gpu<Sequential<Conv1d<4, 3, 2, 1, Bias::none>, ReLU>, Shape<3, 21>>();
    // Filters beyond the direct forward's shared memory (448 x 28 floats): cuDNN's forward, our
    // filter gradient.
    static_assert(cuda::detail::direct_conv<core::Window{3, 6, 6, 3, 3, 1, 1, 1, 1, 6, 6}> && 448 * 28 * 4 > 48 * 1024);
    same_on_cpu_and_gpu<Conv2d<448, 3, 1, 1, Bias::none>, Shape<3, 6, 6>>(2);
    same_on_cpu_and_gpu<Sequential<Conv2d<448, 3, 1, 1, Bias::none>, ReLU>, Shape<3, 6, 6>>(2);
    // Transposed: cuDNN's backward-data forward, no bias pass.
    same_on_cpu_and_gpu<ConvTranspose2d<5, 4, 2, 1, Bias::none>, Shape<6, 8, 8>>();
    same_on_cpu_and_gpu<ConvTranspose2d<3, 3, 1, 0, Bias::none>, Shape<4, 5, 7>>();
}

TEST_CASE("A network of convolutions without bias trains the same on CPU and GPU", "[cuda][bias]")
{
    REQUIRE_GPU();
    using Net = Sequential<Input<3, 12, 12>, Conv2d<8, 3, 1, 1, Bias::none>, ReLU, Conv2d<16, 3, 2, 1, Bias::none>, ReLU,
                           Conv2d<16, 1, 1, 0, Bias::none>, GlobalAvgPool, Linear<5>>;
    static_assert(Net::param_count == 8 * 3 * 9 + 16 * 8 * 9 + 16 * 16 + 16 * 5 + 5);
    trains_the_same_on_cpu_and_gpu<Net>(8);
}

// ---- activations (issue 22) ----

TEST_CASE("CUDA activations equal CPU activations: Identity, Sigmoid, Tanh, GELU", "[cuda]")
{
    REQUIRE_GPU();
    // 360 values (whole float4s) and 51 (a scalar tail after the float4s).
    same_on_cpu_and_gpu<Identity, Shape<4, 5, 6>>();
    same_on_cpu_and_gpu<Sigmoid, Shape<4, 5, 6>>();
    same_on_cpu_and_gpu<Sigmoid, Shape<17>>();
    same_on_cpu_and_gpu<Tanh, Shape<4, 5, 6>>();
    same_on_cpu_and_gpu<Tanh, Shape<17>>();
    same_on_cpu_and_gpu<GELU, Shape<4, 5, 6>>();
    same_on_cpu_and_gpu<GELU, Shape<17>>();
}

TEST_CASE("CUDA activations equal PyTorch's forward and input gradient", "[cuda]")
{
    REQUIRE_GPU();
    const auto f = read_fixture("activations.txt");
    const std::vector<float> x = to_float(f.at("x")), dy = to_float(f.at("dy"));
    using In = Shape<41>;
    cuda::Context ctx{Device::cuda(0)};
    auto check = [&]<class L>(L, const std::string& name) {
        INFO(name);
        typename L::template op<In> op{model::Build{.layer_id = 0, .devices = {}}};
        auto x_d = ctx.template allocate<float>(41), dy_d = ctx.template allocate<float>(41);
        auto y_d = ctx.template allocate<float>(41), dx_d = ctx.template allocate<float>(41);
        ctx.upload(x_d.data(), x.data(), 41);
        ctx.upload(dy_d.data(), dy.data(), 41);
        op.forward(ctx, model::Pass{}, model::ForwardArgs<>{nullptr, nullptr, x_d.data(), y_d.data(), 1, nullptr, nullptr, nullptr});
        op.backward(ctx, model::Pass{}, model::BackwardArgs<>{nullptr, nullptr, x_d.data(), y_d.data(), dy_d.data(), dx_d.data(),
                                                            nullptr, 1, nullptr, nullptr, nullptr});
        std::vector<float> y(41), dx(41);
        ctx.download(y.data(), y_d.data(), 41);
        ctx.download(dx.data(), dx_d.data(), 41);
        ctx.synchronize();
        // CUDA's expf, tanhf and erff are within 2 ulp; values are of magnitude <= 5.
        CHECK(max_error(y, f.at(name + "_y")) < 4e-6);
        CHECK(max_error(dx, f.at(name + "_dx")) < 4e-6);
    };
    check(Identity{}, "identity");
    check(Sigmoid{}, "sigmoid");
    check(Tanh{}, "tanh");
    check(GELU{}, "gelu");
}

TEST_CASE("Adam and AdamW on a GPU equal PyTorch's after 5 steps, and the CPU's", "[cuda]")
{
    REQUIRE_GPU();
    for (const std::string kind : {"adam", "adamw"}) {
        INFO(kind);
        const auto f = read_fixture(kind + ".txt");
        auto run = [&](Device d) {
            TorchNet net{d};
            std::vector<float> losses;
            if (kind == "adam") {
                auto opt = fixture_optimizer<Adam>(f.at("hyper"));
                losses = train_fixture(net, opt, f);
            } else {
                auto opt = fixture_optimizer<AdamW>(f.at("hyper"));
                losses = train_fixture(net, opt, f);
            }
            CHECK(max_error(losses, f.at("losses")) < kTorchTolerance);
            return parameters(net);
        };
        const auto gpu = run(Device::cuda(0));
        CHECK(max_error(gpu, f.at("final")) < kTorchTolerance);
        const auto cpu = run(Device::cpu());
        CHECK(max_error(gpu, std::vector<double>(cpu.begin(), cpu.end())) < kTorchTolerance);
    }
}

namespace {
// A rule that keeps neighbouring layers apart (each layer's rate its own), so that a deep stack of
// Linear layers has a segment for every weight and bias: more than one launch's batch of segments.
struct EveryLayerItsRate {
    static constexpr Treatment treat(ParamKind kind, std::uint32_t layer)
    {
        return {.decay = kind == ParamKind::weight ? 1.0f : 0.0f, .lr_scale = 1.0f + 0.25f * float(layer % 3)};
    }
};
template <std::size_t... I>
auto linear_stack(std::index_sequence<I...>)
    -> Sequential<ParamRule<EveryLayerItsRate>, Input<4>, std::conditional_t<(I < sizeof...(I)), Linear<4>, void>...>;
using LinearStack = decltype(linear_stack(std::make_index_sequence<70>{}));
static_assert(LinearStack::update_plan::segment_count == 140);
} // namespace

TEST_CASE("Parameter rules on the GPU: PyTorch's param_groups, replicas sharing the GPU, CUDA graphs, many segments",
          "[cuda][optim][param-rules]")
{
    REQUIRE_GPU();
    const auto f = read_fixture("param_groups.txt");
    {
        GroupNet gpu{Device::cuda(0)}, cpu{Device::cpu()};
        const std::vector<float> losses = train_groups(gpu, f);
        CHECK(max_error(losses, f.at("losses")) < kTorchTolerance);
        CHECK(max_error(gpu.parameters(), f.at("final")) < kTorchTolerance);
        CHECK(max_error(gpu.statistics(), f.at("statistics")) < kTorchTolerance);
        train_groups(cpu, f);
        const std::vector<float> c = cpu.parameters(), g = gpu.parameters();
        CHECK(std::equal(g.begin(), g.begin() + 80, c.begin()));   // frozen: the initial values on both
        CHECK(gpu.optimizer_state().size() == 2 * GroupNet::trainable_count);
    }
    for (bool graphs : {false, true}) {
        INFO("CUDA graphs " << graphs);
        const OptionScope graphs_scope{&cuda::Options::graphs, graphs};
        GroupNet one{Device::cuda(0)};
        DataParallel<GroupNet, Threaded> two{shared_gpu(2)};
        train_groups(one, f);
        train_groups(two, f);
        CHECK(two.reduced_floats() == GroupNet::trainable_count);
        // Two replicas' sums in another order, and cuDNN's algorithms timed afresh in each model: AdamW
        // turns the small gradient differences of parameters near a stationary point into steps of up
        // to 1e-4 of their size.
        CHECK(max_relative_difference(one.parameters(), two.parameters()) < 1e-4);
    }
    // 140 segments: two launches of the update, each parameter with its own segment's decay and rate.
    const RandomBatches<LinearStack> data(16, 5);
    auto run = [&](Device d) {
        LinearStack net{d};
        SGD opt{{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.1f}};
        for (int s = 0; s < 3; ++s) train_step(net, opt, data.batch(0, 16, 0));
        return net.parameters();
    };
    CHECK(max_relative_difference(run(Device::cpu()), run(Device::cuda(0))) < 1e-5);
}

TEST_CASE("bf16 models on the GPU: close to the CPU's bf16 run, replicas sharing the GPU as one, the reproducible "
          "mode bit for bit, CUDA graphs on and off",
          "[cuda][same-gpu][precision]")
{
    REQUIRE_GPU();
    const bool graphs = GENERATE(false, true);
    const OptionScope graphs_scope{&cuda::Options::graphs, graphs};
    CAPTURE(graphs);
    using Net = with_precision<SmallResNet, bf16>;
    const RandomBatches<Net> data(100, 4);
    // The CPU rounds where the GPU stores: the two runs differ by the products' summation order and
    // its effect on later roundings (one bf16 ulp is 2^-8 of a value).
    Net gpu{Device::cuda(0), 1}, cpu{Device::cpu(), 1};
    const auto on_gpu = five_steps(gpu, data, 7, StepOptions{});
    CHECK(norm_relative(five_steps(cpu, data, 7, StepOptions{}), on_gpu) < 2e-2);
    CHECK(norm_relative(cpu.statistics(), gpu.statistics()) < 2e-2);
    for (std::size_t n : {2, 3}) {
        CAPTURE(n);
        DataParallel<Net, Threaded> dp{shared_gpu(n), 1};
        CHECK(norm_relative(five_steps(dp, data, 7, StepOptions{}), on_gpu) < 2e-2);
        CHECK(replicas_disagree(dp) == "");
    }
    Net one{Device::cuda(0), 1};
    const auto exact = five_steps(one, data, 7);
    for (std::size_t n : {2, 3}) {
        CAPTURE(n);
        DataParallel<Net, Threaded> dp{shared_gpu(n), 1};
        CHECK(differences(five_steps(dp, data, 7), exact) == "");
        CHECK(differences(dp.statistics(), one.statistics()) == "");
    }
}

TEST_CASE("A bf16 LeNet with a nested DataParallel on replicas sharing the GPU trains as the plain bf16 model",
          "[cuda][same-gpu][precision]")
{
    REQUIRE_GPU();
    using Nested = with_precision<SmallAlexNet<Threaded>, bf16>;
    using Plain = with_precision<SmallAlexNetPlain, bf16>;
    const RandomBatches<Plain> data(100, 3);
    Nested nested{shared_gpu(2), 5};
    Plain plain{Device::cuda(0), 5};
    plain.set_parameters(parameters(nested));
    CHECK(norm_relative(five_steps(nested, data, 7, StepOptions{}), five_steps(plain, data, 7, StepOptions{})) < 2e-2);
}

namespace {
// Conv1d, its pooling and Flatten before a fully connected layer, as TextCNN's.
using SmallTextNet = Sequential<Input<6, 40>, Conv1d<8, 7>, ReLU, MaxPool1d<3>, Conv1d<8, 3>, ReLU, Flatten, Dropout<0.5>,
                                Linear<16>, ReLU, Linear<5>>;

// 5 steps of a bf16 Net on GPU 0 with its activations channels-last or not; its parameters, then
// predict's outputs for the data's first 8 samples.
template <class Net>
std::pair<std::vector<float>, std::vector<float>> bf16_run(bool channels_last)
{
    const OptionScope layout{&cuda::Options::channels_last, channels_last};
    using M = with_precision<Net, bf16>;
    const RandomBatches<M> data(100, 4);
    M net{Device::cuda(0), 3};
    auto params = five_steps(net, data, 7, StepOptions{});
    std::vector<float> out(8 * M::output_shape::size);
    net.predict(data.inputs.data(), 8, out.data());
    return {params, out};
}
// differ: the network has a convolution on cuDNN's channels-last kernels (input channels a multiple
// of 8), whose sums run in another order than channels-first's, so the bits must differ (a test of
// nothing would give the same); elsewhere every pass gives the same float either way.
template <class Net>
void layouts_agree(bool differ)
{
    const auto [first_params, first_out] = bf16_run<Net>(false);
    const auto [last_params, last_out] = bf16_run<Net>(true);
    CHECK(norm_relative(last_params, first_params) < 2e-2);
    CHECK(norm_relative(last_out, first_out) < 2e-2);
    CHECK((differences(last_params, first_params) != "") == differ);
}
// A residual network whose convolutions all run channels-last (8 and 16 channels).
using WideResNet = Sequential<Input<8, 8, 8>, Conv2d<16, 3, 1, 1, Bias::none>, BatchNorm2d, ReLU,
                              Residual<Sequential<Conv2d<16, 3, 1, 1, Bias::none>, BatchNorm2d, ReLU, Conv2d<16, 3, 1, 1, Bias::none>,
                                                  BatchNorm2d>>,
                              ReLU, MaxPool2d<2>, GlobalAvgPool, Linear<5>>;
} // namespace

TEST_CASE("bf16 models train alike on channels-last and channels-first activations", "[cuda][precision]")
{
    REQUIRE_GPU();
    SECTION("convolutions, BatchNorm, residual blocks, pooling, global average") { layouts_agree<WideResNet>(true); }
    SECTION("the same, every convolution detoured (2, 4 and 6 channels): the model stays channels-first")
    {
        layouts_agree<SmallResNet>(false);
    }
    SECTION("biases, max pooling, Flatten, dropout") { layouts_agree<SmallAlexNetPlain>(true); }
    SECTION("Concat, dropout over channels") { layouts_agree<ConcatDropoutNet>(true); }
    SECTION("transposed convolutions, a loss over pixels, image outputs") { layouts_agree<SmallFCN>(true); }
    SECTION("one-dimensional convolutions and pooling") { layouts_agree<SmallTextNet>(true); }
    SECTION("LeNet, every convolution detoured") { layouts_agree<LeNet>(false); }
}

TEST_CASE("A bf16 model none of whose convolutions runs channels-last keeps channels-first activations",
          "[cuda][precision]")
{
    REQUIRE_GPU();
    const OptionScope layout{&cuda::Options::channels_last, true};
    const auto last = [](const auto& m) { return std::get<cuda::Context>(m.context()).keeps_channels_last(); };
    // Every convolution would detour (input channels not a multiple of 8 over small inputs).
    static_assert(LeNet::keeps_channels_first && SmallResNet::keeps_channels_first);
    // A first layer detours, the next ones run channels-last; a nested DataParallel keeps the option's layout.
    static_assert(!SmallAlexNetPlain::keeps_channels_first && !WideResNet::keeps_channels_first);
    static_assert(!SmallAlexNet<Threaded>::keeps_channels_first);
    with_precision<LeNet, bf16> lenet{Device::cuda(0), 1};
    with_precision<SmallResNet, bf16> small{Device::cuda(0), 1};
    with_precision<WideResNet, bf16> wide{Device::cuda(0), 1};
    with_precision<SmallAlexNetPlain, bf16> alex{Device::cuda(0), 1};
    CHECK_FALSE(last(lenet));
    CHECK_FALSE(last(small));
    CHECK(last(wide));
    CHECK(last(alex));
    // LeNet's bf16 activations then need no detour buffers: at most 0.55 of fp32's (issue 23), where
    // channels-last's detours took 0.64.
    LeNet fp32{Device::cuda(0), 1};
    const RandomBatches<LeNet> data(64, 1);
    SGD opt{{.lr = 0.05f}};
    train_step(fp32, opt, data.batch(0, 64, 0));
    train_step(lenet, opt, data.batch(0, 64, 0));
    CHECK(double(lenet.activation_bytes()) <= 0.55 * double(fp32.activation_bytes()));
}
