// expect: Linear needs a (features) or (positions, features) input: put Flatten before it
#include "replica/replica.hpp"
using namespace replica;
using Bad = Sequential<Input<1, 28, 28>, Conv2d<8, 5>, Linear<10>>;
static_assert(Bad::param_count > 0);
