// expect: the sequence has more positions than the Context it has vectors for
#include "replica/replica.hpp"
using namespace replica;
int main()
{
    Sequential<Input<Tokens<8>>, Embedding<10, 4>, PositionEmbedding<6>, Linear<10>, SequenceCrossEntropy> bad{Device::cpu()};
}
