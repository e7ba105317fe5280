#pragma once
// Learning-rate schedules: the rate as a function of the epoch reached (fractional: 2.5 is half-way
// through the third epoch).
//   Schedule::fixed()                       base
//   Schedule::step(every, gamma)            base * gamma ^ floor(epoch / every)
//   Schedule::exponential(gamma)            base * gamma ^ epoch
//   Schedule::polynomial(power, epochs)     base * (1 - epoch / epochs) ^ power
//   Schedule::cosine(epochs, min_lr)        min_lr + (base - min_lr) * (1 + cos(pi * epoch / epochs)) / 2,
//                                           then min_lr (PyTorch's CosineAnnealingLR, one half period)
// Any of them .with_warmup(epochs, start_factor): the rate above times a factor that rises linearly
// from start_factor at epoch 0 to 1 at `epochs`, and stays 1 (PyTorch's LinearLR chained with the
// schedule: the schedule runs from epoch 0 meanwhile, it does not wait for the warm-up).
//   Schedule::cosine(90).with_warmup(5)     five epochs of warm-up from 0, cosine decay to 0 at 90
// The Trainer sets the rate before every step, so a fractional warm-up (0.1 epochs) works too.

#include <algorithm>
#include <cmath>
#include <numbers>

#include "replica/core/config.hpp"
#include "replica/core/error.hpp"

namespace REPLICA_NAMESPACE::train {

class Schedule {
public:
    enum class Kind { fixed, step, exponential, polynomial, cosine };

    static Schedule fixed() { return {Kind::fixed, 1.0, 1.0, 1.0}; }
    static Schedule step(double every_epochs, double gamma)
    {
        core::require(every_epochs > 0.0, "step schedule: the step must be > 0 epochs");
        core::require(gamma > 0.0, "step schedule: gamma must be > 0");
        return {Kind::step, gamma, every_epochs, 1.0};
    }
    static Schedule exponential(double gamma)
    {
        core::require(gamma > 0.0, "exponential schedule: gamma must be > 0");
        return {Kind::exponential, gamma, 1.0, 1.0};
    }
    static Schedule polynomial(double power, double epochs)
    {
        core::require(power > 0.0 && epochs > 0.0, "polynomial schedule: power and epochs must be > 0");
        return {Kind::polynomial, 1.0, epochs, power};
    }

    static Schedule cosine(double epochs, double min_lr = 0.0)
    {
        core::require(epochs > 0.0, "cosine schedule: the decay must last > 0 epochs");
        core::require(std::isfinite(min_lr) && min_lr >= 0.0, "cosine schedule: the floor min_lr must be >= 0");
        Schedule s{Kind::cosine, 1.0, epochs, 1.0};
        s.floor_ = min_lr;
        return s;
    }

    // This schedule with a linear warm-up over the first `epochs` (> 0), from start_factor (in [0, 1))
    // times the rate.
    Schedule with_warmup(double epochs, double start_factor = 0.0) const
    {
        core::require(epochs > 0.0 && std::isfinite(epochs), "warm-up: it must last > 0 epochs (a fraction is fine)");
        core::require(start_factor >= 0.0 && start_factor < 1.0, "warm-up: start_factor must be in [0, 1)");
        Schedule s = *this;
        s.warmup_ = epochs;
        s.warmup_start_ = start_factor;
        return s;
    }

    Kind kind() const { return kind_; }
    double warmup_epochs() const { return warmup_; }   // 0: none

    float lr(float base, double epoch) const
    {
        const double factor =
            epoch < warmup_ ? warmup_start_ + (1.0 - warmup_start_) * std::max(0.0, epoch) / warmup_ : 1.0;
        return float(factor * decayed(base, epoch));
    }

private:
    Schedule(Kind k, double gamma, double period, double power) : kind_(k), gamma_(gamma), period_(period), power_(power) {}

    double decayed(double base, double epoch) const
    {
        switch (kind_) {
        case Kind::fixed: return base;
        case Kind::step: return base * std::pow(gamma_, std::floor(epoch / period_));
        case Kind::exponential: return base * std::pow(gamma_, epoch);
        case Kind::polynomial: return base * std::pow(std::max(0.0, 1.0 - epoch / period_), power_);
        case Kind::cosine:
            return floor_ + (base - floor_) * 0.5 * (1.0 + std::cos(std::numbers::pi * std::min(epoch, period_) / period_));
        }
        return base;
    }

    Kind kind_;
    double gamma_, period_, power_;
    double floor_ = 0.0;          // cosine: the rate it decays to
    double warmup_ = 0.0;         // epochs of warm-up; 0: none
    double warmup_start_ = 0.0;   // the warm-up's first factor
};

} // namespace replica::train

namespace REPLICA_NAMESPACE {
using train::Schedule;
} // namespace replica
