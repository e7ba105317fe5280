// expect: add a projection shortcut
#include "replica/replica.hpp"
using namespace replica;
using Net = Sequential<Input<4, 8, 8>, Residual<Sequential<Conv2d<8, 3, 2, 1>, BatchNorm2d>>, Flatten, Linear<10>>;
int main()
{
    Net bad{Device::cpu()};
}
