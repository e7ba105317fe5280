// expect: only DataParallel<M, Threaded> can issue
// BatchNorm under a nested DataParallel sums its statistics over the nested replicas inside the step.
#include "replica/replica.hpp"
using namespace replica;
using Features = Sequential<Input<1, 8, 8>, Conv2d<4, 3>, BatchNorm2d, ReLU>;
using Net = Sequential<Input<1, 8, 8>, DataParallel<Features, SingleThread>, Flatten, Linear<10>>;
int main()
{
    Net bad{{Device::cpu(0), Device::cpu(1)}};
}
