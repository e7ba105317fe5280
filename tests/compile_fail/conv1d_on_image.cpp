// expect: Conv1d needs a (channels, length) input
#include "replica/replica.hpp"
using namespace replica;
using Bad = Sequential<Input<3, 32, 32>, Conv1d<8, 3>>;
static_assert(Bad::param_count > 0);
