#pragma once
// Device: where a replica lives. A value type; it owns nothing.
//   Device::cpu(i)   a CPU replica (i tells replicas apart; they share the host's memory)
//   Device::cuda(i)  CUDA device i, as numbered under CUDA_VISIBLE_DEVICES

#include <charconv>
#include <compare>
#include <string>
#include <string_view>
#include <vector>

#include "replica/core/config.hpp"
#include "replica/core/error.hpp"

namespace REPLICA_NAMESPACE {

class Device {
public:
    enum class Kind { cpu, cuda };

    static constexpr Device cpu(int index = 0) { return Device{Kind::cpu, index}; }
    static constexpr Device cuda(int index = 0) { return Device{Kind::cuda, index}; }

    constexpr Kind kind() const { return kind_; }
    constexpr int index() const { return index_; }
    constexpr bool is_cpu() const { return kind_ == Kind::cpu; }
    constexpr bool is_cuda() const { return kind_ == Kind::cuda; }

    std::string name() const { return (is_cpu() ? "cpu:" : "cuda:") + std::to_string(index_); }

    // "cpu", "cpu:3", "cuda:0"; throws Error on anything else.
    static Device parse(std::string_view text)
    {
        auto colon = text.find(':');
        std::string_view kind = text.substr(0, colon);
        int index = 0;
        if (colon != std::string_view::npos) {
            auto digits = text.substr(colon + 1);
            auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
            core::require(ec == std::errc{} && end == digits.data() + digits.size() && index >= 0,
                          "bad device '" + std::string(text) + "': the index after ':' must be a number >= 0, "
                          "as in cpu:1 or cuda:0");
        }
        if (kind == "cpu") return cpu(index);
        if (kind == "cuda") return cuda(index);
        throw Error("bad device '" + std::string(text) + "': write cpu:N or cuda:N");
    }

    friend constexpr bool operator==(const Device&, const Device&) = default;

private:
    constexpr Device(Kind kind, int index) : kind_(kind), index_(index) {}
    Kind kind_;
    int index_;
};

// "cpu:0,cpu:1" -> devices; throws Error naming the bad entry.
inline std::vector<Device> parse_devices(std::string_view list)
{
    std::vector<Device> out;
    while (!list.empty()) {
        auto comma = list.find(',');
        out.push_back(Device::parse(list.substr(0, comma)));
        if (comma == std::string_view::npos) break;
        list.remove_prefix(comma + 1);
    }
    core::require(!out.empty(), "empty device list: name at least one device, as in cpu:0");
    return out;
}

} // namespace replica
