// expect: cumulative averages the running estimates, which track_running_stats = false
#include "replica/replica.hpp"
using namespace replica;
using Net = Sequential<Input<1, 8, 8>, Conv2d<4, 3>,
                       BatchNorm2dWith<BatchNormOptions{.cumulative = true, .track_running_stats = false}>, ReLU,
                       Flatten, Linear<10>>;
int main()
{
    Net net{Device::cpu()};
}
