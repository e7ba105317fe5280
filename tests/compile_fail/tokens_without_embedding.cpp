// expect: a model of token ids (Input<Tokens<T>>) begins with a layer that reads them
#include "replica/replica.hpp"
using namespace replica;
int main()
{
    Sequential<Input<Tokens<4>>, Linear<8>, Linear<10>> bad{Device::cpu()};
}
