// The main job: LeNet on Fashion-MNIST, data-parallel on every device auto_parallel finds (every GPU,
// or the CPU), or on the devices you name.
//
//   lenet_fashion_mnist --epochs 8                       # every GPU (or CPU core), the fastest way
//   lenet_fashion_mnist --devices cpu:0,cpu:1 --dispatch threaded --scaling weak
//   mpirun -np 2 lenet_fashion_mnist                     # two processes, each with half the devices
//
// Exit status: 0 trained, 1 refused or failed (the message says why), 2 a bad command line.

#include <cstdio>
#include <exception>

#include "replica/data/fashion_mnist.hpp"
#include "replica/replica.hpp"
#include "replica/train/trainer.hpp"
#include "support/cli.hpp"
#include "support/processes.hpp"

using namespace replica;

int main(int argc, char** argv)
try {
    const auto processes = examples::launched_processes(argc, argv);   // under mpirun or srun
    CLI::App app{"train LeNet on Fashion-MNIST, data-parallel over the given devices", "lenet_fashion_mnist"};
    std::size_t epochs = 8, batch_size = 64, validate_every = 1, checkpoint_every = 1, train_samples = 0,
                test_samples = 0;
    float lr = 0.01f, momentum = 0.9f, weight_decay = 0.0f;
    std::uint64_t seed = 1;
    std::string data_dir = data::default_fashion_mnist_dir().string(), checkpoint;
    bool resume = false, scale_lr = false, skip_nonfinite = false;
    examples::DeviceFlags dev;
    examples::ReproducibleFlags repro;
    examples::count_option(app, "--epochs", epochs, "passes over the training images", 1, 1000000);
    examples::count_option(app, "--batch-size", batch_size,
                           "batch size (global with --scaling strong, per device with weak)", 1, 60000);
    examples::real_option(app, "--lr", lr, "learning rate", 1e-12, 1e3);
    examples::real_option(app, "--momentum", momentum, "SGD momentum", 0.0, 0.999999);
    examples::real_option(app, "--weight-decay", weight_decay, "SGD weight decay", 0.0, 1.0);
    examples::count_option(app, "--seed", seed, "seed for initialisation, shuffling and dropout", 0,
                           std::numeric_limits<std::uint64_t>::max());
    app.add_option("--data", data_dir, "folder with the Fashion-MNIST IDX files")
        ->check(examples::not_empty)
        ->capture_default_str();
    examples::count_option(app, "--train-samples", train_samples,
                           "train on the first N training images only (0: all 60,000)", 0, 60000);
    examples::count_option(app, "--test-samples", test_samples,
                           "validate and test on the first N test images only (0: all 10,000)", 0, 10000);
    examples::count_option(app, "--validate-every", validate_every, "validate every N epochs (0: never)", 0, 1000000);
    app.add_option("--checkpoint", checkpoint, "checkpoint file, written every --checkpoint-every epochs")
        ->check(examples::not_empty);
    examples::count_option(app, "--checkpoint-every", checkpoint_every, "epochs between checkpoints", 1, 1000000);
    app.add_flag("--resume", resume, "continue from --checkpoint if it exists")->needs("--checkpoint");
    app.add_flag("--skip-nonfinite", skip_nonfinite,
                 "undo and skip a step whose loss is NaN or infinite (default: stop with an error)");
    dev.add(app, "all (every GPU, or one CPU replica per hardware thread)", {"auto", "single", "threaded"});
    app.add_flag("--scale-lr", scale_lr, "with --scaling weak, multiply the learning rate by the device count");
    repro.add(app);
    if (int code = examples::parse(app, argc, argv)) return code - 1;

    auto devices = dev.device_list(all_devices());
    if (processes) devices = parallel::process_devices(*processes, devices);
    auto train_set = data::load_fashion_mnist(data::Split::train, data_dir);
    auto test_set = data::load_fashion_mnist(data::Split::test, data_dir);
    if (train_samples) train_set = train_set.slice(0, std::min(train_samples, train_set.count));
    if (test_samples) test_set = test_set.slice(0, std::min(test_samples, test_set.count));

    const auto scaling = dev.scaling_choice();
    const std::size_t global = examples::checked_global_batch(batch_size, devices.size(), scaling, train_set.count);
    auto model = auto_parallel(LeNet{devices, seed}, devices,
                               {.dispatch = dev.dispatch_choice(),
                                .data_parallel = {.processes = processes.get()},
                                .batch_size = batch_size,
                                .scaling = scaling});
    SGD opt{{.lr = lr, .momentum = momentum, .weight_decay = weight_decay}};
    Trainer trainer{model, opt,
                    {.batch_size = batch_size,
                     .epochs = epochs,
                     .scaling = scaling,
                     .scale_lr = scale_lr,
                     .validate_every = validate_every,
                     .seed = seed,
                     .checkpoint = checkpoint,
                     .checkpoint_every = checkpoint_every,
                     .resume = resume,
                     .reproducible = repro.reproducible,
                     .skip_nonfinite = skip_nonfinite,
                     .micro_shard = repro.micro_shard}};

    const bool first = model.process_rank() == 0;   // one process prints
    if (first)
        std::printf("LeNet (%zu parameters) on %s%s; batch %zu (%s scaling: global batch %zu)\n", LeNet::param_count,
                    model.description().c_str(),
                    processes ? (" in each of " + std::to_string(processes->size()) + " processes").c_str() : "",
                    batch_size, dev.scaling.c_str(), global);
    const History history = trainer.fit(train_set, test_set);
    if (first && history.skipped_steps)
        std::printf("%zu steps skipped for a NaN or infinite loss\n", history.skipped_steps);
    const Metrics test = evaluate(model, test_set);
    if (first) std::printf("test accuracy: %.4f\n", test.accuracy);
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
}
