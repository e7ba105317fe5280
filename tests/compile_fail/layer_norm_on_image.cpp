// expect: LayerNorm normalises the last axis of a (features) or (positions, features) input: put Flatten before it
#include "replica/replica.hpp"
using namespace replica;
using Bad = Sequential<Input<2, 4, 4>, LayerNorm<>, Flatten, Linear<4>>;
static_assert(Bad::param_count > 0);
