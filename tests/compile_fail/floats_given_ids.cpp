// expect: this model reads floats (Input<Dims...>), not token ids
#include <vector>

#include "replica/replica.hpp"
using namespace replica;
using Net = Sequential<Input<4>, Linear<3>>;
int main()
{
    Net net{Device::cpu()};
    TokenDataset set{std::vector<std::int32_t>(4), std::vector<std::int32_t>(1), 1, 4, 1};
    evaluate(net, set);
}
