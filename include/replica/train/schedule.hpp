#pragma once
// Learning-rate schedules: the rate as a function of the epoch reached (fractional: 2.5 is half-way
// through the third epoch).
//   Schedule::fixed()                       base
//   Schedule::step(every, gamma)            base * gamma ^ floor(epoch / every)
//   Schedule::exponential(gamma)            base * gamma ^ epoch
//   Schedule::polynomial(power, epochs)     base * (1 - epoch / epochs) ^ power

#include <algorithm>
#include <cmath>

#include "replica/core/error.hpp"

namespace replica::train {

class Schedule {
public:
    enum class Kind { fixed, step, exponential, polynomial };

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

    Kind kind() const { return kind_; }

    float lr(float base, double epoch) const
    {
        switch (kind_) {
        case Kind::fixed: return base;
        case Kind::step: return float(base * std::pow(gamma_, std::floor(epoch / period_)));
        case Kind::exponential: return float(base * std::pow(gamma_, epoch));
        case Kind::polynomial: return float(base * std::pow(std::max(0.0, 1.0 - epoch / period_), power_));
        }
        return base;
    }

private:
    Schedule(Kind k, double gamma, double period, double power) : kind_(k), gamma_(gamma), period_(period), power_(power) {}
    Kind kind_;
    double gamma_, period_, power_;
};

} // namespace replica::train

namespace replica {
using train::Schedule;
} // namespace replica
