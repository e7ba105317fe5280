// expect: Concat branches must produce outputs of the same rank and spatial size
#include "replica/replica.hpp"
using namespace replica;
using Bad = Sequential<Input<3, 16, 16>, Concat<Conv2d<8, 1>, Conv2d<8, 3>>>;
static_assert(Bad::param_count > 0);
