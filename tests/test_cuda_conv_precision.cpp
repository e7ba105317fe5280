// The CUDA convolutions and fully connected layers in bf16 and fp16 (backend/cuda/conv.hpp, conv/,
// linear.hpp) against the CPU's float functions on the same inputs, rounded to the format first.
// Built as CUDA (nvcc) only; the [cuda] cases skip on a machine without a GPU, the [cuda-host] ones
// (plan keys and scratch sizes) run anywhere.
//
// Tolerances, as max |gpu - cpu| over max |cpu| of each result (relative_error):
// - outputs and input gradients stored in T (y, dx): the GPU computes in FP32 and rounds each value
//   once (half an ulp: 2^-9 for bf16, 2^-11 for fp16), where a library's epilogue is not available
//   twice; the sums run in another order than the CPU's. bf16 1e-2, fp16 2e-3.
// - filter gradients: cuDNN's comes out in T (one rounding, then widened), the products' in FP32:
//   the same tolerance as the outputs.
// - bias gradients: float sums of the same T values in another order: 1e-4.

#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "catch.hpp"
#include "cuda_support.hpp"
#include "replica/backend/cpu/conv.hpp"
#include "replica/backend/cpu/linear.hpp"
#include "replica/backend/cuda/conv.hpp"
#include "replica/backend/cuda/linear.hpp"
#include "replica/replica.hpp"

using namespace replica;
using namespace replica::testing;
namespace cuda = replica::backend::cuda;
namespace cpu = replica::backend::cpu;

namespace {

template <class T>
constexpr double tolerance = std::same_as<T, core::bf16> ? 1e-2 : 2e-3;
constexpr double bias_tolerance = 1e-4;

// n values in [-scale, scale], each rounded through T (what a T buffer of them holds).
template <class T>
std::vector<float> rounded(std::size_t n, std::uint64_t seed, float scale = 1.0f)
{
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) {
        const float u = core::random_uniform(seed, core::Stream::synthetic, 11, i / 65536, std::uint32_t(i % 65536));
        v[i] = core::round_through<T>(scale * (2.0f * u - 1.0f));
    }
    return v;
}

// Device memory of T holding `values` (each representable in T), one element more than asked for.
template <class T>
core::Buffer<T> upload(const cuda::Context& ctx, const std::vector<float>& values, std::size_t size = 0)
{
    auto b = ctx.allocate<T>(std::max(size, values.size()) + 1);
    std::vector<T> host(values.size());
    for (std::size_t i = 0; i < values.size(); ++i) host[i] = core::from_float<T>(values[i]);
    ctx.upload(b.data(), host.data(), host.size());
    return b;
}

template <class T>
std::vector<float> download(const cuda::Context& ctx, const T* d, std::size_t n)
{
    std::vector<T> host(n);
    ctx.download(host.data(), d, n);
    ctx.synchronize();
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = core::to_float(host[i]);
    return v;
}

struct Results {
    std::vector<float> y, dx, dw, db;
};

void check_close(const Results& cpu_r, const Results& gpu_r, double t)
{
    CHECK(relative_error(cpu_r.y, gpu_r.y) < t);
    CHECK(relative_error(cpu_r.dx, gpu_r.dx) < t);
    CHECK(relative_error(cpu_r.dw, gpu_r.dw) < t);
    if (!cpu_r.db.empty()) CHECK(relative_error(cpu_r.db, gpu_r.db) < bias_tolerance);
}

// A convolution of window g with `cout` filters over n samples, forward and backward (with the ReLU
// after it fused where relu; a bias where bias), in T on the GPU (the context's ConvPath) and in float
// on the CPU from the same rounded x, w, dy; the CPU's ReLU rule reads the GPU's output, so that both
// take the same gradient mask. last: on channels-last activations, compared transposed. accumulate:
// the input gradient is added to dx's values (the same rounded ones on both).
template <core::Window g, class T>
void conv_matches_cpu(int cout, std::size_t n, bool bias, bool relu, bool last = false, bool accumulate = false)
{
    CAPTURE(g.c, g.h, g.w, g.kh, g.kw, cout, n, bias, relu, last, accumulate, core::storage_name<T>);
    const std::size_t xs = n * g.c * g.h * g.w, ys = n * std::size_t(cout) * g.oh * g.ow,
                      ws = std::size_t(cout) * g.c * g.kh * g.kw;
    const auto x = rounded<T>(xs, 1), w = rounded<T>(ws, 2, 1.0f / std::sqrt(float(g.c * g.kh * g.kw))),
               dy = rounded<T>(ys, 4);
    const auto b = rounded<float>(std::size_t(cout), 3);

    cuda::Context gpu = gpu_context(last);
    const std::size_t in_pixels = std::size_t(g.h) * g.w, out_pixels = std::size_t(g.oh) * g.ow;
    auto x_d = upload<T>(gpu, last ? to_channels_last(x, n, g.c, in_pixels) : x), w_d = upload<T>(gpu, w),
         dy_d = upload<T>(gpu, last ? to_channels_last(dy, n, std::size_t(cout), out_pixels) : dy);
    auto b_d = upload<float>(gpu, b);
    const auto dx0 = accumulate ? rounded<T>(xs, 9) : std::vector<float>(xs, 0.0f);
    auto y_d = gpu.allocate<T>(ys + 1), dz_d = gpu.allocate<T>(ys + 1),
         dx_d = upload<T>(gpu, last ? to_channels_last(dx0, n, g.c, in_pixels) : dx0);
    auto dw_d = gpu.allocate<float>(ws + 1), db_d = gpu.allocate<float>(std::size_t(cout) + 1);
    auto scratch = gpu.allocate<float>(cuda::conv_scratch_size<g, T>(gpu, cout, n) + 1);
    const float* bp = bias ? b_d.data() : nullptr;
    float* dbp = bias ? db_d.data() : nullptr;
    cuda::conv_forward<g>(gpu, cout, w_d.data(), bp, x_d.data(), y_d.data(), n, scratch.data(), relu);
    if (relu)
        cuda::conv_backward_relu<g>(gpu, cout, w_d.data(), x_d.data(), y_d.data(), dy_d.data(), dz_d.data(), dx_d.data(),
                                    dw_d.data(), dbp, n, scratch.data(), accumulate);
    else
        cuda::conv_backward<g>(gpu, cout, w_d.data(), x_d.data(), dy_d.data(), dx_d.data(), dw_d.data(), dbp, n, scratch.data(),
                               accumulate);
    const auto y_got = download(gpu, y_d.data(), ys), dx_got = download(gpu, dx_d.data(), xs);
    Results on_gpu{last ? to_channels_first(y_got, n, std::size_t(cout), out_pixels) : y_got,
                   last ? to_channels_first(dx_got, n, g.c, in_pixels) : dx_got, download(gpu, dw_d.data(), ws),
                   bias ? download(gpu, db_d.data(), std::size_t(cout)) : std::vector<float>{}};

    cpu::Context host;
    std::vector<float> cpu_scratch(cpu::conv_scratch_size<g>(host, cout, n) + 1), dz(ys);
    Results on_cpu{std::vector<float>(ys), dx0, std::vector<float>(ws), std::vector<float>(bias ? std::size_t(cout) : 0)};
    cpu::conv_forward<g>(host, cout, w.data(), bias ? b.data() : nullptr, x.data(), on_cpu.y.data(), n, cpu_scratch.data(), relu);
    float* cpu_db = bias ? on_cpu.db.data() : nullptr;
    if (relu)
        cpu::conv_backward_relu<g>(host, cout, w.data(), x.data(), on_gpu.y.data(), dy.data(), dz.data(), on_cpu.dx.data(),
                                   on_cpu.dw.data(), cpu_db, n, cpu_scratch.data(), accumulate);
    else
        cpu::conv_backward<g>(host, cout, w.data(), x.data(), dy.data(), on_cpu.dx.data(), on_cpu.dw.data(), cpu_db, n,
                              cpu_scratch.data(), accumulate);
    check_close(on_cpu, on_gpu, tolerance<T>);
}

// Every combination of bias and fused ReLU, and the input gradient added to dx (with both).
template <core::Window g, class T>
void conv_matches_cpu_all(int cout, std::size_t n, bool last = false)
{
    for (const bool bias : {true, false})
        for (const bool relu : {false, true}) conv_matches_cpu<g, T>(cout, n, bias, relu, last);
    conv_matches_cpu<g, T>(cout, n, true, true, last, true);
}

// A transposed convolution (window g maps its output, g.c channels, to its input, c channels).
// last: on channels-last activations, compared transposed.
template <core::Window g, class T>
void conv_transpose_matches_cpu(int c, std::size_t n, bool bias, bool last = false)
{
    CAPTURE(g.c, g.h, g.w, c, n, bias, last, core::storage_name<T>);
    const std::size_t xs = n * std::size_t(c) * g.oh * g.ow, ys = n * g.c * g.h * g.w, ws = std::size_t(c) * g.c * g.kh * g.kw;
    const auto x = rounded<T>(xs, 5), w = rounded<T>(ws, 6, 0.5f), dy = rounded<T>(ys, 7);
    const auto b = rounded<float>(std::size_t(g.c), 8);

    cuda::Context gpu = gpu_context(last);
    const auto in_layout = [&](const std::vector<float>& v, std::size_t ch, std::size_t pixels) {
        return last ? to_channels_last(v, n, ch, pixels) : v;
    };
    const auto out_of_layout = [&](const std::vector<float>& v, std::size_t ch, std::size_t pixels) {
        return last ? to_channels_first(v, n, ch, pixels) : v;
    };
    const std::size_t in_pixels = std::size_t(g.oh) * g.ow, out_pixels = std::size_t(g.h) * g.w;
    auto x_d = upload<T>(gpu, in_layout(x, std::size_t(c), in_pixels)), w_d = upload<T>(gpu, w),
         dy_d = upload<T>(gpu, in_layout(dy, g.c, out_pixels));
    auto b_d = upload<float>(gpu, b);
    auto y_d = gpu.allocate<T>(ys + 1), dx_d = gpu.allocate<T>(xs + 1);
    auto dw_d = gpu.allocate<float>(ws + 1), db_d = gpu.allocate<float>(std::size_t(g.c) + 1);
    auto scratch = gpu.allocate<float>(cuda::conv_transpose_scratch_size<g, T>(gpu, c, n) + 1);
    cuda::conv_transpose_forward<g>(gpu, c, w_d.data(), bias ? b_d.data() : nullptr, x_d.data(), y_d.data(), n, scratch.data());
    cuda::conv_transpose_backward<g>(gpu, c, w_d.data(), x_d.data(), dy_d.data(), dx_d.data(), dw_d.data(),
                                     bias ? db_d.data() : nullptr, n, scratch.data());
    const Results on_gpu{out_of_layout(download(gpu, y_d.data(), ys), g.c, out_pixels),
                         out_of_layout(download(gpu, dx_d.data(), xs), std::size_t(c), in_pixels), download(gpu, dw_d.data(), ws),
                         bias ? download(gpu, db_d.data(), std::size_t(g.c)) : std::vector<float>{}};

    cpu::Context host;
    std::vector<float> cpu_scratch(cpu::conv_transpose_scratch_size<g>(host, c, n) + 1);
    Results on_cpu{std::vector<float>(ys), std::vector<float>(xs), std::vector<float>(ws),
                   std::vector<float>(bias ? std::size_t(g.c) : 0)};
    cpu::conv_transpose_forward<g>(host, c, w.data(), bias ? b.data() : nullptr, x.data(), on_cpu.y.data(), n, cpu_scratch.data());
    cpu::conv_transpose_backward<g>(host, c, w.data(), x.data(), dy.data(), on_cpu.dx.data(), on_cpu.dw.data(),
                                    bias ? on_cpu.db.data() : nullptr, n, cpu_scratch.data());
    check_close(on_cpu, on_gpu, tolerance<T>);
}

// A fully connected layer in -> out over n samples, forward and backward (fused ReLU where relu; no
// bias where !bias: the CPU then adds zeros), its bias and bias gradient at `offset` floats past an
// aligned address (cuBLASLt's epilogues need 16 bytes; otherwise a copy of the bias and a GEMV).
template <class T>
void linear_matches_cpu(int in, int out, std::size_t n, bool bias, bool relu, std::size_t offset)
{
    CAPTURE(in, out, n, bias, relu, offset, core::storage_name<T>);
    const std::size_t xs = n * std::size_t(in), ys = n * std::size_t(out), ws = std::size_t(in) * std::size_t(out);
    const auto x = rounded<T>(xs, 9), w = rounded<T>(ws, 10, 1.0f / std::sqrt(float(in))), dy = rounded<T>(ys, 12);
    auto b = rounded<float>(std::size_t(out), 11);
    if (!bias) std::fill(b.begin(), b.end(), 0.0f);

    cuda::Context gpu{Device::cuda(0)};
    auto x_d = upload<T>(gpu, x), w_d = upload<T>(gpu, w), dy_d = upload<T>(gpu, dy);
    std::vector<float> shifted(offset, 0.0f);
    shifted.insert(shifted.end(), b.begin(), b.end());
    auto b_d = upload<float>(gpu, shifted);
    auto y_d = gpu.allocate<T>(ys + 1), dz_d = gpu.allocate<T>(ys + 1), dx_d = gpu.allocate<T>(xs + 1);
    auto dw_d = gpu.allocate<float>(ws + 1), db_d = gpu.allocate<float>(offset + std::size_t(out) + 1);
    const float* bp = bias ? b_d.data() + offset : nullptr;
    float* dbp = bias ? db_d.data() + offset : nullptr;
    cuda::linear_forward(gpu, in, out, w_d.data(), bp, x_d.data(), y_d.data(), n, relu);
    if (relu)
        cuda::linear_backward_relu(gpu, in, out, w_d.data(), x_d.data(), y_d.data(), dy_d.data(), dz_d.data(), dx_d.data(),
                                   dw_d.data(), dbp, n);
    else
        cuda::linear_backward(gpu, in, out, w_d.data(), x_d.data(), dy_d.data(), dx_d.data(), dw_d.data(), dbp, n);
    const Results on_gpu{download(gpu, y_d.data(), ys), download(gpu, dx_d.data(), xs), download(gpu, dw_d.data(), ws),
                         bias ? download(gpu, dbp, std::size_t(out)) : std::vector<float>{}};

    cpu::Context host;
    Results on_cpu{std::vector<float>(ys), std::vector<float>(xs), std::vector<float>(ws), std::vector<float>(std::size_t(out))};
    std::vector<float> dz(ys);
    cpu::linear_forward(host, in, out, w.data(), b.data(), x.data(), on_cpu.y.data(), n, relu);
    if (relu)
        cpu::linear_backward_relu(host, in, out, w.data(), x.data(), on_gpu.y.data(), dy.data(), dz.data(), on_cpu.dx.data(),
                                  on_cpu.dw.data(), on_cpu.db.data(), n);
    else
        cpu::linear_backward(host, in, out, w.data(), x.data(), dy.data(), on_cpu.dx.data(), on_cpu.dw.data(), on_cpu.db.data(), n);
    if (!bias) on_cpu.db.clear();
    check_close(on_cpu, on_gpu, tolerance<T>);
}

constexpr core::Window lenet1{1, 28, 28, 5, 5, 1, 1, 0, 0, 24, 24};        // our direct kernels
constexpr core::Window alexnet1{3, 64, 64, 11, 11, 4, 4, 2, 2, 15, 15};     // AlexNet's first layer, on 64 x 64
constexpr core::Window one_by_one{40, 7, 7, 1, 1, 1, 1, 0, 0, 7, 7};        // a ResNet projection's shape
constexpr core::Window conv1d{5, 1, 40, 1, 7, 1, 1, 0, 0, 1, 34};           // Conv1d<8, 7> over (5, 40)
constexpr core::Window odd{12, 10, 9, 3, 3, 2, 2, 1, 1, 5, 5};              // odd sizes, rows of 108
constexpr core::Window transposed{5, 16, 16, 4, 4, 2, 2, 1, 1, 8, 8};       // ConvTranspose2d<5, 4, 2, 1> over (6, 8, 8)

} // namespace

TEMPLATE_TEST_CASE("bf16 and fp16 convolutions equal the CPU's float ones on the same rounded inputs, by every path",
                   "[cuda][precision]", core::bf16, core::fp16)
{
    REQUIRE_GPU();
    static_assert(cuda::detail::direct_conv<lenet1> && !cuda::detail::direct_conv<alexnet1> &&
                  !cuda::detail::direct_conv<one_by_one> && !cuda::detail::direct_conv<conv1d> && !cuda::detail::direct_conv<odd>);
    // cuDNN's algorithms; both passes as products; each pass alone as products beside cuDNN's other.
    const auto path = GENERATE(cuda::ConvPath::cudnn, cuda::ConvPath::gemm, cuda::ConvPath::gemm_forward,
                               cuda::ConvPath::gemm_backward);
    CAPTURE(int(path));
    const OptionScope forced{&cuda::Options::conv_path, path};
    conv_matches_cpu_all<lenet1, TestType>(20, 5);
    conv_matches_cpu_all<alexnet1, TestType>(64, 2);
    conv_matches_cpu_all<one_by_one, TestType>(16, 5);
    conv_matches_cpu_all<conv1d, TestType>(8, 3);
    conv_matches_cpu_all<odd, TestType>(5, 4);
    conv_matches_cpu<core::Window{2, 9, 9, 3, 3, 1, 1, 1, 1, 9, 9}, TestType>(7, 300, true, true);   // more samples than parts
}

TEMPLATE_TEST_CASE("Channels-last bf16 and fp16 convolutions equal the CPU's: cuDNN's, and the products where a path takes them",
                   "[cuda][precision]", core::bf16, core::fp16)
{
    REQUIRE_GPU();
    // Channels-last products (conv/products.hpp): rows in (row, column, channel) order padded to a
    // multiple of 8, the filters copied into that order, cuDNN's input gradient beside them. A forced
    // path takes them for every shape; the timed choice weighs them where the input channels are not
    // a multiple of 8. Other channel counts over small inputs take the detour: channels-first
    // between transposes (conv.hpp, detail::detours).
    const auto path = GENERATE(cuda::ConvPath::timed, cuda::ConvPath::gemm, cuda::ConvPath::gemm_forward,
                               cuda::ConvPath::gemm_backward);
    CAPTURE(int(path));
    const OptionScope forced{&cuda::Options::conv_path, path};
    const cuda::Context probe = gpu_context(true);
    constexpr core::Window odd16{16, 10, 9, 3, 3, 2, 2, 1, 1, 5, 5}, conv1d8{8, 1, 40, 1, 7, 1, 1, 0, 0, 1, 34},
                           large{3, 128, 128, 3, 3, 1, 1, 1, 1, 128, 128},
                           stem{3, 112, 112, 7, 7, 2, 2, 3, 3, 56, 56};   // a ResNet's first layer, on 112 x 112
    if (path != cuda::ConvPath::timed) {   // the forced paths run the products (a batch no other test uses)
        const cuda::ConvPlan& p = cuda::detail::plan_of<stem, TestType>(probe, 16, 3);
        CHECK(p.gemm_forward == (path == cuda::ConvPath::gemm || path == cuda::ConvPath::gemm_forward));
        CHECK(p.gemm_backward == (path == cuda::ConvPath::gemm || path == cuda::ConvPath::gemm_backward));
    }
    {
        CHECK(cuda::detail::weighs_products<TestType>(probe, stem));
        CHECK(cuda::detail::weighs_products<TestType>(probe, odd16) == (path != cuda::ConvPath::timed));
    }
    CHECK_FALSE(cuda::detail::detours<one_by_one, TestType>(probe));
    CHECK_FALSE(cuda::detail::detours<odd16, TestType>(probe));
    CHECK_FALSE(cuda::detail::detours<large, TestType>(probe));   // 3 channels, but too large an input
    CHECK(cuda::detail::detours<lenet1, TestType>(probe));
    CHECK(cuda::detail::detours<odd, TestType>(probe));
    CHECK_FALSE(cuda::detail::detours<lenet1, TestType>(gpu_context(false)));
    conv_matches_cpu_all<one_by_one, TestType>(16, 5, true);
    conv_matches_cpu_all<odd16, TestType>(8, 4, true);
    conv_matches_cpu_all<conv1d8, TestType>(16, 3, true);
    conv_matches_cpu_all<large, TestType>(8, 2, true);
    conv_matches_cpu_all<stem, TestType>(16, 2, true);
    conv_matches_cpu<core::Window{8, 9, 9, 3, 3, 1, 1, 1, 1, 9, 9}, TestType>(16, 300, true, true, true);
    conv_matches_cpu_all<lenet1, TestType>(20, 5, true);
    conv_matches_cpu_all<alexnet1, TestType>(64, 2, true);
    conv_matches_cpu_all<conv1d, TestType>(8, 3, true);
    conv_matches_cpu_all<odd, TestType>(5, 4, true);
    for (const bool bias : {true, false}) conv_transpose_matches_cpu<transposed, TestType>(6, 3, bias, true);
}

TEMPLATE_TEST_CASE("bf16 and fp16 direct convolutions: filters beyond the direct forward's shared memory",
                   "[cuda][precision]", core::bf16, core::fp16)
{
    REQUIRE_GPU();
    // 448 x 28 floats of filters and biases: cuDNN's forward, our filter gradient.
    static_assert(cuda::detail::direct_conv<core::Window{3, 6, 6, 3, 3, 1, 1, 1, 1, 6, 6}> && 448 * 28 * 4 > 48 * 1024);
    conv_matches_cpu_all<core::Window{3, 6, 6, 3, 3, 1, 1, 1, 1, 6, 6}, TestType>(448, 2);
}

TEMPLATE_TEST_CASE("bf16 and fp16 transposed convolutions equal the CPU's float ones", "[cuda][precision]", core::bf16,
                   core::fp16)
{
    REQUIRE_GPU();
    conv_transpose_matches_cpu<transposed, TestType>(6, 3, true);
    conv_transpose_matches_cpu<transposed, TestType>(6, 3, false);
    conv_transpose_matches_cpu<core::Window{3, 7, 9, 3, 3, 1, 1, 0, 0, 5, 7}, TestType>(4, 2, true);
}

TEMPLATE_TEST_CASE("bf16 and fp16 fully connected layers equal the CPU's float ones: bias aligned or not, fused ReLU",
                   "[cuda][precision]", core::bf16, core::fp16)
{
    REQUIRE_GPU();
    for (const std::size_t offset : {std::size_t{0}, std::size_t{1}})
        for (const bool bias : {true, false})
            for (const bool relu : {false, true}) {
                linear_matches_cpu<TestType>(37, 11, 61, bias, relu, offset);
                linear_matches_cpu<TestType>(256, 64, 32, bias, relu, offset);   // multiples of 8: tensor-core tiles
            }
}

TEST_CASE("A bf16 convolution's plan is its own: cuDNN descriptors in BFLOAT16, timed and logged apart from float's",
          "[cuda][precision]")
{
    REQUIRE_GPU();
    LoggedTimedChoices logged;
    constexpr core::Window g{20, 12, 12, 5, 5, 1, 1, 0, 0, 8, 8};   // LeNet's second layer
    const std::size_t n = 67;                                       // a batch no other test uses
    const auto before = cuda::detail::measured_conv_choices().size();
    cuda::Context ctx = gpu_context(false);
    const cuda::ConvPlan& f = cuda::detail::plan_of<g>(ctx, 50, n);
    const cuda::ConvPlan& b = cuda::detail::plan_of<g, core::bf16>(ctx, 50, n);
    const cuda::ConvPlan& h = cuda::detail::plan_of<g, core::fp16>(ctx, 50, n);
    CHECK(cuda::detail::measured_conv_choices().size() == before + 3);
    CHECK((&f != &b && &b != &h));
    auto type_of = [](const cuda::ConvPlan& p) {
        cudnnDataType_t type{};
        int n_ = 0, c = 0, hh = 0, w = 0, ns = 0, cs = 0, hs = 0, ws = 0;
        REQUIRE(cudnnGetTensor4dDescriptor(p.x, &type, &n_, &c, &hh, &w, &ns, &cs, &hs, &ws) == CUDNN_STATUS_SUCCESS);
        return type;
    };
    CHECK(type_of(f) == CUDNN_DATA_FLOAT);
    CHECK(type_of(b) == CUDNN_DATA_BFLOAT16);
    CHECK(type_of(h) == CUDNN_DATA_HALF);
    cudnnMathType_t math{};
    REQUIRE(cudnnGetConvolutionMathType(b.conv, &math) == CUDNN_STATUS_SUCCESS);
    CHECK(math == CUDNN_TENSOR_OP_MATH);
    // One line per element type, float's as it always was.
    const std::string text = logged.out.str();
    CAPTURE(text);
    CHECK(text.find("convolution 20x12x12 -> 50x8x8 (5x5, stride 1x1, pad 0x0), batch 67: cuDNN forward algorithm ") !=
          std::string::npos);
    CHECK(text.find("convolution 20x12x12 -> 50x8x8 (5x5, stride 1x1, pad 0x0), batch 67, bf16: cuDNN forward algorithm ") !=
          std::string::npos);
    CHECK(text.find("convolution 20x12x12 -> 50x8x8 (5x5, stride 1x1, pad 0x0), batch 67, fp16: cuDNN forward algorithm ") !=
          std::string::npos);
    // The bf16 products' own timed cuBLASLt choices say so.
    CHECK(text.find(", bf16): candidate ") != std::string::npos);
}

// ---- without a GPU: what plans are keyed on, what scratch holds ----

TEST_CASE("Plan keys tell the element types apart; float's keys are as before", "[cuda-host]")
{
    constexpr core::Window g{20, 12, 12, 5, 5, 1, 1, 0, 0, 8, 8};
    const cuda::ConvKey f{g, 50, 8}, b{g, 50, 8, cuda::ConvKey::convolution, cuda::StorageId::bf16},
        h{g, 50, 8, cuda::ConvKey::convolution, cuda::StorageId::fp16};
    CHECK(f.storage == cuda::StorageId::fp32);
    CHECK(((f < b) != (b < f)));
    CHECK(((b < h) != (h < b)));
    CHECK(((f < h) != (h < f)));
    cuda::GemmKey gf{cuda::GemmKey::forward, 37, 11, 61, 16, 16, 16, false}, gb = gf;
    gb.storage = cuda::StorageId::bf16;
    CHECK(gf.storage == cuda::StorageId::fp32);
    CHECK(!(gf == gb));
    CHECK(((gf < gb) != (gb < gf)));
    // The weight gradients (and the products' rows' gradient) are float whatever the inputs are.
    for (const auto kind : {cuda::GemmKey::weight_grad, cuda::GemmKey::weight_grad_bias, cuda::GemmKey::input_grad_t}) {
        cuda::GemmKey k = gb;
        k.kind = kind;
        CHECK(k.float_output());
    }
    for (const auto kind : {cuda::GemmKey::forward, cuda::GemmKey::forward_relu, cuda::GemmKey::forward_no_bias,
                            cuda::GemmKey::forward_relu_no_bias, cuda::GemmKey::input_grad}) {
        cuda::GemmKey k = gb;
        k.kind = kind;
        CHECK(!k.float_output());
    }
    CHECK(cuda::storage_of<float> == cuda::StorageId::fp32);
    CHECK(cuda::storage_of<core::bf16> == cuda::StorageId::bf16);
    CHECK(cuda::storage_of<core::fp16> == cuda::StorageId::fp16);
}

TEST_CASE("Scratch and workspace sizes: float's as before, 16-bit ones with room for what they convert", "[cuda-host]")
{
    constexpr core::Window g{20, 12, 12, 5, 5, 1, 1, 0, 0, 8, 8};
    const int cout = 50;
    const std::size_t n = 16, pixels = n * 8 * 8, K = 20 * 5 * 5, bias = std::size_t(cout) * cuda::detail::bias_parts(cout, pixels);
    // The products' workspace: rows then the pixel-major output; 16-bit rows leave room for their float gradient.
    CHECK(cuda::detail::gemm_workspace(g, cout, n) == sizeof(float) * pixels * (K + cout));
    CHECK(cuda::detail::gemm_workspace<core::bf16>(g, cout, n) == sizeof(float) * pixels * K + 2 * pixels * cout);
    // cuDNN's filter gradient in T after the bias's partial sums, from a 256-byte boundary.
    CHECK(cuda::CudnnConv<g>::scratch_size<float>(cout, n) == bias);
    const std::size_t weights = std::size_t(cout) * K, start = (bias + 63) / 64 * 64;
    // Then, as far again, the filter reordered for channels-last activations. 16-bit types' bias room
    // also fits channels-last's parts (columns.hpp).
    const std::size_t filter = (weights * 2 + 255) / 256 * 64;
    const std::size_t bias16 = std::size_t(cout) * std::max<std::size_t>(cuda::detail::bias_parts(cout, pixels),
                                                                         cuda::detail::column_parts(pixels, cout));
    CHECK(bias16 > bias);   // a small layer: more parts than channels-first's, to fill the device
    CHECK(cuda::CudnnConv<g>::scratch_size<core::bf16>(cout, n) == (bias16 + 63) / 64 * 64 + 2 * filter);
    CHECK(cuda::CudnnConv<g>::scratch_size<core::fp16>(cout, n) == (bias16 + 63) / 64 * 64 + 2 * filter);
    float* base = nullptr;
    CHECK(reinterpret_cast<char*>(cuda::detail::cudnn_filter_scratch<core::bf16>(base + 256, bias)) ==
          reinterpret_cast<char*>(base + 256 + start));
    CHECK(reinterpret_cast<char*>(cuda::detail::cudnn_reordered_filter<core::bf16>(base + 256, bias, weights)) ==
          reinterpret_cast<char*>(base + 256 + start + filter));
    // Transposed: over the output's channels (g.c), c input channels.
    constexpr core::Window t{5, 16, 16, 4, 4, 2, 2, 1, 1, 8, 8};
    const std::size_t tbias = 5 * cuda::detail::bias_parts(5, 3 * 16 * 16);
    const std::size_t tbias16 = 5 * std::max<std::size_t>(cuda::detail::bias_parts(5, 3 * 16 * 16), cuda::detail::column_parts(3 * 16 * 16, 5));
    CHECK(cuda::CudnnConvTranspose<t>::scratch_size<float>(6, 3) == tbias);
    CHECK(cuda::CudnnConvTranspose<t>::scratch_size<core::fp16>(6, 3) == (tbias16 + 63) / 64 * 64 + 2 * ((6 * 5 * 16 * 2 + 255) / 256 * 64));
    // Channels-last sums a bias gradient in parts of about 1024 rows (columns.hpp): 16-bit types leave room for them.
    const std::size_t rows = 256 * 56 * 56;
    CHECK(cuda::detail::bias_scratch<float>(64, rows) == 64 * std::size_t(cuda::detail::bias_parts(64, rows)));
    CHECK(cuda::detail::bias_scratch<core::bf16>(64, rows) == 64 * cuda::detail::column_parts(rows, 64));
    CHECK(cuda::detail::column_parts(rows, 64) == (rows + 1023) / 1024);
    CHECK(cuda::detail::column_parts(rows, 64) > cuda::detail::bias_parts(64, rows));
    // Smaller parts where parts of 1024 rows would leave the device idle, never below 64 rows.
    CHECK(cuda::detail::column_parts(32 * 28 * 28, 64) == 32 * 28 * 28 / 64);
    CHECK(cuda::detail::column_parts(256 * 7 * 7, 2048) == 16);   // ResNet-50's last layers: 32 blocks across
}

TEST_CASE("Vector access is allowed per T (16 bytes for float, 8 for 16-bit), and T names the libraries' types",
          "[cuda-host]")
{
    alignas(16) float f[8] = {};
    alignas(16) core::bf16 b[8] = {};
    CHECK(cuda::detail::vector_aligned<float>(f));
    CHECK(!cuda::detail::vector_aligned<float>(f + 2));
    CHECK(cuda::detail::vector_aligned<core::bf16>(b + 4));
    CHECK(!cuda::detail::vector_aligned<core::bf16>(b + 2));   // 4 bytes: not 8
    CHECK(!cuda::detail::vector_aligned<core::bf16>(b + 1));
    CHECK(cuda::detail::cudnn_type<float> == CUDNN_DATA_FLOAT);
    CHECK(cuda::detail::cudnn_type<core::bf16> == CUDNN_DATA_BFLOAT16);
    CHECK(cuda::detail::cudnn_type<core::fp16> == CUDNN_DATA_HALF);
    CHECK(cuda::detail::cuda_type(cuda::StorageId::bf16) == CUDA_R_16BF);
    CHECK(cuda::detail::cuda_type(cuda::StorageId::fp16) == CUDA_R_16F);
    CHECK(cuda::detail::cuda_type(cuda::StorageId::fp32) == CUDA_R_32F);
}
