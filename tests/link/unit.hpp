#pragma once
// What first.cpp and second.cpp both instantiate: the umbrella header, every optional header this
// build has, and the same model, steps and export. A definition in a header with external linkage
// would be defined by both units (and by their .cu copies) and fail to link.

#include <filesystem>
#include <string>
#include <vector>

#include "replica/replica.hpp"
#if defined(REPLICA_LINK_IMAGES)
#include "replica/data/image_folder.hpp"
#endif
#if defined(REPLICA_LINK_ONNX)
#include "replica/onnx/export.hpp"
#endif
#if defined(REPLICA_LINK_MPI)
#include "replica/parallel/mpi.hpp"
#endif

#include "units.hpp"

#if defined(__CUDACC__)
#define REPLICA_LINK_UNIT link_cuda
#else
#define REPLICA_LINK_UNIT link_host
#endif

namespace REPLICA_LINK_UNIT::detail {

using Net = replica::Sequential<replica::Input<2, 8, 8>, replica::Conv2d<4, 3, 1, 1>, replica::BatchNorm2d, replica::ReLU,
                                replica::Residual<replica::Sequential<replica::Conv2d<4, 3, 1, 1>, replica::BatchNorm2d,
                                                                     replica::ReLU>>,
                                replica::MaxPool2d<2>, replica::Flatten, replica::Linear<5>>;

inline std::vector<float> three_steps(const std::string& device)
{
    using namespace replica;
    constexpr std::size_t n = 6;
    std::vector<float> x(n * Net::input_shape::size);
    std::vector<std::int32_t> labels(n);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = 2.0f * core::random_uniform(5, core::Stream::synthetic, 0, i, 0) - 1.0f;
    for (std::size_t i = 0; i < n; ++i) labels[i] = std::int32_t(i % 5);
    Net net{Device::parse(device), 1};
    SGD opt{{.lr = 0.05f, .momentum = 0.9f}};
    for (std::uint64_t s = 0; s < 3; ++s)
        train_step(net, opt, Batch{x.data(), labels.data(), n, s * n, 7}, StepOptions{.reproducible = true});
    return parameters(net);
}

inline std::size_t onnx_bytes([[maybe_unused]] const std::filesystem::path& file)
{
#if defined(REPLICA_LINK_ONNX)
    Net net{replica::Device::cpu(), 1};
    replica::export_onnx(net, file.string());
    return std::filesystem::file_size(file);
#else
    return 0;
#endif
}

} // namespace REPLICA_LINK_UNIT::detail
