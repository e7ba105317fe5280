#pragma once
// make_communicator and the device lists a communicator exists for, as parallel/ names them. Which
// communicators exist, and for which contexts, is the backend's (backend/communicators.hpp).

#include "replica/backend/communicators.hpp"
#include "replica/core/config.hpp"
#include "replica/parallel/communicator.hpp"

namespace REPLICA_NAMESPACE::parallel {

using backend::check_communicator_devices;
using backend::make_communicator;
using backend::shares_one_gpu;

} // namespace replica::parallel
