#pragma once
// SingleThread: the calling thread issues every replica's work in turn. A bucket's reduction starts
// once every replica's backward has been queued (one group call each, NCCL's grouped form); on GPUs
// the replicas' CUDA graph segments are launched interleaved, segment k of every replica before any
// replica's k + 1, so the devices start within a launch of each other. See parallel/dispatch.hpp.

#include <algorithm>
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "replica/core/config.hpp"
#include "replica/core/device.hpp"
#include "replica/parallel/communicator.hpp"

namespace REPLICA_NAMESPACE::parallel {

struct SingleThread {
    static constexpr bool syncs_in_step = false;
    static constexpr const char* name = "single";

    class Issuer {
    public:
        Issuer(std::size_t count, const Device&) : count_(count), pointers_(count), segments_(count) {}

        template <class F>
        void each(F&& f)
        {
            for (std::size_t r = 0; r < count_; ++r) f(r);
        }

        // The reduction waits for every replica: mark the bucket produced (its reduction starts once
        // the work queued so far has run).
        static void bucket_ready(Communicator& comm, std::size_t r, std::span<float>, std::size_t bucket, bool)
        {
            comm.produced(r, bucket);
        }

        template <class GradientOf>
        void after_backward(Communicator& comm, std::span<const std::pair<std::size_t, std::size_t>> buckets,
                            GradientOf&& gradient_of)
        {
            for (std::size_t b = 0; b < buckets.size(); ++b) {
                for (std::size_t r = 0; r < count_; ++r) pointers_[r] = gradient_of(r) + buckets[b].first;
                comm.group_all_reduce(pointers_, buckets[b].second - buckets[b].first, b);
            }
        }

        template <class Queue, class Launch, class GradientOf, class Mark>
        void queue_step(Communicator& comm, std::span<const std::pair<std::size_t, std::size_t>> buckets, Queue&& queue,
                        Launch&& launch, GradientOf&& gradient_of, Mark&& mark)
        {
            std::size_t most = 0;
            try {
                for (std::size_t r = 0; r < count_; ++r) {
                    segments_[r] = queue(r, true);
                    most = std::max(most, segments_[r]);
                }
                for (std::size_t k = 0; k < most; ++k)
                    for (std::size_t r = 0; r < count_; ++r)
                        if (k < segments_[r]) launch(r, k);
                after_backward(comm, buckets, gradient_of);
            } catch (...) {
                comm.abort();
                throw;
            }
            for (std::size_t r = 0; r < count_; ++r) {
                comm.wait(r);
                mark(r);
            }
        }

    private:
        std::size_t count_;
        std::vector<float*> pointers_;         // a bucket's start in every replica's gradient
        std::vector<std::size_t> segments_;    // graph segments each replica left to launch
    };
};

} // namespace replica::parallel
