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
#include "support/processes.hpp"

using namespace replica;

struct Settings {
    std::size_t epochs = 10, batch_size = 64, validate_every = 1, checkpoint_every = 1, micro_shard = 8;
    double lr = 0.01, momentum = 0.9, weight_decay = 0.0;
    long long seed = 1;
    std::string data, model = "lenet", checkpoint, devices = "all", dispatch = "auto", scaling = "strong";
    bool resume = false, scale_lr = false, reproducible = false;
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
                                       .validation_fraction = s.validation_fraction, .seed = std::uint64_t(s.seed),
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
                                       {.crop_padding = s.crop_padding, .flip = s.flip, .seed = std::uint64_t(s.seed)});
    validation = data::normalised(std::move(validation), shape, train.stats);

    auto devices = s.devices == "all" ? all_devices() : parse_devices(s.devices);
    if (s.processes) devices = parallel::process_devices(*s.processes, devices);
    const auto scaling = parallel::parse_scaling(s.scaling);
    auto model = auto_parallel(M{devices, std::uint64_t(s.seed)}, devices,
                               {.dispatch = parallel::parse_dispatch(s.dispatch),
                                .data_parallel = {.processes = s.processes},
                                .batch_size = s.batch_size,
                                .scaling = scaling});
    SGD opt{{.lr = float(s.lr), .momentum = float(s.momentum), .weight_decay = float(s.weight_decay)}};
    const std::string csv = s.history.empty() ? "" : s.history + ".csv";
    const std::string json = s.history.empty() ? "" : s.history + ".json";
    Trainer trainer{model, opt,
                    {.batch_size = s.batch_size,
                     .epochs = s.epochs,
                     .scaling = scaling,
                     .scale_lr = s.scale_lr,
                     .validate_every = validation.count ? s.validate_every : 0,
                     .seed = std::uint64_t(s.seed),
                     .checkpoint = s.checkpoint,
                     .checkpoint_every = s.checkpoint_every,
                     .resume = s.resume,
                     .reproducible = s.reproducible,
                     .micro_shard = s.micro_shard,
                     .history_csv = csv,
                     .history_json = json,
                     .history_every = s.history_every}};
    if (first) {
        std::printf("%s (%zu parameters, %zux%zux%zu input) on %s; %zu classes, %zu training images, %zu validating%s\n",
                    s.model.c_str(), M::param_count, shape.channels, shape.height, shape.width,
                    model.description().c_str(), classes.size(), train.count, validation.count,
                    cifar ? " (CIFAR-10)" : "");
        std::printf("batch %zu (%s scaling: global batch %zu); %s\n", s.batch_size, s.scaling.c_str(),
                    trainer.global_batch(), csv.empty() ? "no history files" : ("history in " + csv + " and " + json).c_str());
    }
    trainer.fit(train, validation);
    if (validation.count) {
        const Metrics m = evaluate(model, validation);
        if (first) std::printf("validation accuracy: %.4f\n", m.accuracy);
    }
    if (first && !csv.empty()) std::printf("plot the curves: scripts/plot-history %s\n", csv.c_str());
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
    for (const auto& [name, _] : networks) names += (names.empty() ? "" : ", ") + name;

    CLI::App app{"train a standard network on a folder of images sorted by class (root/<class>/*.png|jpg) or on "
                 "CIFAR-10's binary files, and write the loss and accuracy curves"};
    app.add_option("--data", s.data, "folder of class folders, or of CIFAR-10's data_batch_*.bin and test_batch.bin")->required();
    app.add_option("--model", s.model, "the network: " + names)->capture_default_str();
    app.add_option("--image-size", s.image_size, "the network's input size (default: the model's; another is an error)");
    app.add_option("--fit", s.fit, "resize (each axis to the size) or crop (centre square, then resize)")->capture_default_str();
    app.add_option("--validation-fraction", s.validation_fraction, "of each class's images, kept out to validate")
        ->capture_default_str()->check(CLI::Range(0.0, 0.99));
    app.add_option("--crop-padding", s.crop_padding, "augment: random crop of the image padded by this many pixels (0: off)")
        ->capture_default_str();
    app.add_flag("--flip", s.flip, "augment: mirror half the images left-right");
    app.add_flag("--skip-bad-images", s.skip_bad_images, "leave out (and name) images that cannot be decoded, instead of stopping");
    app.add_option("--history", s.history, "write the curves to PREFIX.csv and PREFIX.json (empty: not written)")
        ->capture_default_str();
    app.add_option("--history-every", s.history_every, "a training-loss point every N steps (0: per epoch only)")
        ->capture_default_str();
    app.add_option("--epochs", s.epochs, "passes over the training images")->capture_default_str();
    app.add_option("--batch-size", s.batch_size, "batch size (global with --scaling strong, per device with weak)")
        ->capture_default_str();
    app.add_option("--lr", s.lr, "learning rate")->capture_default_str();
    app.add_option("--momentum", s.momentum, "SGD momentum")->capture_default_str();
    app.add_option("--weight-decay", s.weight_decay, "SGD weight decay")->capture_default_str();
    app.add_option("--seed", s.seed, "seed for initialisation, the split, shuffling, augmentation and dropout")
        ->capture_default_str();
    app.add_option("--validate-every", s.validate_every, "validate every N epochs (0: never)")->capture_default_str();
    app.add_option("--checkpoint", s.checkpoint, "checkpoint file, written every --checkpoint-every epochs");
    app.add_option("--checkpoint-every", s.checkpoint_every, "epochs between checkpoints")->capture_default_str();
    app.add_flag("--resume", s.resume, "continue from --checkpoint if it exists");
    app.add_option("--devices", s.devices, "all (every GPU, or one CPU replica per core), or a list such as "
                                           "cpu:0,cpu:1 or cuda:0; under mpirun each process takes its share of them")
        ->capture_default_str();
    app.add_option("--dispatch", s.dispatch, "auto: time each choice and keep the fastest; or single, threaded")
        ->capture_default_str();
    app.add_option("--scaling", s.scaling, "strong: --batch-size is global; weak: --batch-size is per device")
        ->capture_default_str();
    app.add_flag("--scale-lr", s.scale_lr, "with --scaling weak, multiply the learning rate by the device count");
    app.add_flag("--reproducible", s.reproducible, "bit-identical results on any number of (CPU) devices and across runs");
    app.add_option("--micro-shard", s.micro_shard, "samples per micro-shard in --reproducible mode")->capture_default_str();
    CLI11_PARSE(app, argc, argv);

    const auto it = networks.find(s.model);
    if (it == networks.end()) throw Error("unknown --model '" + s.model + "': use " + names);
    return it->second(s);
} catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
}
