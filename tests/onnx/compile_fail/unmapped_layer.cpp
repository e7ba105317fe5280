// expect: this layer has no ONNX mapping
#include "replica/onnx/export.hpp"
#include "replica/replica.hpp"
using namespace replica;
// A layer of the user's own, with no replica::onnx::Mapping specialisation.
struct Swish {
    template <class In>
    struct op : layers::Elementwise<layers::detail::SigmoidRule>::op<In> {
        using layers::Elementwise<layers::detail::SigmoidRule>::op<In>::op;
    };
};
using Net = Sequential<Input<4>, Linear<3>, Swish, Linear<2>>;
void f(const Net& net) { export_onnx(net, "net.onnx"); }
