// expect: TensorParallel<M, Ways> runs in float
#include "replica/replica.hpp"
using namespace replica;
using Net = Sequential<Precision<bf16>, Input<16>, Linear<8>, ReLU, Linear<4>>;
int main() { TensorParallel<Net, 2> model{{Device::cpu(0), Device::cpu(1)}}; }
