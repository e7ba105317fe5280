// expect: a TensorParallel's model cannot hold a nested DataParallel
#include "replica/replica.hpp"
using namespace replica;
using Features = Sequential<Input<16>, Linear<16>, ReLU>;
using Net = Sequential<Input<16>, DataParallel<Features, Threaded>, Linear<8>, ReLU, Linear<4>>;
int main() { TensorParallel<Net, 2> model{{Device::cpu(0), Device::cpu(1)}}; }
