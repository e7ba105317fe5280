// expect: cannot update a Pipeline yet
#include "replica/replica.hpp"
using namespace replica;
using Net = Sequential<Input<16>, Linear<8>, ReLU, Linear<4>>;
int main()
{
    Pipeline<Net, Cuts<2>> model{{Device::cpu(0), Device::cpu(1)}};
    model.update(Accumulate{LossScale{SGD{{.lr = 0.1f}}}, 2});
}
