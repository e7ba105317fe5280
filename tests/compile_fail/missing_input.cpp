// expect: a model needs Input<...> as its first entry
#include "replica/replica.hpp"
using namespace replica;
int main()
{
    Sequential<Conv2d<8, 3>, ReLU> bad{Device::cpu()};
}
