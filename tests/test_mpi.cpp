// [mpi]: DataParallel over several processes (run under mpirun -np N) equals one process.
// Every process checks, the ranks agree on the verdict, and the exit code says it:
//   - fast mode: 3 SGD steps equal the single model's to 1e-5 relative;
//   - reproducible mode: bit-identical to the single model.
// Each process holds `local` CPU replicas (argument 1, default 1).

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "models.hpp"
#include "replica/parallel/mpi.hpp"

using namespace replica;
using namespace replica::testing;

namespace {

template <class Model, class Data>
std::vector<float> three_steps(Model& model, const Data& data, std::size_t batch, StepOptions options)
{
    SGD opt{{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f}};
    for (std::size_t s = 0; s < 3; ++s) train_step(model, opt, data.batch(s * batch, batch, s * batch, 3), options);
    return parameters(model);
}

// Failures on this rank.
template <class M, class Dispatch>
int check(parallel::MpiProcessGroup& processes, std::size_t local, std::size_t batch, const char* name)
{
    const RandomBatches<M> data(3 * batch, 9);
    int failures = 0;
    for (bool reproducible : {false, true}) {
        const StepOptions options{.reproducible = reproducible, .micro_shard = 4};
        M single{Device::cpu(), 2};
        const auto expected = three_steps(single, data, batch, options);
        DataParallel<M, Dispatch> dp{cpus(local), 2, {.processes = &processes}};
        const auto got = three_steps(dp, data, batch, options);
        const double err = max_relative_difference(expected, got);
        const bool ok = reproducible ? got == expected : err < 1e-5;
        if (!ok) {
            std::fprintf(stderr, "rank %d: %s %s (%s): differs from one process, max relative error %g\n",
                         processes.rank(), name, reproducible ? "reproducible" : "fast", Dispatch::name, err);
            ++failures;
        }
    }
    return failures;
}

} // namespace

int main(int argc, char** argv)
try {
    parallel::MpiProcessGroup processes(argc, argv);
    const std::size_t local = argc > 1 ? std::size_t(std::atoi(argv[1])) : 1;
    int failures = 0;
    failures += check<LeNet, SingleThread>(processes, local, 13, "LeNet");
    failures += check<LeNet, Threaded>(processes, local, 13, "LeNet");
    failures += check<ConcatDropoutNet, Threaded>(processes, local, 10, "Concat+Dropout");
    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (processes.rank() == 0)
        std::printf("%d processes x %zu replica(s): %s\n", processes.size(), local,
                    total == 0 ? "every check equals one process" : "FAILED");
    return total == 0 ? 0 : 1;
} catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
}
