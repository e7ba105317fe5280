// expect: Ways must divide the Heads of every CausalSelfAttention
#include "replica/replica.hpp"
using namespace replica;
int main() { TensorParallel<models::GPT<1, 3, 24, 8, 32>, 2> model{{Device::cpu(0), Device::cpu(1)}}; }
