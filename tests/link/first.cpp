// One of the link test's units (units.hpp).
#include "unit.hpp"

namespace REPLICA_LINK_UNIT {
std::vector<float> first(const std::string& device) { return detail::three_steps(device); }
std::size_t first_onnx_bytes(const std::string& folder) { return detail::onnx_bytes(std::filesystem::path(folder) / "first.onnx"); }
int gpus() { return int(replica::cuda_devices().size()); }
} // namespace REPLICA_LINK_UNIT
