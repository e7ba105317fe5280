// libFuzzer target: load_checkpoint on arbitrary bytes whose last four are replaced by the right
// CRC-32, so that every input passes the checksum and reaches the checks after it (sizes, signature,
// finiteness, history, the run's expectations). A refused file must leave the model untouched.

#include <zlib.h>

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
using Net = replica::Sequential<replica::Input<4>, replica::Linear<3>, replica::ReLU, replica::Linear<2>>;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size)
{
    static replica::fuzz::ScratchFile file(".ckpt");
    static Net model{replica::Device::cpu(), 1};
    static const std::vector<float> initial = model.parameters();
    std::vector<std::uint8_t> bytes(data, data + size);
    if (size >= 4) {
        const std::uint32_t crc = std::uint32_t(crc32(crc32(0L, Z_NULL, 0), bytes.data(), uInt(size - 4)));
        for (int i = 0; i < 4; ++i) bytes[size - 4 + std::size_t(i)] = std::uint8_t(crc >> (8 * i));
    }
    try {
        replica::load_checkpoint(file.write(bytes.data(), bytes.size()), model,
                                 {.max_epoch = 1000, .steps_per_epoch = 3, .state_per_param = 1});
        model.set_parameters(initial);
    } catch (const replica::Error&) {
        if (model.parameters() != initial) std::abort();   // a refused file changed the model
    }
    return 0;
}
