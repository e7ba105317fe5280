// expect: the features D must be a multiple of Heads
#include "replica/replica.hpp"
using namespace replica;
using Bad = Sequential<Input<5, 8>, CausalSelfAttention<3>, Flatten, Linear<4>>;
static_assert(Bad::param_count > 0);
