// expect: the shortcut must map the input to the body's output shape
#include "replica/replica.hpp"
using namespace replica;
using Net = Sequential<Input<4, 8, 8>, Residual<Sequential<Conv2d<8, 3, 2, 1>>, Sequential<Conv2d<8, 1>>>, Flatten, Linear<10>>;
int main()
{
    Net bad{Device::cpu()};
}
