// expect: CausalSelfAttention needs a (positions, features) input
#include "replica/replica.hpp"
using namespace replica;
using Bad = Sequential<Input<2, 4, 4>, CausalSelfAttention<2>, Flatten, Linear<4>>;
static_assert(Bad::param_count > 0);
