// What a Threaded step's phase hand-offs cost: WorkerPool::run with trivial work, three phases in a row
// (as a training step has: queue, wait, update), and one phase after the workers have gone to sleep;
// beside it, the same done by a pool that wakes its threads through a condition variable (what
// WorkerPool did before). Median and 90th percentile over many rounds.
//
//   build/bench/pool_bench [--threads 2] [--rounds 20000]

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include "replica/parallel/worker_pool.hpp"
#include "support/cli.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

// The reference: workers sleep on a condition variable between phases.
class CondvarPool {
public:
    explicit CondvarPool(std::size_t n)
    {
        for (std::size_t i = 0; i < n; ++i) threads_.emplace_back([this, i] { loop(i); });
    }
    ~CondvarPool()
    {
        {
            std::lock_guard lock(mutex_);
            stop_ = true;
        }
        wake_.notify_all();
        for (auto& t : threads_) t.join();
    }
    template <class F>
    void run(F&& f)
    {
        {
            std::lock_guard lock(mutex_);
            job_ = [](void* fn, std::size_t i) { (*static_cast<std::remove_reference_t<F>*>(fn))(i); };
            arg_ = &f;
            pending_ = threads_.size();
            ++generation_;
        }
        wake_.notify_all();
        std::unique_lock lock(mutex_);
        done_.wait(lock, [&] { return pending_ == 0; });
    }

private:
    void loop(std::size_t i)
    {
        std::size_t seen = 0;
        for (;;) {
            void (*job)(void*, std::size_t);
            void* arg;
            {
                std::unique_lock lock(mutex_);
                wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
                if (stop_) return;
                seen = generation_;
                job = job_;
                arg = arg_;
            }
            job(arg, i);
            std::lock_guard lock(mutex_);
            if (--pending_ == 0) done_.notify_one();
        }
    }
    std::vector<std::thread> threads_;
    std::mutex mutex_;
    std::condition_variable wake_, done_;
    void (*job_)(void*, std::size_t) = nullptr;
    void* arg_ = nullptr;
    std::size_t pending_ = 0, generation_ = 0;
    bool stop_ = false;
};

struct Figures {
    double median, p90;
};
Figures summary(std::vector<double>& us)
{
    std::sort(us.begin(), us.end());
    return {us[us.size() / 2], us[us.size() * 9 / 10]};
}

// Microseconds per round: `phases` runs back to back, after `pause` without work.
template <class Pool>
Figures measure(Pool& pool, std::size_t rounds, int phases, std::chrono::microseconds pause)
{
    std::vector<int> hits(64, 0);
    std::vector<double> us;
    us.reserve(rounds);
    for (std::size_t k = 0; k < rounds; ++k) {
        if (pause.count() > 0) std::this_thread::sleep_for(pause);
        const auto t0 = clock_type::now();
        for (int p = 0; p < phases; ++p) pool.run([&](std::size_t i) { ++hits[i]; });
        us.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count());
    }
    return summary(us);
}

} // namespace

int main(int argc, char** argv)
try {
    CLI::App app{"what Threaded's phase hand-offs cost: WorkerPool against a condition-variable pool", "pool_bench"};
    std::size_t threads = 2, rounds = 20000;
    replica::examples::count_option(app, "--threads", threads, "worker threads (replicas)", 1, 64);
    replica::examples::count_option(app, "--rounds", rounds, "rounds per measurement", 1, 100000000);
    if (int code = replica::examples::parse(app, argc, argv)) return code - 1;
    const auto asleep = replica::parallel::WorkerPool::poll_for * 5;
    std::printf("%zu worker threads, %zu rounds; microseconds, median (90th percentile)\n", threads, rounds);
    std::printf("%-40s %22s %22s\n", "", "WorkerPool", "condition variables");
    {
        replica::parallel::WorkerPool pool(threads);
        CondvarPool ref(threads);
        const Figures a = measure(pool, rounds, 3, {}), b = measure(ref, rounds, 3, {});
        std::printf("%-40s %12.1f (%6.1f) %12.1f (%6.1f)\n", "3 phases back to back (a step)", a.median, a.p90, b.median, b.p90);
        const std::size_t fewer = std::max<std::size_t>(rounds / 20, 1);
        const Figures c = measure(pool, fewer, 1, asleep), d = measure(ref, fewer, 1, asleep);
        std::printf("%-40s %12.1f (%6.1f) %12.1f (%6.1f)\n", "1 phase after the workers slept", c.median, c.p90, d.median, d.p90);
    }
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
}
