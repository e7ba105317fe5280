#pragma once
// The communicator interface and the process group of a run across processes, as parallel/ and its
// users name them. They are the backend's (backend/communicator.hpp): a communicator moves a
// backend's memory.

#include "replica/backend/communicator.hpp"

namespace replica::parallel {

using backend::Communicator;
using backend::HostCommunicator;
using backend::process_devices;
using backend::ProcessGroup;

} // namespace replica::parallel
