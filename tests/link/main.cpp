// The link test: a program of several translation units that all include replica (units.hpp) links,
// and each unit computes what the others do. Exit 0 when every check passes, 1 otherwise; with
// REPLICA_LINK_CUDA the .cu units are part of the program, and their GPU part runs where a GPU is.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include "unit.hpp"   // main instantiates the same steps: a third unit

namespace {

int failures = 0;

void check(bool ok, const std::string& what)
{
    std::printf("%s: %s\n", ok ? "ok" : "FAILED", what.c_str());
    if (!ok) ++failures;
}

bool trained(const std::vector<float>& p)
{
    if (p.empty()) return false;
    for (float v : p)
        if (!std::isfinite(v)) return false;
    return true;
}

[[maybe_unused]] double max_relative(const std::vector<float>& a, const std::vector<float>& b)
{
    double m = a.size() == b.size() ? 0.0 : INFINITY;
    for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
        m = std::max(m, std::abs(double(a[i]) - double(b[i])) / std::max(1e-3, std::abs(double(a[i]))));
    return m;
}

} // namespace

int main()
{
    const auto folder = std::filesystem::temp_directory_path() / ("replica-link-" + std::to_string(::getpid()));
    std::filesystem::create_directories(folder);

    const auto host_first = link_host::first("cpu:0"), host_second = link_host::second("cpu:0");
    check(trained(host_first), "the first .cpp unit trains on the CPU");
    check(host_first == host_second, "the two .cpp units' parameters are the same bits");
    check(link_host::detail::three_steps("cpu:0") == host_first, "main's own steps give the same bits");
    const std::size_t onnx = link_host::first_onnx_bytes(folder.string());
    check(onnx == link_host::second_onnx_bytes(folder.string()), "the two .cpp units write the same ONNX file size");
#if defined(REPLICA_LINK_CUDA)
    const auto cuda_first = link_cuda::first("cpu:0"), cuda_second = link_cuda::second("cpu:0");
    check(cuda_first == cuda_second, "the two .cu units' CPU parameters are the same bits");
    check(max_relative(host_first, cuda_first) <= 1e-5, "the .cu units' CPU parameters equal the .cpp units' (1e-5)");
    check(link_cuda::first_onnx_bytes(folder.string()) == onnx, "the .cu units write the same ONNX file size");
    if (link_cuda::gpus() > 0) {
        const auto gpu_first = link_cuda::first("cuda:0"), gpu_second = link_cuda::second("cuda:0");
        check(gpu_first == gpu_second, "the two .cu units' GPU parameters are the same bits");
        check(max_relative(host_first, gpu_first) <= 1e-3, "the GPU's parameters equal the CPU's (1e-3)");
    } else {
        std::printf("skipped: no GPU visible, the .cu units ran on the CPU only\n");
    }
#endif
    std::filesystem::remove_all(folder);
    std::printf("%s\n", failures ? "link test FAILED" : "link test passed");
    return failures ? 1 : 0;
}
