// expect: Decoder and generate need a token model
#include <cstdint>
#include <vector>

#include "replica/replica.hpp"
using namespace replica;
int main()
{
    Sequential<Input<6, 8>, Linear<8>, Linear<3>, SequenceCrossEntropy> net{Device::cpu()};
    const std::vector<std::int32_t> prompt = {1};
    generate(net, prompt, 2);
}
