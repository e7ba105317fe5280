#pragma once
// Threaded: one persistent worker thread per replica (WorkerPool), each issuing its replica's work,
// its bucket reductions included (NCCL's one-rank-per-thread form), as backward produces them. CPU
// replicas then use the cores themselves: the math library runs each call on one thread for the
// issuer's lifetime. See parallel/dispatch.hpp.

#include <cstddef>
#include <span>
#include <utility>

#include "replica/backend/backend.hpp"
#include "replica/core/config.hpp"
#include "replica/core/device.hpp"
#include "replica/parallel/communicator.hpp"
#include "replica/parallel/worker_pool.hpp"

namespace REPLICA_NAMESPACE::parallel {

struct Threaded {
    static constexpr bool syncs_in_step = true;
    static constexpr const char* name = "threaded";

    class Issuer {
    public:
        Issuer(std::size_t count, const Device& device)
            : serial_(device, count > 1), pool_(count) {}

        template <class F>
        void each(F&& f)
        {
            pool_.run(f);
        }

        // Replica r's own thread reduces the bucket at once; after the last one, r's later work waits
        // for its reductions.
        static void bucket_ready(Communicator& comm, std::size_t r, std::span<float> gradient, std::size_t bucket, bool last)
        {
            comm.all_reduce(r, gradient.data(), gradient.size(), bucket);
            if (last) comm.wait(r);
        }

        // A sync point (core/hook.hpp): the values are summed over the replicas before replica r's
        // later work reads them.
        static void sync(Communicator& comm, std::size_t r, float* data, std::size_t count, std::size_t id)
        {
            comm.all_reduce(r, data, count, id);
            comm.wait(r);
        }

        // Every bucket was reduced as it was produced.
        template <class GradientOf>
        void after_backward(Communicator&, std::span<const std::pair<std::size_t, std::size_t>>, GradientOf&&) {}

        template <class Queue, class Launch, class GradientOf, class Mark>
        void queue_step(Communicator& comm, std::span<const std::pair<std::size_t, std::size_t>>, Queue&& queue,
                        Launch&&, GradientOf&&, Mark&& mark)
        {
            pool_.run([&](std::size_t r) {
                try {
                    queue(r, false);
                    comm.wait(r);
                    mark(r);
                } catch (...) {
                    comm.abort();
                    throw;
                }
            });
        }

    private:
        backend::SerialHostKernels serial_;   // several CPU replicas: replicas, not BLAS, use the cores
        WorkerPool pool_;
    };
};

} // namespace replica::parallel
