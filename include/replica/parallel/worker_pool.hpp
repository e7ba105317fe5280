#pragma once
// WorkerPool: n persistent threads, created once, woken together for each phase of work.
// run(f) calls f(i) on worker i for every i and returns when all are done; the first exception
// thrown by any worker is rethrown in the caller. Nothing is allocated per run.

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace replica::parallel {

class WorkerPool {
public:
    explicit WorkerPool(std::size_t n)
    {
        threads_.reserve(n);
        for (std::size_t i = 0; i < n; ++i) threads_.emplace_back([this, i] { loop(i); });
    }
    WorkerPool(const WorkerPool&) = delete;
    WorkerPool& operator=(const WorkerPool&) = delete;
    ~WorkerPool()
    {
        {
            std::lock_guard lock(mutex_);
            stop_ = true;
        }
        wake_.notify_all();
        for (auto& t : threads_) t.join();
    }

    std::size_t size() const { return threads_.size(); }

    template <class F>
    void run(F&& f)
    {
        {
            std::lock_guard lock(mutex_);
            job_ = [](void* fn, std::size_t i) { (*static_cast<std::remove_reference_t<F>*>(fn))(i); };
            job_arg_ = static_cast<void*>(&f);
            pending_ = threads_.size();
            error_ = nullptr;
            ++generation_;
        }
        wake_.notify_all();
        std::unique_lock lock(mutex_);
        done_.wait(lock, [&] { return pending_ == 0; });
        if (error_) std::rethrow_exception(error_);
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
                arg = job_arg_;
            }
            std::exception_ptr error;
            try {
                job(arg, i);
            } catch (...) {
                error = std::current_exception();
            }
            std::lock_guard lock(mutex_);
            if (error && !error_) error_ = error;
            if (--pending_ == 0) done_.notify_one();
        }
    }

    std::vector<std::thread> threads_;
    std::mutex mutex_;
    std::condition_variable wake_, done_;
    void (*job_)(void*, std::size_t) = nullptr;
    void* job_arg_ = nullptr;
    std::size_t pending_ = 0;
    std::size_t generation_ = 0;
    std::exception_ptr error_;
    bool stop_ = false;
};

} // namespace replica::parallel
