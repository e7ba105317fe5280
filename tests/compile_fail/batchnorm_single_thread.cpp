// expect: only DataParallel<M, Threaded> can issue
#include "replica/replica.hpp"
using namespace replica;
using Net = Sequential<Input<1, 8, 8>, Conv2d<4, 3>, BatchNorm2d, ReLU, Flatten, Linear<10>>;
int main()
{
    DataParallel<Net, SingleThread> bad{{Device::cpu(0), Device::cpu(1)}};
}
