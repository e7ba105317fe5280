// train_bench's LeNet and AlexNet (train_bench.hpp).
#include "train_bench.hpp"

std::optional<int> train_bench::run_classic(const Settings& s)
{
    if (s.model == "lenet") return run_in<LeNet>(s);
    if (s.model == "alexnet") return run_in<AlexNet>(s);
    if (s.model == "alexnet-plain") return run_in<AlexNetPlain>(s);
    return std::nullopt;
}
