#pragma once
// What train_bench's translation units share: the run's settings and the measurement of one network
// (train_bench.cpp parses the command line; train_bench_<family>.cpp instantiate the networks, in
// several translation units so that a CUDA build compiles them side by side).

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "replica/data/synthetic.hpp"
#include "replica/replica.hpp"

namespace train_bench {

using namespace replica;

struct Settings {
    std::string model;
    std::size_t batch, steps, warmup;
    std::vector<Device> devices;
    DispatchChoice dispatch;
    Scaling scaling;
    bool json;
    int blas_threads;
    StepOptions step;
    parallel::ProcessGroup* processes;   // under mpirun: this process is one of several
    std::size_t bucket_floats;           // DataParallelOptions::bucket_floats (0: its default)
    std::size_t first_bucket_floats;     // DataParallelOptions::first_bucket_floats (0: its default)
    bool data_parallel;                  // a DataParallel even over one device (what its machinery costs)
    std::string precision;               // the activations' type: fp32, bf16 or fp16
    GradientReduction gradient_reduction;  // DataParallelOptions::gradient_reduction
    // gpt2 (train_bench_gpt.cpp): sequences a micro-batch (0: 16), micro-batches an update (0: as many
    // as make 524,288 tokens), and the device's peak rate for the model FLOP utilisation.
    std::size_t micro_batch = 0, accumulate = 0;
    double peak_tflops = 989.0;
    std::string gpt_config = "124m";   // gpt2: 124m (GPT2Small) or tiny (the CPU program only)
    std::string curve;                 // gpt2: the --curve files' prefix (empty: none written)
};

inline DataParallelOptions data_parallel_options(const Settings& s)
{
    return {.bucket_floats = s.bucket_floats ? s.bucket_floats : DataParallelOptions{}.bucket_floats,
            .first_bucket_floats = s.first_bucket_floats ? s.first_bucket_floats : DataParallelOptions{}.first_bucket_floats,
            .gradient_reduction = s.gradient_reduction,
            .processes = s.processes};
}

// The activation memory of the model's first replica (Sequential::activation_bytes).
template <class Model>
std::size_t activation_bytes(Model& model)
{
    return model.activation_bytes();
}

template <class M, class Model>
int measure(const Settings& s, std::size_t batch, Model& model, const std::string& description)
{
    if (s.blas_threads > 0) backend::cpu::set_blas_threads(s.blas_threads);
    const std::size_t replicas = model.global_replica_count();   // over every process
    const std::size_t global = s.scaling == Scaling::weak
                                   ? core::checked_mul(batch, replicas, "--batch x devices (weak scaling)")
                                   : batch;
    core::checked_mul(2 * global, M::input_shape::size, "two batches of synthetic inputs");
    // Two distinct batches, alternated, so no step sees the data of the step before.
    // In page-locked memory under CUDA, as the Loader's batches are: each batch goes to the devices
    // while the step before computes, as the Trainer does it.
    using E = typename M::input_element;
    struct {
        core::Buffer<E> inputs;
        core::Buffer<std::int32_t> labels;
        std::size_t input_size, label_size;
    } set{backend::host_buffer<E>(2 * global * M::input_shape::size), backend::host_buffer<std::int32_t>(2 * global * M::label_size),
          M::input_shape::size, M::label_size};
    if constexpr (std::is_same_v<E, float>) {
        const auto made = data::synthetic_dataset(2 * global, M::input_shape::size, M::label_size, M::output_shape::dims[0], 1);
        std::copy(made.inputs.begin(), made.inputs.end(), set.inputs.data());
        std::copy(made.labels.begin(), made.labels.end(), set.labels.data());
    } else {   // token ids uniform over the vocabulary (seed 1), each label the id after it
        constexpr std::size_t T = M::input_shape::size;
        for (std::size_t q = 0; q < 2 * global; ++q)
            for (std::size_t t = 0; t <= T; ++t) {
                const auto id = std::int32_t(core::random_bits(1, core::Stream::synthetic, 3, q * (T + 1) + t, 0) % M::vocabulary);
                if (t < T) set.inputs.data()[q * T + t] = id;
                if (t > 0) set.labels.data()[q * T + t - 1] = id;
            }
    }
    SGD opt{{.lr = 0.001f, .momentum = 0.9f}};

    std::vector<double> times;
    double first = 0.0;   // the first step: plans, algorithm timing, allocation (and an eager step)
    float loss = 0.0f;
    for (std::size_t i = 0; i < s.warmup + s.steps; ++i) {
        auto batch = [&](std::size_t step) {
            const std::size_t half = step % 2;
            return data::BatchOf<E>{set.inputs.data() + half * global * set.input_size,
                         set.labels.data() + half * global * set.label_size, global, step * global, 1};
        };
        const data::BatchOf<E> b = batch(i), next = batch(i + 1);
        const auto t0 = std::chrono::steady_clock::now();
        // Returns once the step (update included) has finished. The next batch is copied meanwhile.
        loss = train_step(model, opt, b, s.step, &next);
        const auto t1 = std::chrono::steady_clock::now();
        const double ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
        if (i == 0) first = ms;
        if (i >= s.warmup) times.push_back(ms);
    }
    std::sort(times.begin(), times.end());
    const double median = times[times.size() / 2];
    const double rate = double(global) / (median / 1000.0);
    const char* dispatch = s.dispatch == DispatchChoice::threaded ? "threaded"
                           : s.dispatch == DispatchChoice::measured ? "auto"
                                                                    : "single";
    const std::string chosen = s.dispatch == DispatchChoice::measured || s.data_parallel ? description : "";
    if (model.process_rank() != 0) return 0;   // one process reports (all take the same steps)
    const int processes = s.processes ? s.processes->size() : 1;
#if defined(REPLICA_CUDA)
    const bool graphs = backend::cuda::default_options().graphs && !s.devices.front().is_cpu() &&
                        !parallel::contains_data_parallel<M>;
#else
    const bool graphs = false;
#endif
    const double activation_mib = double(activation_bytes(model)) / double(1 << 20);
    struct {
        std::size_t candidates_timed = 0, choices_cached = 0, records_refused = 0;
    } tuning;
    bool tuning_cache = false;
#if defined(REPLICA_CUDA)
    const backend::cuda::TuningCounts counts = backend::cuda::tuning_counts();
    tuning = {counts.candidates_timed, counts.choices_cached, counts.records_refused};
    tuning_cache = backend::cuda::default_options().tuning_cache && backend::cuda::default_options().benchmark &&
                   !s.devices.front().is_cpu();
#endif
    if (s.json)
        std::printf("{\"library\": \"replica\", \"precision\": \"%s\", \"activation_mib\": %.2f, \"model\": \"%s\", \"devices\": %zu, \"processes\": %d, \"device\": \"%s\", "
                    "\"dispatch\": \"%s\", \"chosen\": \"%s\", \"graphs\": %s, "
                    "\"scaling\": \"%s\", \"reproducible\": %s, \"batch\": %zu, \"global_batch\": %zu, \"steps\": %zu, \"median_ms\": %.4f, "
                    "\"min_ms\": %.4f, \"first_ms\": %.1f, \"samples_per_s\": %.1f, \"loss\": %.5f, "
                    "\"tuning_cache\": %s, \"candidates_timed\": %zu, \"choices_cached\": %zu, \"records_refused\": %zu}\n",
                    s.precision.c_str(), activation_mib, s.model.c_str(), replicas, processes, s.devices.front().name().c_str(), dispatch, chosen.c_str(), graphs ? "true" : "false",
                    s.scaling == Scaling::weak ? "weak" : "strong", s.step.reproducible ? "true" : "false", batch, global,
                    s.steps, median, times.front(), first, rate, loss, tuning_cache ? "true" : "false",
                    tuning.candidates_timed, tuning.choices_cached, tuning.records_refused);
    else
        std::printf("%s (%s) on %s%s: batch %zu (global %zu), median step %.3f ms (min %.3f, first %.1f), %.0f samples/s, "
                    "loss %.4f, activations %.1f MiB%s\n",
                    s.model.c_str(), s.precision.c_str(), description.c_str(),
                    processes > 1 ? (" in each of " + std::to_string(processes) + " processes").c_str() : "", batch,
                    global, median, times.front(), first, rate, loss, activation_mib,
                    s.devices.front().is_cpu() ? ""
                    : (", " + std::to_string(tuning.candidates_timed) + " candidates timed, " +
                       std::to_string(tuning.choices_cached) + " choices from the tuning cache" +
                       (tuning.records_refused ? ", " + std::to_string(tuning.records_refused) + " records refused" : ""))
                          .c_str());
    return 0;
}

template <class M>
int run(const Settings& s)
{
    const std::size_t batch = s.batch ? s.batch : default_batch_size<M>;
    if (s.processes && parallel::contains_data_parallel<M>)
        throw Error("a nested DataParallel does not span processes yet: benchmark alexnet-plain under mpirun");
    if constexpr (parallel::wraps_automatically<M>)
        if (s.data_parallel) {
            std::string over;
            for (const auto& d : s.devices) over += (over.empty() ? "" : ",") + d.name();
            if (s.dispatch == DispatchChoice::threaded) {
                DataParallel<M, Threaded> model{s.devices, 0, data_parallel_options(s)};
                return measure<M>(s, batch, model, "DataParallel<threaded> over " + over);
            }
            core::require(s.dispatch == DispatchChoice::single, "--data-parallel takes --dispatch single or threaded");
            if constexpr (M::syncs > 0) {
                throw Error("BatchNorm over the global batch needs --dispatch threaded with --data-parallel");
            } else {
                DataParallel<M, SingleThread> model{s.devices, 0, data_parallel_options(s)};
                return measure<M>(s, batch, model, "DataParallel<single> over " + over);
            }
        }
    core::require(!s.data_parallel, "--data-parallel: this network already holds a DataParallel");
    auto model = auto_parallel(M{s.devices}, s.devices,
                               {.dispatch = s.dispatch, .data_parallel = data_parallel_options(s),
                                .batch_size = batch ? batch : 64, .scaling = s.scaling});
    return measure<M>(s, batch, model, model.description());
}

// The network in the precision asked for. bf16 is built into the CUDA program, and into the CPU
// program for the networks whose time is in their convolutions (cpu_bf16: the residual networks),
// which oneDNN runs on bf16 products where the CPU has them; elsewhere the CPU computes bf16 in fp32
// with rounding (semantics, not speed). fp16 trains in lenet_fashion_mnist_cuda.
template <class M, bool cpu_bf16 = false>
int run_in(const Settings& s)
{
    if (s.precision == "fp32") return run<M>(s);
#if defined(REPLICA_CUDA)
    if (s.precision == "bf16") return run<with_precision<M, bf16>>(s);
#else
    if constexpr (cpu_bf16)
        if (s.precision == "bf16") return run<with_precision<M, bf16>>(s);
#endif
    throw Error("--precision " + s.precision + ": this program has " + s.model + " in fp32 only; train_bench_cuda has bf16, "
                "and this program the residual networks (resnet20, resnet18, resnet50) in bf16");
}


// The networks of each family: the run's exit code, or nothing where s.model is not one of them.
std::optional<int> run_classic(const Settings& s);     // lenet, alexnet, alexnet-plain
std::optional<int> run_inception(const Settings& s);   // googlenet, textcnn, fcn
std::optional<int> run_residual(const Settings& s);    // resnet18, resnet50, resnet20
std::optional<int> run_gpt(const Settings& s);         // gpt2, chargpt

// The one precision gpt2 is built in, in this program (train_bench_gpt.cpp): its default.
#if defined(REPLICA_CUDA)
inline constexpr const char* gpt2_precision = "bf16";
#else
inline constexpr const char* gpt2_precision = "fp32";
#endif

} // namespace train_bench
