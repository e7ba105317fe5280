// The main job: LeNet (or ResNet-20) on Fashion-MNIST, data-parallel on every device auto_parallel
// finds (every GPU, or the CPU), or on the devices you name.
//
//   lenet_fashion_mnist --epochs 8                       # every GPU (or CPU core), the fastest way
//   lenet_fashion_mnist --model resnet20                 # BatchNorm and residual blocks: SGD with a
//                                                        # cosine schedule, 15 epochs by default
//   lenet_fashion_mnist --model resnet20 --optimizer adamw
//   lenet_fashion_mnist --devices cpu:0,cpu:1 --dispatch threaded --scaling weak
//   mpirun -np 2 lenet_fashion_mnist                     # two processes, each with half the devices
//   lenet_fashion_mnist --export lenet.onnx              # then the trained model as ONNX (built with
//                                                        # libonnx-dev), and lenet.onnx.reference
//   lenet_fashion_mnist --precision bf16                 # activations in bf16 (GPU builds; fp16 too,
//                                                        # with dynamic loss scaling)
//
// Each model has its own defaults (epochs, batch size, learning rate, weight decay, schedule); the
// flags override them, and the first line printed says what was used.
//
// Exit status: 0 trained, 1 refused or failed (the message says why), 2 a bad command line.

#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <string>

#include "replica/data/fashion_mnist.hpp"
#include "replica/replica.hpp"
#include "replica/train/trainer.hpp"
#include "support/cli.hpp"
#include "support/export.hpp"
#include "support/processes.hpp"

using namespace replica;

namespace {

struct Settings {
    std::string model = "lenet", optimizer = "sgd", schedule, precision = "fp32";
    std::size_t epochs = 0, batch_size = 0, validate_every = 1, checkpoint_every = 1, train_samples = 0,
                test_samples = 0;
    float lr = 0.0f, momentum = 0.9f, weight_decay = -1.0f, warmup = -1.0f;
    std::uint64_t seed = 1;
    std::string data_dir = data::default_fashion_mnist_dir().string(), checkpoint;
    bool resume = false, scale_lr = false, skip_nonfinite = false;
    examples::DeviceFlags dev;
    examples::MemoryFlag memory;
    examples::ReproducibleFlags repro;
    examples::ExportFlag exporter;
    std::unique_ptr<parallel::ProcessGroup> processes;
};

// What a model trains with when the flags do not say: LeNet as the seed trained it; ResNet-20 as
// residual networks are trained (cosine decay after a one-epoch warm-up, weight decay).
void fill_defaults(Settings& s)
{
    const bool resnet = s.model == "resnet20", adamw = s.optimizer == "adamw";
    if (s.epochs == 0) s.epochs = resnet ? 15 : 8;
    if (s.batch_size == 0) s.batch_size = resnet ? 128 : 64;
    if (s.lr == 0.0f) s.lr = adamw ? 1e-3f : resnet ? 0.1f : 0.01f;
    if (s.weight_decay < 0.0f) s.weight_decay = adamw ? 5e-2f : resnet ? 5e-4f : 0.0f;
    if (s.schedule.empty()) s.schedule = resnet ? "cosine" : "fixed";
    if (s.warmup < 0.0f) s.warmup = resnet ? 1.0f : 0.0f;
}

Schedule schedule_of(const Settings& s)
{
    Schedule base = s.schedule == "cosine" ? Schedule::cosine(double(s.epochs)) : Schedule::fixed();
    return s.warmup > 0.0f ? base.with_warmup(double(s.warmup)) : base;
}

template <class Net, class Opt>
int train(Settings& s, Opt opt)
{
    auto devices = s.dev.device_list(all_devices());
    if (s.processes) devices = parallel::process_devices(*s.processes, devices);
    auto train_set = data::load_fashion_mnist(data::Split::train, s.data_dir);
    auto test_set = data::load_fashion_mnist(data::Split::test, s.data_dir);
    if (s.train_samples) train_set = train_set.slice(0, std::min(s.train_samples, train_set.count));
    if (s.test_samples) test_set = test_set.slice(0, std::min(s.test_samples, test_set.count));

    const auto scaling = s.dev.scaling_choice();
    const std::size_t global = examples::checked_global_batch(s.batch_size, devices.size(), scaling, train_set.count);
    auto model = auto_parallel(Net{devices, s.seed}, devices,
                               {.dispatch = s.dev.dispatch_choice(),
                                .data_parallel = {.gradient_reduction = s.dev.gradient_reduction_choice(), .processes = s.processes.get()},
                                .batch_size = s.batch_size,
                                .scaling = scaling,
                                .memory_budget = s.memory.bytes(),
                                .state_per_param = 1});   // SGD's momentum
    Trainer trainer{model, opt,
                    {.batch_size = s.batch_size,
                     .epochs = s.epochs,
                     .scaling = scaling,
                     .scale_lr = s.scale_lr,
                     .validate_every = s.validate_every,
                     .seed = s.seed,
                     .checkpoint = s.checkpoint,
                     .checkpoint_every = s.checkpoint_every,
                     .resume = s.resume,
                     .schedule = schedule_of(s),
                     .reproducible = s.repro.reproducible,
                     .skip_nonfinite = s.skip_nonfinite,
                     .micro_shard = s.repro.micro_shard,
                     .loss_scale = s.precision == "fp16" ? std::optional<LossScaleOptions>(LossScaleOptions{})
                                                         : std::nullopt}};

    const bool first = model.process_rank() == 0;   // one process prints
    if (first)
        std::printf("%s (%zu parameters, %s) on %s%s; batch %zu (%s scaling: global batch %zu); %s lr %g, weight decay "
                    "%g, %s schedule%s, %zu epochs\n",
                    s.model == "resnet20" ? "ResNet-20" : "LeNet", Net::param_count, s.precision.c_str(),
                    model.description().c_str(),
                    s.processes ? (" in each of " + std::to_string(s.processes->size()) + " processes").c_str() : "",
                    s.batch_size, s.dev.scaling.c_str(), global, s.optimizer == "adamw" ? "AdamW" : "SGD",
                    double(s.lr), double(s.weight_decay), s.schedule.c_str(),
                    s.warmup > 0.0f ? (" after " + std::to_string(s.warmup).substr(0, 4) + " epochs of warm-up").c_str() : "",
                    s.epochs);
    const History history = trainer.fit(train_set, test_set);
    if (first && history.skipped_steps)
        std::printf("%zu steps skipped for a NaN or infinite loss\n", history.skipped_steps);
    const Metrics test = evaluate(model, test_set);
    if (first) std::printf("test accuracy: %.4f\n", test.accuracy);
    if (first) s.exporter.write(model, test_set);
    return 0;
}

template <class Net>
int train_with_optimizer(Settings& s)
{
    if (s.optimizer == "adamw") return train<Net>(s, AdamW{{.lr = s.lr, .weight_decay = s.weight_decay}});
    return train<Net>(s, SGD{{.lr = s.lr, .momentum = s.momentum, .weight_decay = s.weight_decay}});
}

// The network in the precision asked for. bf16 and fp16 are built into the CUDA program only: on the
// CPU they compute in fp32 and round where a GPU stores (the tests check that), which is slower.
template <class Net>
int train_in(Settings& s)
{
    if (s.precision == "fp32") return train_with_optimizer<Net>(s);
#if defined(REPLICA_CUDA)
    if (s.precision == "bf16") return train_with_optimizer<with_precision<Net, bf16>>(s);
    if (s.precision == "fp16") return train_with_optimizer<with_precision<Net, fp16>>(s);
#endif
    throw Error("--precision " + s.precision + ": this program is built for fp32 only; the CUDA build "
                "(lenet_fashion_mnist_cuda) has bf16 and fp16");
}

} // namespace

int main(int argc, char** argv)
try {
    Settings s;
    s.processes = examples::launched_processes(argc, argv);   // under mpirun or srun
    CLI::App app{"train LeNet or ResNet-20 on Fashion-MNIST, data-parallel over the given devices", "lenet_fashion_mnist"};
    app.add_option("--model", s.model, "the network: lenet, or resnet20 (BatchNorm and residual blocks)")
        ->check(CLI::IsMember({"lenet", "resnet20"}))
        ->capture_default_str();
    app.add_option("--precision", s.precision, "the activations' type: fp32, bf16, or fp16 with dynamic loss "
                                               "scaling (bf16 and fp16 in the CUDA build); parameters stay fp32")
        ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
        ->capture_default_str();
    app.add_option("--optimizer", s.optimizer, "sgd (with --momentum) or adamw")
        ->check(CLI::IsMember({"sgd", "adamw"}))
        ->capture_default_str();
    // Options whose default depends on the model and optimizer (fill_defaults) show no default here.
    app.add_option("--epochs", s.epochs, "passes over the training images (default: lenet 8, resnet20 15)")
        ->check(examples::whole_number(1, 1000000));
    app.add_option("--batch-size", s.batch_size,
                   "batch size, global with --scaling strong, per device with weak (default: lenet 64, resnet20 128)")
        ->check(examples::whole_number(1, 60000));
    app.add_option("--lr", s.lr, "learning rate (default: sgd 0.01 for lenet and 0.1 for resnet20, adamw 0.001)")
        ->check(examples::real_number(1e-12, 1e3));
    examples::real_option(app, "--momentum", s.momentum, "SGD momentum", 0.0, 0.999999);
    app.add_option("--weight-decay", s.weight_decay,
                   "weight decay: in the gradient for sgd, decoupled for adamw (default: lenet 0, resnet20 5e-4, "
                   "adamw 0.05)")
        ->check(examples::real_number(0.0, 1.0));
    app.add_option("--schedule", s.schedule, "learning-rate schedule: fixed, or cosine decay to 0 over the epochs "
                                             "(default: lenet fixed, resnet20 cosine)")
        ->check(CLI::IsMember({"fixed", "cosine"}));
    app.add_option("--warmup", s.warmup, "epochs of linear warm-up before the schedule (default: lenet 0, resnet20 1)")
        ->check(examples::real_number(0.0, 1000.0));
    examples::count_option(app, "--seed", s.seed, "seed for initialisation, shuffling and dropout", 0,
                           std::numeric_limits<std::uint64_t>::max());
    app.add_option("--data", s.data_dir, "folder with the Fashion-MNIST IDX files")
        ->check(examples::not_empty)
        ->capture_default_str();
    examples::count_option(app, "--train-samples", s.train_samples,
                           "train on the first N training images only (0: all 60,000)", 0, 60000);
    examples::count_option(app, "--test-samples", s.test_samples,
                           "validate and test on the first N test images only (0: all 10,000)", 0, 10000);
    examples::count_option(app, "--validate-every", s.validate_every, "validate every N epochs (0: never)", 0, 1000000);
    app.add_option("--checkpoint", s.checkpoint, "checkpoint file, written every --checkpoint-every epochs")
        ->check(examples::not_empty);
    examples::count_option(app, "--checkpoint-every", s.checkpoint_every, "epochs between checkpoints", 1, 1000000);
    app.add_flag("--resume", s.resume, "continue from --checkpoint if it exists")->needs("--checkpoint");
    app.add_flag("--skip-nonfinite", s.skip_nonfinite,
                 "undo and skip a step whose loss is NaN or infinite (default: stop with an error)");
    s.dev.add(app, "all (every GPU, or one CPU replica per hardware thread)", {"auto", "single", "threaded"});
    s.memory.add(app);
    app.add_flag("--scale-lr", s.scale_lr, "with --scaling weak, multiply the learning rate by the device count");
    s.repro.add(app);
    s.exporter.add(app);
    if (int code = examples::parse(app, argc, argv)) return code - 1;
    s.exporter.prepare();
    fill_defaults(s);
    if (s.model == "resnet20") return train_in<ResNet20>(s);
    return train_in<LeNet>(s);
} catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
}
