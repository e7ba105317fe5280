// expect: cannot cut a tied head (TiedHead<E>) away from its Embedding
#include "replica/replica.hpp"
using namespace replica;
int main()
{
    // The head would be in stage 1, its embedding in stage 0.
    Pipeline<GPT<2, 2, 16, 8, 24>, Cuts<3>> bad{{Device::cpu(0), Device::cpu(1)}};
}
