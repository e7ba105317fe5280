// expect: SequenceCrossEntropy needs (positions, classes) outputs
#include <vector>

#include "replica/replica.hpp"
using namespace replica;
int main()
{
    Sequential<Input<6>, Linear<3>, SequenceCrossEntropy> net{Device::cpu()};
    std::vector<float> x(6);
    std::vector<std::int32_t> labels(1);
    net.evaluate(x.data(), labels.data(), 1);
}
