#pragma once
// WorkerPool: n persistent threads, created once, woken together for each phase of work.
// run(f) calls f(i) on worker i for every i and returns when all are done; the first exception
// thrown by any worker is rethrown in the caller. Nothing is allocated per run.
//
// A training step is a few phases in a row (queue every replica's work, wait for it, update), so the
// threads poll for the next phase (or for its end) for a short while before they sleep: a wake-up
// through a condition variable costs a sizeable part of a small network's step (bench/pool_bench
// measures it; docs/results/). The counters are C++20 atomics, slept on with atomic::wait.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::parallel {

class WorkerPool {
public:
    // How long a thread polls (yielding) before it sleeps until notified.
    static constexpr std::chrono::microseconds poll_for{200};

    explicit WorkerPool(std::size_t n)
    {
        threads_.reserve(n);
        for (std::size_t i = 0; i < n; ++i) threads_.emplace_back([this, i] { loop(i); });
    }
    WorkerPool(const WorkerPool&) = delete;
    WorkerPool& operator=(const WorkerPool&) = delete;
    ~WorkerPool()
    {
        stop_.store(true, std::memory_order_relaxed);
        generation_.fetch_add(1, std::memory_order_release);
        generation_.notify_all();
        for (auto& t : threads_) t.join();
    }

    std::size_t size() const { return threads_.size(); }

    template <class F>
    void run(F&& f)
    {
        job_ = [](void* fn, std::size_t i) { (*static_cast<std::remove_reference_t<F>*>(fn))(i); };
        job_arg_ = static_cast<void*>(&f);
        error_ = nullptr;
        pending_.store(std::uint32_t(threads_.size()), std::memory_order_relaxed);
        generation_.fetch_add(1, std::memory_order_release);   // publishes the job
        generation_.notify_all();
        for (std::uint32_t left = pending_.load(std::memory_order_acquire); left != 0;) left = await_change(pending_, left);
        if (error_) std::rethrow_exception(error_);
    }

private:
    // The counter's value once it differs from `seen`: polled for poll_for, then slept on.
    static std::uint32_t await_change(const std::atomic<std::uint32_t>& counter, std::uint32_t seen)
    {
        const auto until = std::chrono::steady_clock::now() + poll_for;
        for (;;) {
            const std::uint32_t now = counter.load(std::memory_order_acquire);
            if (now != seen) return now;
            if (std::chrono::steady_clock::now() < until) std::this_thread::yield();
            else counter.wait(seen, std::memory_order_acquire);
        }
    }

    void loop(std::size_t i)
    {
        std::uint32_t seen = 0;
        for (;;) {
            seen = await_change(generation_, seen);
            if (stop_.load(std::memory_order_relaxed)) return;
            try {
                job_(job_arg_, i);
            } catch (...) {
                std::lock_guard lock(error_mutex_);
                if (!error_) error_ = std::current_exception();
            }
            if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
        }
    }

    std::vector<std::thread> threads_;
    std::atomic<std::uint32_t> generation_{0}, pending_{0};
    std::atomic<bool> stop_{false};
    void (*job_)(void*, std::size_t) = nullptr;   // written before generation_ moves, read after
    void* job_arg_ = nullptr;
    std::mutex error_mutex_;
    std::exception_ptr error_;
};

} // namespace replica::parallel
