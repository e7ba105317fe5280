// train_bench's GoogLeNet, TextCNN and the FCN (train_bench.hpp).
#include "train_bench.hpp"

std::optional<int> train_bench::run_inception(const Settings& s)
{
    if (s.model == "googlenet") return run_in<GoogLeNet>(s);
    if (s.model == "textcnn") return run_in<TextCNN>(s);
    if (s.model == "fcn") return run_in<FCN>(s);
    return std::nullopt;
}
