// expect: pooling window is larger than its input
#include "replica/replica.hpp"
using namespace replica;
using Bad = Sequential<Input<1, 2, 2>, MaxPool2d<3>>;
static_assert(Bad::param_count >= 0);
