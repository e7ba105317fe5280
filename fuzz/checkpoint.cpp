// libFuzzer target: load_checkpoint on arbitrary bytes into a small model. Every input must either
// load or throw replica::Error, and a refused file must leave the model untouched.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "fuzz_file.hpp"
#include "replica/layers/activation.hpp"
#include "replica/layers/linear.hpp"
#include "replica/model/input.hpp"
#include "replica/model/sequential.hpp"
#include "replica/train/checkpoint.hpp"

namespace {
// Small, so that a valid checkpoint is a few hundred bytes and the fuzzer can reach it.
using Net = replica::Sequential<replica::Input<4>, replica::Linear<3>, replica::ReLU, replica::Linear<2>>;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size)
{
    static replica::fuzz::ScratchFile file(".ckpt");
    static Net model{replica::Device::cpu(), 1};
    static const std::vector<float> initial = model.parameters();
    const auto& path = file.write(data, size);
    try {
        replica::load_checkpoint(path, model, {.max_epoch = 1000, .steps_per_epoch = 0, .state_per_param = 1});
        model.set_parameters(initial);
    } catch (const replica::Error&) {
        if (model.parameters() != initial) std::abort();   // a refused file changed the model
    }
    return 0;
}
