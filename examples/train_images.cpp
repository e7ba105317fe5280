// Your own images: a folder sorted by class (root/<class>/*.png|jpg) or CIFAR-10's binary files,
// a standard network, and the loss and accuracy curves written as it trains (as DIGITS did it).
//
//   train_images --data photos/ --model lenet --epochs 10          # 20% of each class validates
//   train_images --data cifar-10-batches-bin/ --model lenet        # CIFAR-10: test_batch.bin validates
//   scripts/plot-history history.csv                                # curves to history.png
//
// The training flags are lenet_fashion_mnist's. Images are fitted to the network's input (grey or
// RGB, its size) and, for training, augmented (random crop of the padded image, flip) on the loader's
// background thread; inputs are normalised with each channel's mean and std over the training images.

#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <limits>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "replica/data/augment.hpp"
#include "replica/data/cifar.hpp"
#include "replica/data/image_folder.hpp"
#include "replica/replica.hpp"
#include "replica/train/trainer.hpp"
#include "support/cli.hpp"
#include "support/export.hpp"
#include "support/processes.hpp"

using namespace replica;

struct Settings {
    std::size_t epochs = 10, batch_size = 64, validate_every = 1, checkpoint_every = 1;
    float lr = 0.01f, momentum = 0.9f, weight_decay = 0.0f;
    std::uint64_t seed = 1;
    std::string data, model = "lenet", checkpoint;
    bool resume = false, scale_lr = false;
    examples::ExportFlag exporter;   // the ONNX model's input is normalised as the validation images are
    examples::DeviceFlags dev;
    examples::MemoryFlag memory;
    examples::ReproducibleFlags repro;
    std::size_t image_size = 0, crop_padding = 0, history_every = 10;
    std::string fit = "resize", history = "history";
    double validation_fraction = 0.2;
    bool flip = false, skip_bad_images = false;
    parallel::ProcessGroup* processes = nullptr;
};

// CIFAR-10's records (3x32x32 in [0, 1]) fitted to another image shape.
data::Dataset fit_dataset(const data::Dataset& set, data::ImageShape from, data::ImageShape to, data::Fit fit)
{
    if (from.channels == to.channels && from.height == to.height && from.width == to.width) return set;
    data::Dataset out{{}, set.labels, set.count, to.size(), set.label_size};
    out.inputs.resize(set.count * to.size());
    data::Image image{from.width, from.height, from.channels, std::vector<std::uint8_t>(from.size())};
    const std::size_t plane = from.height * from.width;
    for (std::size_t s = 0; s < set.count; ++s) {
        const float* x = set.inputs.data() + s * from.size();
        for (std::size_t p = 0; p < plane; ++p)
            for (std::size_t c = 0; c < from.channels; ++c)
                image.pixels[p * from.channels + c] = std::uint8_t(x[c * plane + p] * 255.0f + 0.5f);
        data::fit_image(image, to, fit, out.inputs.data() + s * to.size());
    }
    return out;
}

template <class M>
int run(const Settings& s)
{
    using In = typename M::input_shape;
    static_assert(In::rank == 3, "train_images needs a network whose input is (channels, height, width)");
    const data::ImageShape shape{In::dims[0], In::dims[1], In::dims[2]};
    const std::size_t outputs = M::output_shape::size;
    if (s.image_size && (s.image_size != shape.height || s.image_size != shape.width))
        throw Error("--model " + s.model + " takes " + std::to_string(shape.height) + "x" + std::to_string(shape.width) +
                    " images, not " + std::to_string(s.image_size) + ": leave out --image-size, or choose a model for that size");
    if (s.fit != "resize" && s.fit != "crop") throw Error("--fit must be resize or crop, not '" + s.fit + "'");
    const data::Fit fit = s.fit == "resize" ? data::Fit::resize : data::Fit::centre_crop;
    const bool first = !s.processes || s.processes->rank() == 0;   // one process prints

    // Training samples (decoded, fitted and augmented as the loader reads them) and the validation set.
    std::optional<data::ImageFolder> folder;
    data::Dataset train_images, validation;
    data::SampleSource train_source;
    std::vector<std::string> classes;
    const bool cifar = std::filesystem::exists(std::filesystem::path(s.data) / "data_batch_1.bin");
    if (cifar) {
        train_images = fit_dataset(data::load_cifar10(data::Split::train, s.data), data::cifar10_shape, shape, fit);
        validation = fit_dataset(data::load_cifar10(data::Split::test, s.data), data::cifar10_shape, shape, fit);
        train_source = train_images;
        classes.assign(std::begin(data::cifar10_class_names), std::end(data::cifar10_class_names));
    } else {
        try {
            folder.emplace(s.data, data::ImageFolderOptions{
                                       .channels = shape.channels, .image_size = shape.height, .fit = fit,
                                       .validation_fraction = s.validation_fraction, .seed = s.seed,
                                       .on_error = s.skip_bad_images ? data::OnError::skip : data::OnError::stop,
                                       .log = first ? &std::cerr : nullptr});
        } catch (const Error& e) {   // name this program's option for skipping
            std::string message = e.what();
            const std::string option = "(OnError::skip)";
            if (const auto at = message.find(option); at != std::string::npos) message.replace(at, option.size(), "(--skip-bad-images)");
            throw Error(message);
        }
        if (shape.height != shape.width) throw Error("train_images fits images to square inputs only");
        train_source = folder->train();
        validation = folder->validation();
        classes = folder->classes();
    }
    if (classes.size() > outputs)
        throw Error(s.data + " has " + std::to_string(classes.size()) + " classes, but --model " + s.model + " has " +
                    std::to_string(outputs) + " outputs: choose a model with at least as many");
    const auto train = data::augmented(train_source, shape,
                                       {.crop_padding = s.crop_padding, .flip = s.flip, .seed = s.seed});
    validation = data::normalised(std::move(validation), shape, train.stats);

    auto devices = s.dev.device_list(all_devices());
    if (s.processes) devices = parallel::process_devices(*s.processes, devices);
    const auto scaling = s.dev.scaling_choice();
    examples::checked_global_batch(s.batch_size, devices.size(), scaling, train.count);
    auto model = auto_parallel(M{devices, s.seed}, devices,
                               {.dispatch = s.dev.dispatch_choice(),
                                .data_parallel = {.gradient_reduction = s.dev.gradient_reduction_choice(), .processes = s.processes},
                                .batch_size = s.batch_size,
                                .scaling = scaling,
                                .memory_budget = s.memory.bytes(),
                                .state_per_param = 1});   // SGD's momentum
    SGD opt{{.lr = s.lr, .momentum = s.momentum, .weight_decay = s.weight_decay}};
    const std::string csv = s.history.empty() ? "" : s.history + ".csv";
    const std::string json = s.history.empty() ? "" : s.history + ".json";
    Trainer trainer{model, opt,
                    {.batch_size = s.batch_size,
                     .epochs = s.epochs,
                     .scaling = scaling,
                     .scale_lr = s.scale_lr,
                     .validate_every = validation.count ? s.validate_every : 0,
                     .seed = s.seed,
                     .checkpoint = s.checkpoint,
                     .checkpoint_every = s.checkpoint_every,
                     .resume = s.resume,
                     .reproducible = s.repro.reproducible,
                     .micro_shard = s.repro.micro_shard,
                     .history_csv = csv,
                     .history_json = json,
                     .history_every = s.history_every}};
    if (first) {
        std::printf("%s (%zu parameters, %zux%zux%zu input) on %s; %zu classes, %zu training images, %zu validating%s\n",
                    s.model.c_str(), M::param_count, shape.channels, shape.height, shape.width,
                    model.description().c_str(), classes.size(), train.count, validation.count,
                    cifar ? " (CIFAR-10)" : "");
        std::printf("batch %zu (%s scaling: global batch %zu); %s\n", s.batch_size, s.dev.scaling.c_str(),
                    trainer.global_batch(), csv.empty() ? "no history files" : ("history in " + csv + " and " + json).c_str());
    }
    trainer.fit(train, validation);
    if (validation.count) {
        const Metrics m = evaluate(model, validation);
        if (first) std::printf("validation accuracy: %.4f\n", m.accuracy);
    }
    if (first && !csv.empty()) std::printf("plot the curves: scripts/plot-history %s\n", csv.c_str());
    if (first) s.exporter.write(model, validation);
    return 0;
}

// The networks this example trains; one line each.
const std::map<std::string, std::function<int(const Settings&)>> networks = {
    {"lenet", run<LeNet>},
    {"alexnet", run<AlexNetPlain>},
    {"googlenet", run<GoogLeNet>},
};

int main(int argc, char** argv)
try {
    const auto processes = examples::launched_processes(argc, argv);   // under mpirun or srun
    Settings s;
    s.processes = processes.get();
    std::string names;
    std::vector<std::string> model_names;
    for (const auto& [name, _] : networks) {
        names += (names.empty() ? "" : ", ") + name;
        model_names.push_back(name);
    }

    CLI::App app{"train a standard network on a folder of images sorted by class (root/<class>/*.png|jpg) or on "
                 "CIFAR-10's binary files, and write the loss and accuracy curves"};
    app.add_option("--data", s.data, "folder of class folders, or of CIFAR-10's data_batch_*.bin and test_batch.bin")
        ->required()
        ->check(examples::not_empty);
    app.add_option("--model", s.model, "the network")->check(CLI::IsMember(model_names))->capture_default_str();
    examples::count_option(app, "--image-size", s.image_size,
                           "the network's input size (0: the model's; another is an error)", 0, 1u << 16);
    app.add_option("--fit", s.fit, "resize (each axis to the size) or crop (centre square, then resize)")
        ->check(CLI::IsMember({"resize", "crop"}))
        ->capture_default_str();
    app.add_option("--validation-fraction", s.validation_fraction, "of each class's images, kept out to validate")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 0.99));
    examples::count_option(app, "--crop-padding", s.crop_padding,
                           "augment: random crop of the image padded by this many pixels (0: off)", 0, 1u << 10);
    app.add_flag("--flip", s.flip, "augment: mirror half the images left-right");
    app.add_flag("--skip-bad-images", s.skip_bad_images, "leave out (and name) images that cannot be decoded, instead of stopping");
    app.add_option("--history", s.history, "write the curves to PREFIX.csv and PREFIX.json (empty: not written)")
        ->capture_default_str();
    examples::count_option(app, "--history-every", s.history_every,
                           "a training-loss point every N steps (0: per epoch only)", 0, 1000000000);
    examples::count_option(app, "--epochs", s.epochs, "passes over the training images", 1, 1000000);
    examples::count_option(app, "--batch-size", s.batch_size,
                           "batch size (global with --scaling strong, per device with weak)", 1, 1u << 24);
    examples::real_option(app, "--lr", s.lr, "learning rate", 1e-12, 1e3);
    examples::real_option(app, "--momentum", s.momentum, "SGD momentum", 0.0, 0.999999);
    examples::real_option(app, "--weight-decay", s.weight_decay, "SGD weight decay", 0.0, 1.0);
    examples::count_option(app, "--seed", s.seed, "seed for initialisation, the split, shuffling, augmentation and dropout",
                           0, std::numeric_limits<std::uint64_t>::max());
    examples::count_option(app, "--validate-every", s.validate_every, "validate every N epochs (0: never)", 0, 1000000);
    app.add_option("--checkpoint", s.checkpoint, "checkpoint file, written every --checkpoint-every epochs")
        ->check(examples::not_empty);
    examples::count_option(app, "--checkpoint-every", s.checkpoint_every, "epochs between checkpoints", 1, 1000000);
    app.add_flag("--resume", s.resume, "continue from --checkpoint if it exists")->needs("--checkpoint");
    s.dev.add(app, "all (every GPU, or one CPU replica per hardware thread)", {"auto", "single", "threaded"});
    s.memory.add(app);
    app.add_flag("--scale-lr", s.scale_lr, "with --scaling weak, multiply the learning rate by the device count");
    s.repro.add(app);
    s.exporter.add(app);
    if (int code = examples::parse(app, argc, argv)) return code - 1;
    s.exporter.prepare();

    const auto it = networks.find(s.model);
    if (it == networks.end()) throw Error("unknown --model '" + s.model + "': use " + names);
    return it->second(s);
} catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
}
