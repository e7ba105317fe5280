// train_bench's the residual networks (train_bench.hpp), in bf16 on the CPU too.
#include "train_bench.hpp"

std::optional<int> train_bench::run_residual(const Settings& s)
{
    if (s.model == "resnet18") return run_in<ResNet18, true>(s);
    if (s.model == "resnet50") return run_in<ResNet50, true>(s);
    if (s.model == "resnet20") return run_in<ResNet20, true>(s);
    return std::nullopt;
}
