// Only part of a model replicated, as DIGITS' AlexNet did it: the convolutional features run on every
// device, the classifier on the first. A small AlexNet-like network on synthetic 32x32 images, so that
// it runs on CPU replicas in seconds; AlexNet itself is the same code with AlexNetFeatures and
// AlexNetClassifier (include/replica/models/alexnet.hpp).
//
//   feature_parallel --devices cpu:0,cpu:1 --steps 30
//   feature_parallel --devices cuda:0,cuda:1          (built as feature_parallel_cuda)
//   feature_parallel --export features.onnx           (built with libonnx-dev: ONNX after training)

#include <cstdio>
#include <exception>

#include "replica/replica.hpp"
#include "support/cli.hpp"
#include "support/export.hpp"

using namespace replica;

using Features = Sequential<Input<3, 32, 32>, Conv2d<16, 5, 1, 2>, ReLU, MaxPool2d<2>,
                            Conv2d<32, 3, 1, 1>, ReLU, MaxPool2d<2>>;                     // -> 32x8x8
using Classifier = Sequential<Input<32, 8, 8>, Flatten, Dropout<0.5>, Linear<128>, ReLU, Linear<10>>;
using Net = Sequential<Input<3, 32, 32>, DataParallel<Features, Threaded>, Classifier>;

// auto_parallel sees the nested DataParallel at compile time and leaves the model as it is.
static_assert(std::same_as<decltype(auto_parallel(std::declval<Net>())), Net>);

int main(int argc, char** argv)
try {
    CLI::App app{"a model whose features are replicated and whose classifier is not", "feature_parallel"};
    std::string device_list = "cpu:0,cpu:1";
    std::size_t steps = 30, batch = 64;
    app.add_option("--devices", device_list, "the features' devices, such as cpu:0,cpu:1 or cuda:0,cuda:1; the "
                                             "classifier runs on the first")
        ->check(examples::devices_validator(false))
        ->capture_default_str();
    examples::count_option(app, "--steps", steps, "training steps", 1, 1000000);
    examples::count_option(app, "--batch-size", batch, "global batch size", 1, 4096);
    examples::ExportFlag exporter;
    exporter.add(app);
    if (int code = examples::parse(app, argc, argv)) return code - 1;
    exporter.prepare();
    const auto devices = examples::checked_devices(device_list);

    Net net{devices};   // the nested DataParallel replicates Features over every device of the list
    std::printf("%s: %zu parameters, features on %zu device(s)\n", net.description().c_str(), Net::param_count,
                devices.size());

    // A learnable synthetic task: the class is the brightest of 10 fixed image regions.
    const auto set = data::synthetic_dataset(batch * 8, Net::input_shape::size, 1, 10, 5);
    data::Dataset task = set;
    for (std::size_t i = 0; i < task.count; ++i) {
        const int label = task.labels[i];
        float* x = task.inputs.data() + i * Net::input_shape::size;
        for (std::size_t c = 0; c < 3; ++c)
            for (std::size_t r = 0; r < 3; ++r)
                for (std::size_t q = 0; q < 32; ++q) x[c * 1024 + (3 * label + r) * 32 + q] += 2.0f;
    }
    SGD opt{{.lr = 0.02f, .momentum = 0.9f}};
    data::Loader loader(task, batch, 1);
    float first = 0.0f, loss = 0.0f;
    for (std::size_t s = 0; s < steps;) {
        loader.start_epoch(s / loader.batches_per_epoch());
        while (auto b = loader.next()) {
            loss = train_step(net, opt, *b);
            if (s == 0) first = loss;
            if (++s % 10 == 0) std::printf("step %3zu  loss %.4f\n", s, loss);
            if (s == steps) break;
        }
    }
    const Metrics m = evaluate(net, task);
    std::printf("loss %.4f -> %.4f, training-set accuracy %.3f\n", first, loss, m.accuracy);
    exporter.write(net, task);   // the nested DataParallel's model is written once
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
}
