// Training-step benchmark: any standard network on synthetic data (uniform in [-1, 1), never all zero),
// on given devices, dispatch policy and scaling. Warms up, then reports the median step time.
//
//   train_bench --model lenet --devices cpu:0 --steps 50
//   train_bench --model googlenet --batch 128 --devices cuda:0,cuda:1 --dispatch threaded --json
//   mpirun -np 2 train_bench --model alexnet-plain --json      # two processes, each with its share of the GPUs
//   train_bench_cuda --model gpt2 --devices cuda:0 --json       # GPT-2 124M, bf16, 524,288 tokens an update
//   train_bench --model gpt2 --gpt-config tiny --devices cpu:0 --curve /tmp/tiny   # a loss curve for PyTorch
//
// Output: a human line, or with --json one JSON object per run (bench/run_table.py reads it). On GPUs
// both say how many candidates the autotuner timed and how many choices it took from the tuning
// cache (cuda::tuning_counts), beside the first step's time.

#include <algorithm>
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "support/cli.hpp"
#include "support/processes.hpp"
#include "train_bench.hpp"

using namespace replica;
using train_bench::Settings;

int main(int argc, char** argv)
try {
    const auto processes = examples::launched_processes(argc, argv);   // under mpirun or srun
    CLI::App app{"median training-step time of a standard network on synthetic data", "train_bench"};
    std::string model = "lenet", conv_path = "timed", precision = "fp32", gpt_config = "124m", curve;
    std::size_t batch = 0, steps = 20, warmup = 3, bucket_floats = 0, first_bucket_floats = 0, micro_batch = 0,
                accumulate = 0;
    double peak_tflops = 989.0;
    int blas_threads = 0;
    bool data_parallel = false, eager = false, cudnn_heuristics = false, log_choices = false, json = false,
         channels_first = false, no_tuning_cache = false;
    std::string tuning_cache_dir;
    examples::DeviceFlags dev{.devices = "all", .dispatch = "single", .scaling = "strong"};
    examples::ReproducibleFlags repro;
    app.add_option("--model", model, "the network: lenet, alexnet (features replicated), alexnet-plain, googlenet, "
                                     "textcnn, fcn, resnet18, resnet50, resnet20, chargpt (models::CharGPT: 64 byte ids a "
                                     "sequence, SGD as the others) or gpt2 (GPT-2 124M: sequences of "
                                     "1024 tokens, AdamW clipped at 1.0, gradient accumulation; one device)")
        ->check(CLI::IsMember({"lenet", "alexnet", "alexnet-plain", "googlenet", "textcnn", "fcn", "resnet18", "resnet50",
                               "resnet20", "chargpt", "gpt2"}))
        ->capture_default_str();
    examples::count_option(app, "--batch", batch, "batch size (0: the network's default); global with strong "
                                                  "scaling, per device with weak", 0, 1u << 16);
    examples::count_option(app, "--micro-batch", micro_batch, "gpt2: sequences a micro-batch (0: 16; tiny: 2)", 0,
                           1u << 16);
    examples::count_option(app, "--accumulate", accumulate, "gpt2: micro-batches an update (0: as many as make 524,288 "
                                                            "tokens; tiny: 2)", 0, 1u << 20);
    app.add_option("--peak-tflops", peak_tflops, "gpt2: the device's peak rate for the model FLOP utilisation (989: "
                                                 "H100 and H200, dense bf16)")
        ->check(CLI::Range(1e-6, 1e9))
        ->capture_default_str();
    app.add_option("--gpt-config", gpt_config, "gpt2: GPT-2 124M, or tiny: GPT<2, 2, 64, 64, 512> on ids over its 512 "
                                               "rows (micro-batch 2, accumulate 2; train_bench only), the plumbing "
                                               "on a CPU")
        ->check(CLI::IsMember({"124m", "tiny"}))
        ->capture_default_str();
    app.add_option("--curve", curve, "gpt2: write PREFIX.json (the run), PREFIX.params (the initial parameters), "
                                     "PREFIX.ids (every micro-batch's ids) and PREFIX.losses.json (each update's "
                                     "loss), training from the initial parameters without warm-up; "
                                     "bench/pytorch_bench.py --curve PREFIX repeats the run in PyTorch and compares")
        ->check(examples::not_empty);
    examples::count_option(app, "--steps", steps, "timed steps (gpt2: updates)", 1, 1000000);
    examples::count_option(app, "--warmup", warmup, "untimed steps first", 0, 1000000);
    dev.add(app, "all (every GPU, or the CPU)", {"single", "threaded", "auto"});
    examples::count_option(app, "--blas-threads", blas_threads, "threads of the CPU backend's calls (products, oneDNN, its own loops; 0: leave as is)", 0, 1024);
    repro.add(app);
    examples::count_option(app, "--bucket-floats", bucket_floats,
                           "gradient all-reduce buckets of at least this many floats (0: the default, 1 Mi)", 0,
                           std::uint64_t{1} << 34);
    examples::count_option(app, "--first-bucket-floats", first_bucket_floats,
                           "the first bucket (last layers) closes at this many floats, or at --bucket-floats if "
                           "smaller (0: the default, 256 Ki)", 0, std::uint64_t{1} << 34);
    app.add_flag("--data-parallel", data_parallel, "a DataParallel with --dispatch single or threaded even over one "
                                                   "device: what its machinery (graphs cut at buckets, the all-reduce, "
                                                   "event waits) costs");
    app.add_flag("--eager", eager, "GPUs: run every step eagerly (default: each GPU captures its step in CUDA graphs "
                                   "and replays them)");
    app.add_flag("--cudnn-heuristics", cudnn_heuristics, "GPUs: take cuDNN's heuristic choice of convolution "
                                                         "algorithms (default: time its candidates once per shape and "
                                                         "keep the fastest)");
    const std::vector<std::string> conv_paths = {"timed", "cudnn", "gemm", "gemm-forward", "gemm-backward"};   // cuda::ConvPath's order
    app.add_option("--conv-path", conv_path, "GPUs: convolutions by cuDNN (cudnn), as products over their windows "
                                             "(gemm), products forward only (gemm-forward) or backward only "
                                             "(gemm-backward), or per pass the faster of cuDNN and the products, timed "
                                             "per layer (timed)")
        ->check(CLI::IsMember(conv_paths))
        ->capture_default_str();
    app.add_flag("--channels-first", channels_first,
                 "GPUs: keep bf16 activations (channels, pixels) as float ones, not channels-last (the default)");
    app.add_flag("--log-choices", log_choices,
                 "GPUs: print each timed convolution and product (cuBLASLt) choice to stderr as it is made, or "
                 "taken from the tuning cache");
    app.add_flag("--no-tuning-cache", no_tuning_cache,
                 "GPUs: neither read nor write the tuning cache: time every choice afresh and keep it for this "
                 "process only");
    app.add_option("--tuning-cache-dir", tuning_cache_dir,
                   "GPUs: the tuning cache's folder (default: $REPLICA_CACHE_DIR, else $XDG_CACHE_HOME/replica, "
                   "else $HOME/.cache/replica)");
    auto* precision_option =
        app.add_option("--precision", precision, "the activations' type: fp32 or bf16 (fp32 master parameters in "
                                                 "both; bf16 in train_bench_cuda, and for the residual networks in train_bench, "
                                                 "on oneDNN's bf16 products where the CPU has them; gpt2: bf16 in "
                                                 "train_bench_cuda, fp32 in train_bench, the default there)")
        ->check(CLI::IsMember({"fp32", "bf16"}))
        ->capture_default_str();
    app.add_flag("--json", json, "print one JSON object");
    if (int code = examples::parse(app, argc, argv)) return code - 1;
    if (model == "gpt2" && precision_option->count() == 0) precision = train_bench::gpt2_precision;
    if (model != "gpt2" && (!curve.empty() || gpt_config != "124m"))
        throw Error("--curve and --gpt-config are for --model gpt2");
#if defined(REPLICA_CUDA)
    const auto path = std::ranges::find(conv_paths, conv_path);
    backend::cuda::default_options().graphs = !eager;
    backend::cuda::default_options().benchmark = !cudnn_heuristics;
    backend::cuda::default_options().conv_path = backend::cuda::ConvPath(path - conv_paths.begin());
    if (log_choices) backend::cuda::default_options().log = &std::cerr;
    backend::cuda::default_options().channels_last = !channels_first;
    backend::cuda::default_options().tuning_cache = !no_tuning_cache;
    backend::cuda::default_options().tuning_cache_dir = tuning_cache_dir;
#endif
    auto devices = dev.device_list(backend::default_devices());
    if (processes) devices = parallel::process_devices(*processes, devices);
    Settings s{model, batch, steps, warmup, devices, dev.dispatch_choice(), dev.scaling_choice(), json, blas_threads,
               StepOptions{.reproducible = repro.reproducible, .micro_shard = repro.micro_shard},
               processes.get(), bucket_floats, first_bucket_floats, data_parallel, precision,
               dev.gradient_reduction_choice(), micro_batch, accumulate, peak_tflops, gpt_config, curve};
    for (auto family : {train_bench::run_classic, train_bench::run_inception, train_bench::run_residual,
                        train_bench::run_gpt})
        if (const auto code = family(s)) return *code;
    throw Error("unknown model '" + s.model + "': use lenet, alexnet, alexnet-plain, googlenet, textcnn, fcn, resnet18, "
                "resnet50, resnet20, chargpt or gpt2");
} catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
}
