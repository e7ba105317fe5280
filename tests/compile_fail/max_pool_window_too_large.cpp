// expect: max pooling windows hold at most 65535 elements
#include "replica/replica.hpp"
using namespace replica;
using Bad = Sequential<Input<1, 256, 256>, MaxPool2d<256>>;
static_assert(Bad::param_count >= 0);
