// expect: Embedding reads token ids: it must be the first layer of the outermost model
#include "replica/replica.hpp"
using namespace replica;
int main()
{
    Sequential<Input<Tokens<4>>, Embedding<10, 8>, Linear<8>, Embedding<10, 8>, Linear<10>, SequenceCrossEntropy> bad{Device::cpu()};
}
