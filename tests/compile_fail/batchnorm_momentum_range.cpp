// expect: momentum is the fraction of the way the running estimates move, in [0, 1]
#include "replica/replica.hpp"
using namespace replica;
using Net = Sequential<Input<1, 8, 8>, Conv2d<4, 3>, BatchNorm2dWith<BatchNormOptions{.momentum = 1.5f}>, ReLU,
                       Flatten, Linear<10>>;
int main()
{
    Net net{Device::cpu()};
}
