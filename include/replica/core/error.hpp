#pragma once
// replica::Error: every failure the library reports. The message names what failed and what to do.

#include <stdexcept>
#include <string>

#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE {

class Error : public std::runtime_error {
public:
    explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace core {
// Throws Error(message) unless `ok`. For checks on user input, files and options.
inline void require(bool ok, const std::string& message)
{
    if (!ok) throw Error(message);
}
} // namespace core

} // namespace replica
