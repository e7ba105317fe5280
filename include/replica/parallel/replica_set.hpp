#pragma once
// ReplicaSet<Dispatch>: the machinery that a DataParallel model and a DataParallel nested in a model
// share: the dispatch policy's issuer (how each replica's work is issued), the communicator over the
// replicas' contexts, and the gradient buckets reduced as backward produces them.
//
//   set.each(f)                       f(r) for every replica, as the policy issues work
//   auto hook = set.hook(r, gradient) replica r's hook (core/hook.hpp): starts each bucket's reduction
//                                     as backward completes it (the policy says how), and sums the
//                                     values of each sync point over the replicas (policies that
//                                     issue collectives in the middle of a step: Threaded)
//   set.after_backward(gradient_of)   once every replica's backward has been queued
//   set.queue_step(...)               one training step on every replica (dispatch.hpp)

#include <algorithm>
#include <array>
#include <cstddef>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "replica/backend/backend.hpp"
#include "replica/core/config.hpp"
#include "replica/core/device.hpp"
#include "replica/parallel/communicators.hpp"
#include "replica/parallel/dispatch.hpp"

namespace REPLICA_NAMESPACE::parallel {

using Bucket = std::pair<std::size_t, std::size_t>;   // [begin, end) of a gradient buffer

// Buckets of a gradient laid out at `offsets` (the layers' parameter offsets, and the end), last
// layers first, cut at layer boundaries: the first at least min(first, floats) long, the others at
// least `floats` (but the one holding the first layers). Runs in `skipped` ([begin, end), in order: the
// frozen parameters, whose gradients nobody reads) are cut out: a bucket across one becomes the pieces
// around it, last first.
template <std::size_t N>
std::vector<Bucket> make_buckets(const std::array<std::size_t, N>& offsets, std::size_t first, std::size_t floats,
                                 std::span<const Bucket> skipped = {})
{
    std::vector<Bucket> out;
    auto add = [&](std::size_t begin, std::size_t end) {
        for (std::size_t k = skipped.size(); k-- > 0;) {   // the pieces of [begin, end) around the skipped runs
            const auto [sb, se] = skipped[k];
            if (se <= begin || sb >= end) continue;
            if (se < end) out.emplace_back(se, end);
            end = std::max(begin, sb);
        }
        if (end > begin) out.emplace_back(begin, end);
    };
    std::size_t end = offsets.back();
    bool any = false;
    for (std::size_t i = offsets.size() - 1; i-- > 0;) {
        const std::size_t wanted = any ? floats : std::min(first, floats);
        if (end - offsets[i] >= wanted || (i == 0 && end > offsets[i])) {
            add(offsets[i], end);
            any = true;
            end = offsets[i];
        }
    }
    return out;
}

template <DispatchPolicy Dispatch>
class ReplicaSet {
public:
    // syncs: the model's sync points a step (core/hook.hpp).
    ReplicaSet(std::vector<Bucket> buckets, std::size_t count, const Device& first, std::size_t syncs = 0)
        : buckets_(std::move(buckets)), syncs_(syncs), issuer_(std::make_unique<typename Dispatch::Issuer>(count, first)) {}

    // The communicator over the replicas' contexts (replica r's is contexts[r]), across processes
    // when `processes` is given, carrying the gradient buckets as `reduction` says.
    void connect(const std::vector<backend::AnyContext>& contexts, ProcessGroup* processes = nullptr,
                 GradientReduction reduction = GradientReduction::fp32)
    {
        std::size_t largest = 0;
        for (const auto& [begin, end] : buckets_) largest = std::max(largest, end - begin);
        comm_ = make_communicator(contexts, buckets_.size() + syncs_, processes,   // syncs number after buckets
                                  BucketPlan{buckets_.size(), largest, reduction});
    }
    bool connected() const { return comm_ != nullptr; }
    Communicator& comm() { return *comm_; }
    std::size_t bucket_count() const { return buckets_.size(); }
    // Floats of gradient each replica hands to the all-reduce a step: the buckets' sizes summed.
    std::size_t gradient_floats() const
    {
        std::size_t n = 0;
        for (const auto& [begin, end] : buckets_) n += end - begin;
        return n;
    }

    template <class F>
    void each(F&& f)
    {
        issuer_->each(f);
    }

    // Replica r's backward hook, for one step: called as backward completes each layer's gradient
    // (with the offset from which the gradient is final), it hands every complete bucket to the
    // policy. acts() says whether a call would: a step replayed from CUDA graphs is cut only there.
    struct Hook {
        ReplicaSet* set = nullptr;
        std::size_t r = 0;
        float* gradient = nullptr;
        std::size_t next = 0;
        bool acts(std::size_t from) const { return next < set->buckets_.size() && set->buckets_[next].first >= from; }
        void operator()(std::size_t from)
        {
            for (; acts(from); ++next) {
                const auto [begin, end] = set->buckets_[next];
                Dispatch::Issuer::bucket_ready(*set->comm_, r, std::span<float>(gradient + begin, end - begin), next,
                                               next + 1 == set->buckets_.size());
            }
        }
        void sync(float* data, std::size_t count, std::size_t id)
            requires Dispatch::syncs_in_step
        {
            Dispatch::Issuer::sync(*set->comm_, r, data, count, set->buckets_.size() + id);
        }
    };
    Hook hook(std::size_t r, float* gradient) { return Hook{this, r, gradient}; }

    template <class GradientOf>
    void after_backward(GradientOf&& gradient_of)
    {
        issuer_->after_backward(*comm_, buckets_, gradient_of);
    }

    template <class Queue, class Launch, class GradientOf, class Mark>
    void queue_step(Queue&& queue, Launch&& launch, GradientOf&& gradient_of, Mark&& mark)
    {
        issuer_->queue_step(*comm_, buckets_, queue, launch, gradient_of, mark);
    }

    // Releases every replica blocked in a reduction (one of them failed).
    void abort() { comm_->abort(); }

private:
    std::vector<Bucket> buckets_;
    std::size_t syncs_;
    std::unique_ptr<typename Dispatch::Issuer> issuer_;   // owned apart: a replica set moves with its model
    std::unique_ptr<Communicator> comm_;
};

} // namespace replica::parallel
