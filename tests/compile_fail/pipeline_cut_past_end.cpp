// expect: the cuts must increase
#include "replica/replica.hpp"
using namespace replica;
using Net = Sequential<Input<16>, Linear<8>, ReLU, Linear<4>>;
int main()
{
    Pipeline<Net, Cuts<3>> bad{{Device::cpu(0), Device::cpu(1)}};   // stage 2 would have no layer
}
