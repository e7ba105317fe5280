// expect: this model reads token ids (Input<Tokens<T>>), not floats
#include <vector>

#include "replica/replica.hpp"
using namespace replica;
using Gpt = Sequential<Input<Tokens<4>>, Embedding<10, 8>, Linear<10>, SequenceCrossEntropy>;
int main()
{
    Gpt net{Device::cpu()};
    SGD opt{{.lr = 0.1f}};
    std::vector<float> x(4);
    std::vector<std::int32_t> labels(4);
    train_step(net, opt, Batch{x.data(), labels.data(), 1});
}
