#pragma once
// Polling for an answer from another process or device: yield for the first `spin` of a wait (answers
// usually come within microseconds, and each sleep costs tens of microseconds of timer slack, much of
// a small network's step), then sleep between polls so that a long wait costs no CPU.

#include <chrono>
#include <thread>

#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::core {

class Backoff {
public:
    using clock = std::chrono::steady_clock;
    explicit Backoff(std::chrono::microseconds spin = std::chrono::microseconds(2000),
                     std::chrono::microseconds nap = std::chrono::microseconds(50))
        : start_(clock::now()), spin_(spin), nap_(nap) {}

    // Between two polls.
    void pause() const
    {
        if (clock::now() - start_ < spin_) std::this_thread::yield();
        else std::this_thread::sleep_for(nap_);
    }
    // Seconds since the wait began.
    double waited() const { return std::chrono::duration<double>(clock::now() - start_).count(); }
    clock::time_point start() const { return start_; }

private:
    clock::time_point start_;
    std::chrono::microseconds spin_, nap_;
};

} // namespace replica::core
