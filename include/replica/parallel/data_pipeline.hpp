#pragma once
// DataParallel<Pipeline<M, Cuts<I...>, Schedule>, Dispatch>: data x pipeline parallelism. R replicas of
// a P-stage pipeline over R x P devices, replica r's stages on devices r P .. r P + P - 1.
//
//   using Piped = Pipeline<models::CharGPT, Cuts<4>>;
//   DataParallel<Piped, Threaded> model{cpus(4), 0, {}, {.micro_batches = 4}};   // 2 replicas x 2 stages
//   float loss = train_step(model, opt, batch);                                  // same API as M
//
// A step splits the batch over the replicas as a DataParallel of M does (share(n, R, r), the samples
// keeping their global indices), and each replica's pipeline trains its share through its schedule
// (Threaded: the replicas at once, each on a thread of its own besides its stages' threads;
// SingleThread: one after the other). Then stage s's gradient is summed over the replicas by one
// communicator a stage position (over the R stage-s devices: the host's, the shared-GPU kernel, or
// NCCL; DataParallelOptions::gradient_reduction as for M), in rank order, so every replica makes the
// same update. Parameters, optimizer state and checkpoints are replica 0's, which are M's.
//
// The gradients are summed after the pipelines' backward, not bucket by bucket during it. Not yet:
// several processes, ZeRO-1 (DataParallelOptions::shard) and the reproducible mode, each refused with
// a message; and what a Pipeline refuses.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "replica/backend/backend.hpp"
#include "replica/backend/communicators.hpp"
#include "replica/core/config.hpp"
#include "replica/core/error.hpp"
#include "replica/core/meta.hpp"
#include "replica/model/concepts.hpp"
#include "replica/parallel/data_parallel.hpp"
#include "replica/parallel/dispatch.hpp"
#include "replica/parallel/layout.hpp"
#include "replica/parallel/pipeline.hpp"
#include "replica/parallel/scaling.hpp"
#include "replica/parallel/worker_pool.hpp"

namespace REPLICA_NAMESPACE::parallel {

template <class M, class C, class S, DispatchPolicy Dispatch>
class DataParallel<Pipeline<M, C, S>, Dispatch> : public LayoutOf<M, DataParallel<Pipeline<M, C, S>, Dispatch>> {
public:
    // M's types and sizes (parallel/layout.hpp).
    using base = LayoutOf<M, DataParallel>;
    using typename base::input_element, typename base::input_shape, typename base::output_shape, typename base::Evaluation;
    using base::label_size;
    using pipeline_type = Pipeline<M, C, S>;
    using dispatch = Dispatch;
    static constexpr std::size_t stage_count = pipeline_type::stage_count;

    // devices.size() / stage_count replicas, replica r on devices [r P, r P + P); all from `seed`.
    explicit DataParallel(std::vector<Device> devices, std::uint64_t seed = 0, DataParallelOptions options = {},
                          PipelineOptions pipeline = {})
        : devices_(check_devices(std::move(devices))), options_(check_options(options)), pool_(replicas())
    {
        static_assert(model::TrainableModel<DataParallel>);
        for (std::size_t r = 0; r < replicas(); ++r)
            replicas_.push_back(std::make_unique<pipeline_type>(
                std::vector<Device>(devices_.begin() + std::ptrdiff_t(r * stage_count),
                                    devices_.begin() + std::ptrdiff_t((r + 1) * stage_count)),
                seed, pipeline));
        losses_.assign(replicas(), 0.0);
        gradients_.assign(replicas(), nullptr);
        core::static_for<stage_count>([&](auto s) {
            std::vector<backend::AnyContext> contexts;
            for (const auto& p : replicas_) contexts.push_back(p->template stage<s>().context());
            const BucketPlan plan{.buckets = 1, .largest = pipeline_type::template stage_type<s>::param_count,
                                  .reduction = options_.gradient_reduction};
            sums_[s] = backend::make_communicator(contexts, 1, nullptr, plan);
        });
    }
    DataParallel(const DataParallel&) = delete;
    DataParallel& operator=(const DataParallel&) = delete;

    std::size_t replica_count() const { return replicas_.size(); }
    std::size_t global_replica_count() const { return replicas_.size(); }
    int process_rank() const { return 0; }
    std::span<const Device> devices() const { return devices_; }
    const Device& device() const { return devices_.front(); }
    pipeline_type& replica(std::size_t r) { return *replicas_.at(r); }
    const pipeline_type& replica(std::size_t r) const { return *replicas_.at(r); }
    // "DataParallel<threaded> of Pipeline<1F1B> over cpu:0,cpu:1 | cpu:2,cpu:3"
    std::string description() const
    {
        std::string s = std::string("DataParallel<") + Dispatch::name + "> of Pipeline<" + S::name + "> over ";
        for (std::size_t i = 0; i < devices_.size(); ++i)
            s += (i == 0 ? "" : i % stage_count == 0 ? " | " : ",") + devices_[i].name();
        return s;
    }

    std::vector<float> parameters() const { return replicas_.front()->parameters(); }
    std::vector<float> gradients() const { return replicas_.front()->gradients(); }
    std::vector<float> optimizer_state() const { return replicas_.front()->optimizer_state(); }
    void set_parameters(std::span<const float> w)
    {
        for (auto& p : replicas_) p->set_parameters(w);
    }
    void set_optimizer_state(std::span<const float> s)
    {
        for (auto& p : replicas_) p->set_optimizer_state(s);
    }
    std::vector<float> statistics() const { return {}; }
    void set_statistics(std::span<const float> s) { replicas_.front()->set_statistics(s); }

    // ---- the training contract (model/concepts.hpp) ----

    double forward_backward(const model::Pass& pass, const input_element* x, const std::int32_t* labels, std::size_t n,
                            float loss_scale)
    {
        M::check_inputs(x, n);
        each_replica([&](std::size_t r) {
            const Share part = share(n, replicas(), r);
            losses_[r] = replicas_[r]->forward_backward(detail::shifted(pass, part), x + part.offset * input_shape::size,
                                                        labels + part.offset * label_size, part.count, loss_scale);
        });
        core::static_for<stage_count>([&](auto s) {   // the pipelines have finished: their gradients are final
            for (std::size_t r = 0; r < replicas(); ++r) {
                gradients_[r] = replicas_[r]->template stage<s>().gradient_data();
                sums_[s]->produced(r, 0);
            }
            sums_[s]->group_all_reduce(gradients_, pipeline_type::template stage_type<s>::param_count, 0);
            for (std::size_t r = 0; r < replicas(); ++r) sums_[s]->wait(r);
        });
        double total = 0.0;
        for (double l : losses_) total += l;
        return total;
    }

    double reproducible_forward_backward(const model::Pass&, const input_element*, const std::int32_t*, std::size_t, float,
                                         std::size_t)
    {
        throw Error("the reproducible mode does not run over a Pipeline yet, nor a DataParallel of pipelines: train "
                    "the plain model, or a DataParallel of it, in that mode");
    }

    // Every replica applies the same update to the same summed gradient: an optimizer that looks at the
    // whole gradient (over each replica's stages) finds the same answers on every replica.
    template <class Opt>
    void update(const Opt& opt)
    {
        each_replica([&](std::size_t r) { replicas_[r]->update(opt); });
    }

    // Each replica evaluates its share of the samples.
    Evaluation evaluate(const input_element* x, const std::int32_t* labels, std::size_t n)
    {
        M::check_inputs(x, n);
        std::vector<Evaluation> part(replicas());
        each_replica([&](std::size_t r) {
            const Share p = share(n, replicas(), r);
            if (p.count > 0)
                part[r] = replicas_[r]->evaluate(x + p.offset * input_shape::size, labels + p.offset * label_size, p.count);
        });
        Evaluation total{};
        for (const Evaluation& e : part) {
            total.loss_sum += e.loss_sum;
            total.correct += e.correct;
        }
        return total;
    }
    void predict(const input_element* x, std::size_t n, float* out)
    {
        M::check_inputs(x, n);
        each_replica([&](std::size_t r) {
            const Share p = share(n, replicas(), r);
            if (p.count > 0)
                replicas_[r]->predict(x + p.offset * input_shape::size, p.count, out + p.offset * output_shape::size);
        });
    }

private:
    std::size_t replicas() const { return devices_.size() / stage_count; }

    static std::vector<Device> check_devices(std::vector<Device> d)
    {
        core::require(!d.empty() && d.size() % stage_count == 0,
                      "a DataParallel of a " + std::to_string(stage_count) + "-stage Pipeline needs a multiple of " +
                          std::to_string(stage_count) + " devices, one a stage of each replica; got " + std::to_string(d.size()));
        for (std::size_t i = 0; i < d.size(); ++i)
            for (std::size_t j = 0; j < i; ++j)
                core::require(!(d[i] == d[j]) || d[i].is_cuda(),
                              "device " + d[i].name() + " appears twice in the device list: number CPU devices cpu:0, "
                              "cpu:1, ...");
        return d;
    }
    static DataParallelOptions check_options(DataParallelOptions o)
    {
        core::require(o.processes == nullptr, "a DataParallel of pipelines runs in one process: leave "
                                              "DataParallelOptions::processes null");
        core::require(o.shard == Shard::none, "a DataParallel of pipelines cannot shard its optimizer state yet: leave "
                                              "DataParallelOptions::shard at Shard::none");
        return o;
    }
    // f(r) for every replica: at once (Threaded), or one after the other on this thread.
    template <class F>
    void each_replica(F&& f)
    {
        if constexpr (std::is_same_v<Dispatch, Threaded>) pool_.run(f);
        else
            for (std::size_t r = 0; r < replicas(); ++r) f(r);
    }

    std::vector<Device> devices_;
    DataParallelOptions options_;
    WorkerPool pool_;
    std::vector<std::unique_ptr<pipeline_type>> replicas_;   // pipelines do not move
    std::array<std::unique_ptr<Communicator>, stage_count> sums_;   // stage s's gradient over the replicas
    std::vector<double> losses_;
    std::vector<float*> gradients_;   // the replicas' stage gradients being summed
};

} // namespace replica::parallel
