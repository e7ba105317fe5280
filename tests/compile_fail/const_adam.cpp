// expect: this optimizer counts its updates (Adam, AdamW): pass it to train_step as a non-const object
#include "replica/replica.hpp"
using namespace replica;
using Net = Sequential<Input<4>, Linear<2>>;
float step(Net& net, const Batch& b)
{
    const Adam opt{};
    return train_step(net, opt, b);
}
