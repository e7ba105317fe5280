// expect: a loss ends the outermost model only
#include "replica/replica.hpp"
using namespace replica;
using Head = Sequential<Flatten, Linear<10>, SoftmaxCrossEntropy>;
int main()
{
    Sequential<Input<1, 8, 8>, Conv2d<4, 3>, Head> bad{Device::cpu()};
}
