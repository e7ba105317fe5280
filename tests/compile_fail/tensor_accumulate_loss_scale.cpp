// expect: cannot update a TensorParallel yet
#include "replica/replica.hpp"
using namespace replica;
using Net = Sequential<Input<16>, Linear<8>, ReLU, Linear<4>>;
int main()
{
    TensorParallel<Net, 2> model{{Device::cpu(0), Device::cpu(1)}};
    model.update(Accumulate{LossScale{ClipGradNorm{SGD{{.lr = 0.1f}}, 1.0f}}, 2});
}
