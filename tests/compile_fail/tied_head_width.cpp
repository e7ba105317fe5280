// expect: its input has other than Dim features a position
#include "replica/replica.hpp"
using namespace replica;
int main()
{
    using Wte = Embedding<10, 4>;
    Sequential<Input<Tokens<8>>, Wte, Linear<6>, TiedHead<Wte>, SequenceCrossEntropy> bad{Device::cpu()};
}
