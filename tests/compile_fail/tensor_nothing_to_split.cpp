// expect: M has nothing to split
#include "replica/replica.hpp"
using namespace replica;
using Net = Sequential<Input<16>, Linear<8>, Dropout<0.5>, Linear<4>>;
int main() { TensorParallel<Net, 2> model{{Device::cpu(0), Device::cpu(1)}}; }
