// One of the link test's units (units.hpp).
#include "unit.hpp"

namespace REPLICA_LINK_UNIT {
std::vector<float> second(const std::string& device) { return detail::three_steps(device); }
std::size_t second_onnx_bytes(const std::string& folder) { return detail::onnx_bytes(std::filesystem::path(folder) / "second.onnx"); }
} // namespace REPLICA_LINK_UNIT
