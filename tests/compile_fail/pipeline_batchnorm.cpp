// expect: a Pipeline cannot hold BatchNorm yet
#include "replica/replica.hpp"
using namespace replica;
using Net = Sequential<Input<1, 8, 8>, Conv2d<4, 3>, BatchNorm2d, ReLU, Flatten, Linear<10>>;
int main()
{
    Pipeline<Net, Cuts<3>> bad{{Device::cpu(0), Device::cpu(1)}};
}
