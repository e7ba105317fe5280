#pragma once
// Several processes for the examples and the benchmark: a ProcessGroup when the program was started
// by mpirun or srun (and built with MPI: REPLICA_MPI), otherwise none, so that the same program runs
// alone or as one of many processes:
//
//   lenet_fashion_mnist --epochs 8                        # one process
//   mpirun -np 2 lenet_fashion_mnist --epochs 8           # two, each with its share of the devices

#include <cstdlib>
#include <memory>

#include "replica/parallel/communicator.hpp"
#if REPLICA_MPI
#include "replica/parallel/mpi.hpp"
#endif

namespace replica::examples {

// Environment variables that Open MPI's mpirun, PMIx launchers (srun --mpi=pmix) and MPICH's Hydra set.
inline bool started_by_mpi_launcher()
{
    for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"})
        if (std::getenv(name) != nullptr) return true;
    return false;
}

inline std::unique_ptr<parallel::ProcessGroup> launched_processes([[maybe_unused]] int& argc, [[maybe_unused]] char**& argv)
{
#if REPLICA_MPI
    if (started_by_mpi_launcher()) return std::make_unique<parallel::MpiProcessGroup>(argc, argv);
#else
    if (started_by_mpi_launcher())
        throw Error("started by an MPI launcher, but this program was built without MPI: install Open MPI "
                    "(libopenmpi-dev) and rebuild, or run it without mpirun");
#endif
    return nullptr;
}

} // namespace replica::examples
