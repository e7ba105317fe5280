#pragma once
// Event: a point in one context's queue of work that another context's queue can wait for. Opaque;
// null on the CPU, where work is done when the call returns.

#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::core {

struct Event {
    void* handle = nullptr;
};

} // namespace replica::core
