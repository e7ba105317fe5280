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

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "train_bench.hpp"

namespace train_bench {
namespace {

constexpr std::size_t kLayers = 12, kWidth = 768, kContext = 1024;
// GPT-2's own vocabulary; GPT2Small pads its table to 50,304 rows, which the data never names.
constexpr std::uint32_t kTokens = 50257;

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

template <class M>
int measure_gpt(const Settings& s)
{
    static_assert(M::input_shape::size == kContext, "the GPT's context must be 1024 tokens");
    core::require(s.devices.size() == 1 && !s.processes,
                  "--model gpt2 runs on one device in one process: give --devices cuda:0 (or cpu:0)");
    if (s.blas_threads > 0) backend::cpu::set_blas_threads(s.blas_threads);
    const std::size_t micro = s.micro_batch ? s.micro_batch : 16;
    const std::size_t tokens_per_micro = micro * kContext;
    const std::size_t k = s.accumulate ? s.accumulate : std::max<std::size_t>(1, (std::size_t{1} << 19) / tokens_per_micro);
    const std::size_t tokens_per_step = k * tokens_per_micro;

    // 2k micro-batches of ids uniform over GPT-2's vocabulary (seed 1), each label the id after it;
    // step s takes micro-batches s k .. s k + k - 1, modulo 2k: no step sees the data of the step before.
    const std::size_t pool = 2 * k, per = micro * kContext;
    core::checked_mul(pool, per, "the synthetic token ids");
    core::Buffer<std::int32_t> inputs = backend::host_buffer<std::int32_t>(pool * per),
                               labels = backend::host_buffer<std::int32_t>(pool * per);
    for (std::size_t q = 0; q < pool * micro; ++q)
        for (std::size_t t = 0; t <= kContext; ++t) {
            const auto id = std::int32_t(core::random_bits(1, core::Stream::synthetic, 3, q * (kContext + 1) + t, 0) % kTokens);
            if (t < kContext) inputs.data()[q * kContext + t] = id;
            if (t > 0) labels.data()[q * kContext + t - 1] = id;
        }
    const auto batch = [&](std::size_t i) {
        const std::size_t at = i % pool;
        return TokenBatch{inputs.data() + at * per, labels.data() + at * per, micro, i * micro, 1};
    };

    M model{s.devices.front(), 1};
    Accumulate opt{ClipGradNorm{AdamW{{.lr = 6e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .weight_decay = 0.1f}}, 1.0f}, k};
    std::vector<double> times;
    double first = 0.0, loss = 0.0;
    for (std::size_t step = 0; step < s.warmup + s.steps; ++step) {
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
        if (step >= s.warmup) times.push_back(ms);
    }
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    const double tokens_per_s = double(tokens_per_step) / (median / 1000.0);
    const double n = double(M::param_count - kContext * kWidth);   // without the position embedding
    const double flops_per_token = 6.0 * n + 6.0 * double(kLayers * kWidth * kContext);
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
                    s.precision.c_str(), s.devices.front().name().c_str(), graphs ? "true" : "false", kContext, micro, k,
                    tokens_per_step, s.steps, s.warmup, median, times.front(), first, tokens_per_s, flops_per_token,
                    s.peak_tflops, mfu, double(mem.held) / mib, double(mem.used) / mib,
                    double(model.activation_bytes()) / mib, loss);
    else
        std::printf("gpt2 (%s) on %s: %zu x %zu tokens a micro-batch, %zu micro-batches a step (%zu tokens), median "
                    "step %.1f ms (min %.1f, first %.1f), %.0f tokens/s, MFU %.1f%% of %.0f TFLOP/s, loss %.4f, "
                    "device memory %.0f MiB held (%.0f MiB used on the device)\n",
                    s.precision.c_str(), s.devices.front().name().c_str(), micro, kContext, k, tokens_per_step, median,
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
    return measure_gpt<with_precision<GPT2Small, bf16>>(s);
#else
    core::require(s.precision == "fp32", "--model gpt2: train_bench builds it in fp32 only; train_bench_cuda has bf16");
    return measure_gpt<GPT2Small>(s);
#endif
}

} // namespace train_bench
