// expect: TiedHead<E> names an embedding E that is not a layer before it in the same Sequential
#include "replica/replica.hpp"
using namespace replica;
int main()
{
    using Wte = Embedding<10, 4>;
    Sequential<Input<Tokens<8>>, Embedding<10, 4, struct Other>, TiedHead<Wte>, SequenceCrossEntropy> bad{Device::cpu()};
}
