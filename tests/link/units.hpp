#pragma once
// The link test's translation units (tests/link/): first.cpp and second.cpp, compiled by the C++
// compiler and, in the CUDA build, again by nvcc as .cu files, and main.cpp. Their functions take and
// return plain types: replica's types differ between the two kinds of unit (REPLICA_NAMESPACE,
// core/config.hpp), so they never cross from one kind to the other.

#include <cstddef>
#include <string>
#include <vector>

namespace link_host {   // first.cpp and second.cpp
// Parameters after 3 SGD steps of a small residual network on `device` ("cpu:0", "cuda:0"), in the
// reproducible mode.
std::vector<float> first(const std::string& device);
std::vector<float> second(const std::string& device);
// The size of the model's ONNX file written into `folder` (0 in a build without the ONNX part).
std::size_t first_onnx_bytes(const std::string& folder);
std::size_t second_onnx_bytes(const std::string& folder);
int gpus();   // the GPUs this unit's backend sees
} // namespace link_host

namespace link_cuda {   // the same, from first.cu and second.cu
std::vector<float> first(const std::string& device);
std::vector<float> second(const std::string& device);
std::size_t first_onnx_bytes(const std::string& folder);
std::size_t second_onnx_bytes(const std::string& folder);
int gpus();
} // namespace link_cuda
