// train_bench's GPT-2 124M (models::GPT2Small, train_bench.hpp): sequences of 1024 synthetic token ids,
// micro-batches of --micro-batch sequences, --accumulate of them to an update (AdamW under ClipGradNorm
// at 1.0, under Accumulate), on one device. A step is one update; its time is the time of its
// micro-batches' train_step calls, each returning once its micro-batch has finished.
//
// The report: tokens a second and ms a step (medians over --steps after --warmup), the device memory
// held (the context's caching allocator, and the device's used memory), and the model FLOP
// utilisation: 6N + 6LCT FLOPs a token (N the parameters without the position embedding, L layers,
// C the width, T the context; the attention's share halved for the causal mask) over --peak-tflops.
// CharGPT (--model chargpt) is measured as the other networks are (train_bench.hpp's measure).
//
// --gpt-config tiny (the CPU program only) trains GPT<2, 2, 64, 64, 512> on ids uniform over its 512
// rows instead: bench/pytorch_bench.py's tiny GPT, for checks of the plumbing on a CPU.
//
// --curve PREFIX records a run for bench/pytorch_bench.py --curve to repeat in PyTorch (no warm-up:
// every update from the initial parameters is recorded):
//   PREFIX.json         the run: configuration, shape, parameter count, micro-batch, accumulate, steps,
//                       seed, the optimizer's settings, and the two files' layouts
//   PREFIX.params       the initial parameters, the model's flat float32 vector (little-endian)
//   PREFIX.ids          int32 (little-endian): for each micro-batch in the order the run takes them
//                       (steps x accumulate), its inputs (micro-batch, context), then its labels
//   PREFIX.losses.json  a list: each update's loss, the mean of its micro-batches' mean losses

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "train_bench.hpp"

namespace train_bench {
namespace {

// A configuration's shape (the model type's parameters) and its defaults. `tokens` is the range of
// the synthetic ids: GPT-2's own vocabulary of 50,257 for GPT2Small, whose table of 50,304 rows the
// data never fills; the whole table for tiny.
struct GptShape {
    const char* config;
    std::size_t layers, heads, width, context, vocab;
    std::uint32_t tokens;
    std::size_t micro, accumulate;   // the defaults of --micro-batch and --accumulate (0: 524,288 tokens)
};
constexpr GptShape gpt2_small{"124m", 12, 12, 768, 1024, 50304, 50257, 16, 0};
constexpr GptShape gpt_tiny{"tiny", 2, 2, 64, 64, 512, 512, 2, 2};
using GPTTiny = GPT<gpt_tiny.layers, gpt_tiny.heads, gpt_tiny.width, gpt_tiny.context, gpt_tiny.vocab>;

static_assert(std::endian::native == std::endian::little, "--curve writes the host's bytes as little-endian");

// The optimizer's settings, which --curve's sidecar repeats for PyTorch.
constexpr AdamWOptions kAdamW{.lr = 6e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
constexpr float kClip = 1.0f;
constexpr std::uint64_t kSeed = 1;   // the model's initial parameters and the data

constexpr const char* kKept = "a file already there is unchanged";

template <class T>
void write_binary(const std::string& path, std::span<const T> values, const std::string& what)
{
    const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
    core::write_file_atomically(path, {bytes, values.size_bytes()}, "cannot write " + what + " " + path, kKept);
}

void write_text(const std::string& path, const std::string& text, const std::string& what)
{
    const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
    core::write_file_atomically(path, {bytes, text.size()}, "cannot write " + what + " " + path, kKept);
}

std::string number(double v)
{
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.9g", v);
    return buf;
}

// Device memory held: the caching allocator's bytes (every buffer of the context, cuBLAS's workspace
// included), and the device's used memory (the CUDA context and the libraries' own allocations too).
struct DeviceMemory {
    std::size_t held = 0, used = 0;
};

template <class Model>
DeviceMemory device_memory(Model& model)
{
    DeviceMemory m;
    model.visit([&](auto& ctx) {
        if constexpr (requires { ctx.reserved_bytes(); }) m.held = ctx.reserved_bytes();
    });
#if defined(REPLICA_CUDA)
    if (m.held > 0) {
        std::size_t free = 0, total = 0;
        if (cudaMemGetInfo(&free, &total) == cudaSuccess) m.used = total - free;
        else cudaGetLastError();
    }
#endif
    return m;
}

// --curve's PREFIX.json: what bench/pytorch_bench.py --curve needs to build the same model and train it alike.
template <class M>
std::string curve_sidecar(const Settings& s, const GptShape& g, std::size_t micro, std::size_t k)
{
    std::string j = "{\"model\": \"gpt2\", \"config\": \"" + std::string(g.config) + "\"";
    j += ", \"layers\": " + std::to_string(g.layers) + ", \"heads\": " + std::to_string(g.heads) +
         ", \"width\": " + std::to_string(g.width) + ", \"context\": " + std::to_string(g.context) +
         ", \"vocab\": " + std::to_string(g.vocab) + ", \"tokens\": " + std::to_string(g.tokens);
    j += ", \"parameters\": " + std::to_string(M::param_count) + ", \"micro_batch\": " + std::to_string(micro) +
         ", \"accumulate\": " + std::to_string(k) + ", \"steps\": " + std::to_string(s.steps) +
         ", \"seed\": " + std::to_string(kSeed) + ", \"precision\": \"" + s.precision + "\", \"device\": \"" +
         s.devices.front().name() + "\"";
    j += ", \"optimizer\": {\"name\": \"AdamW\", \"lr\": " + number(kAdamW.lr) + ", \"beta1\": " +
         number(kAdamW.beta1) + ", \"beta2\": " + number(kAdamW.beta2) + ", \"eps\": " + number(kAdamW.eps) +
         ", \"weight_decay\": " + number(kAdamW.weight_decay) +
         ", \"decay\": \"weights and embeddings\", \"clip_grad_norm\": " + number(kClip) + "}";
    j += ", \"params_layout\": \"float32 little-endian: wte, wpe, per block ln_1 (weight, bias), attn.c_attn, "
         "attn.c_proj, ln_2, c_fc, c_proj (weight (out, in), then bias), then ln_f (weight, bias)\"";
    j += ", \"ids_layout\": \"int32 little-endian (steps x accumulate, 2, micro_batch, context): each "
         "micro-batch in the order of use, its inputs then its labels\"}\n";
    return j;
}

template <class M>
int measure_gpt(const Settings& s, const GptShape& g)
{
    constexpr std::size_t context = M::input_shape::size;
    core::require(context == g.context && M::vocabulary == g.vocab, "measure_gpt: the model type and its shape differ");
    core::require(s.devices.size() == 1 && !s.processes,
                  "--model gpt2 runs on one device in one process: give --devices cuda:0 (or cpu:0)");
    if (s.blas_threads > 0) backend::cpu::set_blas_threads(s.blas_threads);
    const std::size_t micro = s.micro_batch ? s.micro_batch : g.micro;
    const std::size_t tokens_per_micro = micro * context;
    const std::size_t k = s.accumulate   ? s.accumulate
                          : g.accumulate ? g.accumulate
                                         : std::max<std::size_t>(1, (std::size_t{1} << 19) / tokens_per_micro);
    const std::size_t tokens_per_step = k * tokens_per_micro;
    const bool curve = !s.curve.empty();
    const std::size_t warmup = curve ? 0 : s.warmup;   // a curve starts at the initial parameters

    // 2k micro-batches of ids uniform over [0, g.tokens) (seed 1), each label the id after it; step s
    // takes micro-batches s k .. s k + k - 1, modulo 2k: no step sees the data of the step before.
    const std::size_t pool = 2 * k, per = micro * context;
    core::checked_mul(pool, per, "the synthetic token ids");
    core::Buffer<std::int32_t> inputs = backend::host_buffer<std::int32_t>(pool * per),
                               labels = backend::host_buffer<std::int32_t>(pool * per);
    for (std::size_t q = 0; q < pool * micro; ++q)
        for (std::size_t t = 0; t <= context; ++t) {
            const std::uint32_t bits = core::random_bits(kSeed, core::Stream::synthetic, 3, q * (context + 1) + t, 0);
            const auto id = std::int32_t(bits % g.tokens);
            if (t < context) inputs.data()[q * context + t] = id;
            if (t > 0) labels.data()[q * context + t - 1] = id;
        }
    const auto batch = [&](std::size_t i) {
        const std::size_t at = i % pool;
        return TokenBatch{inputs.data() + at * per, labels.data() + at * per, micro, i * micro, 1};
    };

    M model{s.devices.front(), kSeed};
    if (curve) {
        write_text(s.curve + ".json", curve_sidecar<M>(s, g, micro, k), "the curve's description");
        const std::vector<float> initial = model.parameters();
        write_binary<float>(s.curve + ".params", initial, "the initial parameters");
        const std::size_t used = core::checked_mul(core::checked_mul(s.steps, k, "the curve's micro-batches"), 2 * per,
                                                   "the curve's token ids");
        std::vector<std::int32_t> ids(used);
        for (std::size_t i = 0; i < s.steps * k; ++i) {
            const TokenBatch b = batch(i);
            std::copy(b.inputs, b.inputs + per, ids.begin() + std::ptrdiff_t(2 * i * per));
            std::copy(b.labels, b.labels + per, ids.begin() + std::ptrdiff_t((2 * i + 1) * per));
        }
        write_binary<std::int32_t>(s.curve + ".ids", ids, "the token ids");
    }
    Accumulate opt{ClipGradNorm{AdamW{kAdamW}, kClip}, k};
    std::vector<double> times, losses;
    double first = 0.0, loss = 0.0;
    for (std::size_t step = 0; step < warmup + s.steps; ++step) {
        double sum = 0.0;
        const auto t0 = std::chrono::steady_clock::now();
        for (std::size_t m = 0; m < k; ++m) {
            const std::size_t i = step * k + m;
            const TokenBatch b = batch(i), next = batch(i + 1);
            sum += double(train_step(model, opt, b, s.step, &next));
        }
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        loss = sum / double(k);
        if (step == 0) first = ms;
        if (step >= warmup) times.push_back(ms);
        if (curve) losses.push_back(loss);
    }
    if (curve) {
        std::string list = "[";
        for (std::size_t i = 0; i < losses.size(); ++i) list += (i ? ", " : "") + number(losses[i]);
        write_text(s.curve + ".losses.json", list + "]\n", "the losses");
    }
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    const double tokens_per_s = double(tokens_per_step) / (median / 1000.0);
    const double n = double(M::param_count - context * g.width);   // without the position embedding
    const double flops_per_token = 6.0 * n + 6.0 * double(g.layers * g.width * context);
    const double mfu = flops_per_token * tokens_per_s / (s.peak_tflops * 1e12);
    const DeviceMemory mem = device_memory(model);
    const double mib = double(1 << 20);
#if defined(REPLICA_CUDA)
    const bool graphs = backend::cuda::default_options().graphs && !s.devices.front().is_cpu();
#else
    const bool graphs = false;
#endif
    if (s.json)
        std::printf("{\"library\": \"replica\", \"model\": \"gpt2\", \"precision\": \"%s\", \"device\": \"%s\", "
                    "\"graphs\": %s, \"sequence\": %zu, \"micro_batch\": %zu, \"accumulate\": %zu, "
                    "\"tokens_per_step\": %zu, \"steps\": %zu, \"warmup\": %zu, \"median_ms\": %.3f, \"min_ms\": %.3f, "
                    "\"first_ms\": %.1f, \"tokens_per_s\": %.1f, \"flops_per_token\": %.0f, \"peak_tflops\": %.1f, "
                    "\"mfu\": %.4f, \"peak_memory_mib\": %.1f, \"device_used_mib\": %.1f, \"activation_mib\": %.1f, "
                    "\"loss\": %.5f}\n",
                    s.precision.c_str(), s.devices.front().name().c_str(), graphs ? "true" : "false", context, micro, k,
                    tokens_per_step, s.steps, warmup, median, times.front(), first, tokens_per_s, flops_per_token,
                    s.peak_tflops, mfu, double(mem.held) / mib, double(mem.used) / mib,
                    double(model.activation_bytes()) / mib, loss);
    else
        std::printf("gpt2 (%s) on %s: %zu x %zu tokens a micro-batch, %zu micro-batches a step (%zu tokens), median "
                    "step %.1f ms (min %.1f, first %.1f), %.0f tokens/s, MFU %.1f%% of %.0f TFLOP/s, loss %.4f, "
                    "device memory %.0f MiB held (%.0f MiB used on the device)\n",
                    s.precision.c_str(), s.devices.front().name().c_str(), micro, context, k, tokens_per_step, median,
                    times.front(), first, tokens_per_s, 100.0 * mfu, s.peak_tflops, loss, double(mem.held) / mib,
                    double(mem.used) / mib);
    return 0;
}

} // namespace

// The CPU program trains in fp32; the CUDA program in bf16 activations (fp32 master parameters), the
// precision the benchmark is for, and builds no other (one GPT-2 per program keeps nvcc's time down).
std::optional<int> run_gpt(const Settings& s)
{
    if (s.model == "chargpt") return run_in<CharGPT>(s);   // as the other networks: train_bench.hpp's measure
    if (s.model != "gpt2") return std::nullopt;
#if defined(REPLICA_CUDA)
    core::require(s.precision == "bf16", "--model gpt2: train_bench_cuda builds it in bf16 only (--precision bf16)");
    core::require(s.gpt_config == "124m", "--gpt-config tiny: train_bench_cuda builds GPT-2 124M only; the CPU "
                                          "program train_bench has tiny");
    return measure_gpt<with_precision<GPT2Small, bf16>>(s, gpt2_small);
#else
    core::require(s.precision == "fp32", "--model gpt2: train_bench builds it in fp32 only; train_bench_cuda has bf16");
    if (s.gpt_config == "tiny") return measure_gpt<GPTTiny>(s, gpt_tiny);
    return measure_gpt<GPT2Small>(s, gpt2_small);
#endif
}

} // namespace train_bench
