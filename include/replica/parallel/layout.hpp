#pragma once
// LayoutOf<M, D>: what a layout of model M over several devices (Pipeline, TensorParallel, a
// DataParallel of pipelines) says of itself through D, CRTP: M's types and sizes for the training
// contract (model/concepts.hpp), replica_type = M for checkpoints, ONNX export and generate (which
// read M's flat vectors through model::replica_of), and a step that is D's forward_backward, then
// D's update: none of these queues a step ahead.

#include <cstddef>

#include "replica/core/config.hpp"
#include "replica/model/concepts.hpp"

namespace REPLICA_NAMESPACE::parallel {

template <class M, class D>
struct LayoutOf {
    using replica_type = M;
    using input_shape = typename M::input_shape;
    using input_element = typename M::input_element;
    using output_shape = typename M::output_shape;
    using loss = typename M::loss;
    using storage = typename M::storage;
    using param_rule = typename M::param_rule;
    using update_plan = typename M::update_plan;
    using Evaluation = model::Evaluation;
    static constexpr std::size_t param_count = M::param_count;
    static constexpr std::size_t trainable_count = M::trainable_count;
    static constexpr std::size_t statistics_count = M::statistics_count;
    static constexpr std::size_t label_size = M::label_size;

    template <class Opt>
    double step(const model::StepInput<input_element>& in, const Opt& opt, const model::StepInput<input_element>* = nullptr)
    {
        D& self = static_cast<D&>(*this);
        const double l = self.forward_backward(in.pass, in.x, in.labels, in.n, in.loss_scale);
        self.update(opt);
        return l;
    }
};

} // namespace replica::parallel
