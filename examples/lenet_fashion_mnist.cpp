// The main job: LeNet on Fashion-MNIST, data-parallel on every device auto_parallel finds (every GPU,
// or the CPU), or on the devices you name.
//
//   lenet_fashion_mnist --epochs 8                       # every GPU (or CPU core), the fastest way
//   lenet_fashion_mnist --devices cpu:0,cpu:1 --dispatch threaded --scaling weak
//   mpirun -np 2 lenet_fashion_mnist                     # two processes, each with half the devices

#include <cstdio>
#include <exception>

#include "replica/data/fashion_mnist.hpp"
#include "replica/replica.hpp"
#include "replica/train/trainer.hpp"
#include "support/args.hpp"
#include "support/processes.hpp"

using namespace replica;

int main(int argc, char** argv)
try {
    const auto processes = examples::launched_processes(argc, argv);   // under mpirun or srun
    examples::Args args("lenet_fashion_mnist", "train LeNet on Fashion-MNIST, data-parallel over the given devices");
    args.option("epochs", "8", "passes over the 60,000 training images")
        .option("batch-size", "64", "batch size (global with --scaling strong, per device with weak)")
        .option("lr", "0.01", "learning rate")
        .option("momentum", "0.9", "SGD momentum")
        .option("weight-decay", "0", "SGD weight decay")
        .option("seed", "1", "seed for initialisation, shuffling and dropout")
        .option("data", data::default_fashion_mnist_dir().string(), "folder with the Fashion-MNIST IDX files")
        .option("validate-every", "1", "validate every N epochs (0: never)")
        .option("checkpoint", "", "checkpoint file, written every --checkpoint-every epochs")
        .option("checkpoint-every", "1", "epochs between checkpoints")
        .flag("resume", "continue from --checkpoint if it exists")
        .option("devices", "all", "all (every GPU, or one CPU replica per core), or a list such as cpu:0,cpu:1 or "
                                  "cuda:0; under mpirun each process takes its share of them")
        .option("dispatch", "auto", "auto: time each choice (1..N devices, each policy) and keep the fastest; "
                                    "or single, threaded")
        .option("scaling", "strong", "strong: --batch-size is global; weak: --batch-size is per device")
        .flag("scale-lr", "with --scaling weak, multiply the learning rate by the device count")
        .flag("reproducible", "bit-identical results on any number of (CPU) devices and across runs")
        .option("micro-shard", "8", "samples per micro-shard in --reproducible mode");
    args.parse(argc, argv);

    auto devices = args.str("devices") == "all" ? all_devices() : parse_devices(args.str("devices"));
    if (processes) devices = parallel::process_devices(*processes, devices);
    const auto train_set = data::load_fashion_mnist(data::Split::train, args.str("data"));
    const auto test_set = data::load_fashion_mnist(data::Split::test, args.str("data"));

    const auto scaling = parallel::parse_scaling(args.str("scaling"));
    auto model = auto_parallel(LeNet{devices, /*seed=*/std::uint64_t(args.integer("seed"))}, devices,
                               {.dispatch = parallel::parse_dispatch(args.str("dispatch")),
                                .data_parallel = {.processes = processes.get()},
                                .batch_size = args.count("batch-size"),
                                .scaling = scaling});
    SGD opt{{.lr = float(args.real("lr")), .momentum = float(args.real("momentum")),
             .weight_decay = float(args.real("weight-decay"))}};
    Trainer trainer{model, opt,
                    {.batch_size = args.count("batch-size"),
                     .epochs = args.count("epochs"),
                     .scaling = scaling,
                     .scale_lr = args.on("scale-lr"),
                     .validate_every = args.count("validate-every"),
                     .seed = std::uint64_t(args.integer("seed")),
                     .checkpoint = args.str("checkpoint"),
                     .checkpoint_every = args.count("checkpoint-every"),
                     .resume = args.on("resume"),
                     .reproducible = args.on("reproducible"),
                     .micro_shard = args.count("micro-shard")}};

    const bool first = model.process_rank() == 0;   // one process prints
    if (first)
        std::printf("LeNet (%zu parameters) on %s%s; batch %zu (%s scaling: global batch %zu)\n", LeNet::param_count,
                    model.description().c_str(),
                    processes ? (" in each of " + std::to_string(processes->size()) + " processes").c_str() : "",
                    args.count("batch-size"), args.str("scaling").c_str(), trainer.global_batch());
    trainer.fit(train_set, test_set);
    const Metrics test = evaluate(model, test_set);
    if (first) std::printf("test accuracy: %.4f\n", test.accuracy);
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
}
