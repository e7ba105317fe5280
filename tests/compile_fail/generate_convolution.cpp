// expect: generate runs a token model one position at a time, and this layer has no decode
#include <cstdint>
#include <vector>

#include "replica/replica.hpp"
using namespace replica;
int main()
{
    // A convolution mixes positions: it has no decode (layers/decode.hpp).
    Sequential<Input<Tokens<8>>, Embedding<16, 8>, Conv1d<8, 1>, Linear<16>, SequenceCrossEntropy> net{Device::cpu()};
    const std::vector<std::int32_t> prompt = {1};
    generate(net, prompt, 2);
}
