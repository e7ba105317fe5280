// expect: TiedHead<E>: two layers before it are E
#include "replica/replica.hpp"
using namespace replica;
int main()
{
    // A model holds one Embedding (the first layer): the parts of a chain alone show the refusal.
    using Wte = Embedding<10, 4>;
    model::Parts<Wte::op<Shape<8>>, Wte::op<Shape<8>>, TiedHead<Wte>::op<Shape<8, 4>>> bad{model::Build{}};
}
