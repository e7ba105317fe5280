// train_bench's the residual networks (train_bench.hpp).
#include "train_bench.hpp"

std::optional<int> train_bench::run_residual(const Settings& s)
{
    if (s.model == "resnet18") return run_in<ResNet18>(s);
    if (s.model == "resnet50") return run_in<ResNet50>(s);
    if (s.model == "resnet20") return run_in<ResNet20>(s);
    return std::nullopt;
}
