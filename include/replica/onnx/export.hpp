#pragma once
// ONNX export: a trained model as an ONNX file that inference engines (ONNX Runtime, TensorRT,
// OpenVINO...) run.
//
//   #include <replica/onnx/export.hpp>          // not in replica.hpp: needs libonnx and protobuf
//   replica::export_onnx(model, "lenet.onnx");            // or replica::onnx::export_onnx
//   replica::write_reference(model, x, 2, "lenet.onnx.reference");   // optional: to compare
//
// export_onnx(model, path) writes the model's inference form (Dropout off, BatchNorm on its running
// estimates) as an ONNX graph: input "input" (N, input_shape...), float, or int32 token ids (N, T) for
// a model with Input<Tokens<T>>; output "output" (N, output_shape...), N symbolic; the output is what
// predict() returns (the logits, per pixel for an image-shaped output, per position (N, T, V) for
// SequenceCrossEntropy). Opset 17, IR version 8 (onnx/graph.hpp). The model is any Sequential<Input<...>,
// ...>, DataParallel or AutoParallel of one, on any device (parameters and statistics are read through
// parameters() and statistics(), host copies). Layers map as onnx/layers.hpp lists; Sequential (nested
// too), Concat (Concat on channels), Residual (Add, with the shortcut's output or the input) and a
// DataParallel nested in a model (its model, once) are written here. A layer without a mapping does
// not compile (Mapping<ThatLayer>). Errors (replica::Error): a file that cannot be written, a model
// whose parameters or statistics are not finite, a model above protobuf's 2 GiB.
//
// write_reference(model, x, n, path) runs predict() on n samples x (host memory: floats, or a token
// model's std::int32_t ids) and writes them and its outputs, for tests/onnx/compare.py or any runtime to
// compare against. The format, little-endian:
//   8 bytes "RPLREF01" (float inputs) or "RPLREF02" (int32 token ids) | u32 input rank r |
//   u32 output rank s | u64 input dims (r, N first) | u64 output dims (s, N first) |
//   f32 or i32 inputs | f32 outputs

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "replica/core/atomic_file.hpp"
#include "replica/core/config.hpp"
#include "replica/core/error.hpp"
#include "replica/layers/op.hpp"
#include "replica/model/concat.hpp"
#include "replica/model/residual.hpp"
#include "replica/model/sequential.hpp"
#include "replica/onnx/graph.hpp"
#include "replica/onnx/layers.hpp"
#include "replica/parallel/auto_parallel.hpp"
#include "replica/parallel/data_parallel.hpp"
#include "replica/version.hpp"

namespace REPLICA_NAMESPACE::onnx {

namespace detail {
template <class In>
std::string emit_chain(Graph&, const std::string& x, const Slice&, model::detail::type_list<>)
{
    return x;
}
// Layers one after the other, each on the slice after the one before's (Parts' layout).
template <class In, class L, class... Rest>
std::string emit_chain(Graph& g, const std::string& x, const Slice& s, model::detail::type_list<L, Rest...>)
{
    using O = typename L::template op<In>;
    const std::string y = emit<L, In>(g, x, s);
    return emit_chain<typename O::output_shape>(
        g, y, s.after(O::param_count, layers::statistics_count_of<O>), model::detail::type_list<Rest...>{});
}
} // namespace detail

// A Sequential, outermost or nested: its layers (the Input and the loss are not layers).
template <class... Es>
struct Mapping<model::Sequential<Es...>> {
    template <class In>
    static std::string emit(Graph& g, const std::string& x, const Slice& s)
    {
        return detail::emit_chain<In>(g, x, s, typename model::detail::entries<Es...>::layers{});
    }
};

template <class... Branches>
struct Mapping<model::Concat<Branches...>> {
    template <class In>
    static std::string emit(Graph& g, const std::string& x, const Slice& s)
    {
        std::vector<std::string> outputs;
        Slice branch = s;   // the branches' slices one after another (Parts' layout)
        ((outputs.push_back(onnx::emit<Branches, In>(g, x, branch)),
          branch = branch.after(Branches::template op<In>::param_count,
                                layers::statistics_count_of<typename Branches::template op<In>>)),
         ...);
        return g.node("Concat", outputs, {integer("axis", 1)});   // on channels
    }
};

template <class Body, class Shortcut>
struct Mapping<model::Residual<Body, Shortcut>> {
    template <class In>
    static std::string emit(Graph& g, const std::string& x, const Slice& s)
    {
        const std::string body = onnx::emit<Body, In>(g, x, s);
        if constexpr (std::is_void_v<Shortcut>) {
            return g.node("Add", {body, x});
        } else {
            using B = typename Body::template op<In>;
            return g.node("Add", {body, onnx::emit<Shortcut, In>(g, x, s.after(B::param_count, layers::statistics_count_of<B>))});
        }
    }
};

// Nested in a model, a DataParallel is its model once: every replica holds the same parameters.
template <class M, class Dispatch>
struct Mapping<parallel::DataParallel<M, Dispatch>> {
    template <class In>
    static std::string emit(Graph& g, const std::string& x, const Slice& s)
    {
        return onnx::emit<M, In>(g, x, s);
    }
};

namespace detail {
// A graph input or output of (N, Shape...) elements E: float, or std::int32_t (token ids).
template <class Shape, class E = float>
void describe(::onnx::ValueInfoProto& v, const std::string& name)
{
    v.set_name(name);
    ::onnx::TypeProto_Tensor& t = *v.mutable_type()->mutable_tensor_type();
    t.set_elem_type(std::is_same_v<E, std::int32_t> ? ::onnx::TensorProto::INT32 : ::onnx::TensorProto::FLOAT);
    ::onnx::TensorShapeProto& shape = *t.mutable_shape();
    shape.add_dim()->set_dim_param("N");
    for (std::size_t d : Shape::dims) shape.add_dim()->set_dim_value(std::int64_t(d));
}

inline void require_finite(std::span<const float> v, const char* what)
{
    for (std::size_t i = 0; i < v.size(); ++i)
        if (!std::isfinite(v[i]))   // the message only on failure: models hold millions of values
            throw Error(std::string("export_onnx: ") + what + " " + std::to_string(i) + " is " +
                        (std::isnan(v[i]) ? "NaN" : "infinite") +
                        ": the model diverged; export it from a checkpoint saved before");
}

// Writes bytes to path atomically (core/atomic_file.hpp): a failed write leaves no partial file.
inline void write_file(const std::string& path, const char* who, std::span<const unsigned char> bytes)
{
    core::write_file_atomically(path, bytes, std::string(who) + ": cannot write '" + path + "'",
                                "a file already there is unchanged");
}
} // namespace detail

// The ONNX model of `model` (see the top of this file), in memory.
template <class Model>
::onnx::ModelProto to_onnx(const Model& model)
{
    using Seq = typename model::replica_of<Model>::type;   // the Sequential whose layers it runs
    static_assert(model::is_sequential<Seq>::value,
                  "export_onnx takes a model: a Sequential<Input<...>, ...>, or a DataParallel or AutoParallel of one");
    using In = typename Seq::input_shape;
    using Out = typename Seq::output_shape;

    const std::vector<float> params = model.parameters();
    const std::vector<float> stats = model.statistics();
    core::require(params.size() == Seq::param_count && stats.size() == Seq::statistics_count,
                  "export_onnx: the model returned " + std::to_string(params.size()) + " parameters and " +
                      std::to_string(stats.size()) + " statistics, its type says " + std::to_string(Seq::param_count) +
                      " and " + std::to_string(Seq::statistics_count) + ": was it moved from?");
    detail::require_finite(params, "parameter");
    detail::require_finite(stats, "statistic (BatchNorm running estimate)");
    // A protobuf message cannot exceed 2 GiB; the parameters are most of it.
    core::require((params.size() + stats.size()) * sizeof(float) < (std::size_t(1) << 31) - (std::size_t(1) << 24),
                  "export_onnx: " + std::to_string(params.size()) + " parameters exceed what one ONNX file holds "
                  "(protobuf's 2 GiB); ONNX's external data files are not written yet");

    ::onnx::ModelProto m;
    m.set_ir_version(ir_version);
    m.set_producer_name("replica");
    m.set_producer_version(std::to_string(REPLICA_VERSION_MAJOR) + "." + std::to_string(REPLICA_VERSION_MINOR) + "." +
                           std::to_string(REPLICA_VERSION_PATCH));
    ::onnx::OperatorSetIdProto& set = *m.add_opset_import();
    set.set_domain("");
    set.set_version(opset);
    ::onnx::GraphProto& graph = *m.mutable_graph();
    graph.set_name("replica");
    detail::describe<In, typename Seq::input_element>(*graph.add_input(), "input");
    Graph g(graph);
    const std::string y = emit<Seq, In>(g, "input", Slice{params.data(), stats.data(), params});
    g.output(y, "output");
    detail::describe<Out>(*graph.add_output(), "output");
    return m;
}

// Writes `model` as an ONNX file at path (replaced if it exists).
template <class Model>
void export_onnx(const Model& model, const std::string& path)
{
    std::string bytes;
    core::require(to_onnx(model).SerializeToString(&bytes),
                  "export_onnx: protobuf could not serialise the model to '" + path + "'");
    detail::write_file(path, "export_onnx",
                       {reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size()});
}

// Writes n samples x (host memory, n * input size floats or token ids) and the model's predict()
// outputs for them to path, in the format at the top of this file.
template <class Model>
void write_reference(Model& model, const typename Model::input_element* x, std::size_t n, const std::string& path)
{
    constexpr bool ids = std::is_same_v<typename Model::input_element, std::int32_t>;
    using In = typename Model::input_shape;
    using Out = typename Model::output_shape;
    core::require(n > 0, "write_reference: give at least one sample");
    std::vector<float> y(n * Out::size);
    model.predict(x, n, y.data());
    std::vector<unsigned char> bytes;
    const auto put = [&](const void* p, std::size_t size) {
        const auto* c = static_cast<const unsigned char*>(p);
        bytes.insert(bytes.end(), c, c + size);
    };
    put(ids ? "RPLREF02" : "RPLREF01", 8);
    const std::uint32_t ranks[2] = {std::uint32_t(In::rank + 1), std::uint32_t(Out::rank + 1)};
    put(ranks, sizeof ranks);
    const auto dims = [&](const auto& d) {
        const std::uint64_t batch = n;
        put(&batch, sizeof batch);
        for (std::size_t v : d) {
            const std::uint64_t u = v;
            put(&u, sizeof u);
        }
    };
    dims(In::dims);
    dims(Out::dims);
    put(x, n * In::size * sizeof(*x));
    put(y.data(), y.size() * sizeof(float));
    detail::write_file(path, "write_reference", bytes);
}

} // namespace replica::onnx

// In namespace replica too: after `using namespace replica`, `onnx::` would be ambiguous with
// protobuf's ::onnx.
namespace REPLICA_NAMESPACE {
using onnx::export_onnx;
using onnx::to_onnx;
using onnx::write_reference;
} // namespace replica
