// A user's program against the installed library: a small model trains one step on a synthetic
// batch, on the CPU, and prints replica's version and the batch's loss before and after the step. scripts/test-install
// builds it through CMake (find_package), pkg-config and a Meson subproject, and compares what each
// prints. It prints __cplusplus too: nothing replica's packages add may lower the user's standard.
// Dropout<0.5> is there on purpose: a float template argument, which needs GCC 12 or Clang 18.
//
// The build system passes the version it found as REPLICA_EXPECTED_VERSION ("0.2.0"); the program
// fails when the headers say otherwise, or when the step does not lower the loss.

#include <cmath>
#include <cstdio>
#include <exception>
#include <string>

#include <replica/replica.hpp>

#ifndef REPLICA_EXPECTED_VERSION
#error "build this with -DREPLICA_EXPECTED_VERSION=\"<the version your build system found>\""
#endif

using namespace replica;

using Net = Sequential<Input<1, 8, 8>, Conv2d<4, 3>, ReLU, MaxPool2d<2>, Flatten, Dropout<0.5>, Linear<4>>;
static_assert(Net::param_count == 4 * 9 + 4 + 4 * 3 * 3 * 4 + 4);

int main()
try {
    const std::string version = std::to_string(REPLICA_VERSION_MAJOR) + "." + std::to_string(REPLICA_VERSION_MINOR) +
                                "." + std::to_string(REPLICA_VERSION_PATCH);
    if (version != REPLICA_EXPECTED_VERSION) {
        std::fprintf(stderr, "error: the headers are replica %s, the build system found %s\n", version.c_str(),
                     REPLICA_EXPECTED_VERSION);
        return 1;
    }
    Net net{Device::cpu()};
    SGD opt{{.lr = 0.05f}};
    const Dataset set = data::synthetic_dataset(16, Net::input_shape::size, 1, 4, 7);
    const Batch batch{set.inputs.data(), set.labels.data(), set.count, 0, 1};
    const float before = evaluate(net, set).loss;
    const float step = train_step(net, opt, batch);   // with dropout, so not equal to `before`
    const float after = evaluate(net, set).loss;
    std::printf("replica %s, C++ %ld: loss %.6f -> %.6f\n", version.c_str(), long(__cplusplus), before, after);
    if (!std::isfinite(step) || !(after < before)) {
        std::fprintf(stderr, "error: one step of SGD did not lower the loss on its own batch\n");
        return 1;
    }
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
}
