#pragma once
// A live progress line: epoch, batches done, running loss, samples/s and ETA, redrawn in place.
// Drawn only on a terminal, at most every 0.2 s, so logs and CI output stay clean.

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::train {

inline std::string format_duration(double seconds)
{
    const long s = long(seconds + 0.5);
    char buf[32];
    if (s >= 3600) std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", s / 3600, s / 60 % 60, s % 60);
    else std::snprintf(buf, sizeof buf, "%ld:%02ld", s / 60, s % 60);
    return buf;
}

class Progress {
public:
    using clock = std::chrono::steady_clock;

    explicit Progress(bool enabled) : enabled_(enabled && isatty(fileno(stderr))) {}

    void start_epoch(std::size_t epoch, std::size_t epochs, std::size_t steps)
    {
        epoch_ = epoch;
        epochs_ = epochs;
        steps_ = steps;
        start_ = last_ = clock::now();
    }

    // `extra`: more to show after the rate (loss scaling's scale and skips), or empty.
    void update(std::size_t step, std::size_t samples, double mean_loss, const std::string& extra = {})
    {
        if (!enabled_) return;
        const auto now = clock::now();
        if (now - last_ < std::chrono::milliseconds(200) && step != steps_) return;
        last_ = now;
        const double elapsed = std::chrono::duration<double>(now - start_).count();
        const double rate = elapsed > 0 ? double(samples) / elapsed : 0.0;
        const double eta = step > 0 ? elapsed * double(steps_ - step) / double(step) : 0.0;
        const int width = 24, filled = steps_ ? int(width * step / steps_) : width;
        std::fprintf(stderr, "\r  epoch %zu/%zu [%s%s] %zu/%zu  loss %.4f  %.0f samples/s%s  ETA %s   ", epoch_ + 1,
                     epochs_, std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(), step,
                     steps_, mean_loss, rate, extra.c_str(), format_duration(eta).c_str());
        std::fflush(stderr);
    }

    void finish_epoch()
    {
        if (!enabled_) return;
        std::fprintf(stderr, "\r%130s\r", "");
        std::fflush(stderr);
    }

private:
    bool enabled_;
    std::size_t epoch_ = 0, epochs_ = 0, steps_ = 0;
    clock::time_point start_, last_;
};

} // namespace replica::train
