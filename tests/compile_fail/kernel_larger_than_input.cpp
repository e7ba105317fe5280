// expect: Conv2d kernel is larger than its (padded) input
#include "replica/replica.hpp"
using namespace replica;
using Bad = Sequential<Input<1, 4, 4>, Conv2d<8, 5>>;
static_assert(Bad::param_count > 0);
