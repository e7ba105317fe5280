#pragma once
// Where each kind of parameter lies in an op's flat slice, and the update plan a rule makes of it, all
// at compile time.
//   param_ranges_of<O>          O's parameters as ranges (offset, count, kind, layer id relative to O's
//                               first): from O::param_ranges (composites), O::param_blocks (leaves,
//                               layers/op.hpp), or one range of weights
//   UpdatePlan<O, Rule, First>  O's slice under Rule when O's first layer id is First: the segments the
//                               optimizer's kernels read (core::ParamSegment; frozen ranges left out,
//                               neighbours treated alike merged), the trainable parameter count (the
//                               optimizer state holds that many parameters' state), the frozen runs and
//                               a signature of the treatment (checkpoints)

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "replica/core/config.hpp"
#include "replica/core/param_kind.hpp"
#include "replica/model/param_rules.hpp"

namespace REPLICA_NAMESPACE::model {

struct ParamRange {
    std::size_t offset;
    std::size_t count;
    core::ParamKind kind;
    std::uint32_t layer;
    core::ParamSplit split{};   // a split op's share of the whole layer's block (core/param_kind.hpp)
};

namespace detail {
template <class O>
constexpr std::size_t param_range_count()
{
    if constexpr (requires { O::param_ranges; }) return O::param_ranges.size();
    else if constexpr (requires { O::param_blocks; }) return O::param_blocks.size();
    else return O::param_count > 0 ? 1 : 0;
}
template <class O>
constexpr bool param_blocks_cover()
{
    if constexpr (requires { O::param_blocks; }) {
        std::size_t total = 0;
        for (const auto& b : O::param_blocks) total += b.count;
        return total == O::param_count;
    } else {
        return true;
    }
}
} // namespace detail

template <class O>
inline constexpr std::array<ParamRange, detail::param_range_count<O>()> param_ranges_of = [] {
    static_assert(detail::param_blocks_cover<O>(),
                  "an op's param_blocks must cover its parameters: their counts must sum to param_count");
    if constexpr (requires { O::param_ranges; }) {
        return O::param_ranges;
    } else {
        std::array<ParamRange, detail::param_range_count<O>()> out{};
        if constexpr (requires { O::param_blocks; }) {
            std::size_t offset = 0;
            for (std::size_t i = 0; i < out.size(); ++i) {
                out[i] = {offset, O::param_blocks[i].count, O::param_blocks[i].kind, 0, O::param_blocks[i].split};
                offset += O::param_blocks[i].count;
            }
        } else if constexpr (O::param_count > 0) {
            out[0] = {0, O::param_count, core::ParamKind::weight, 0};
        }
        return out;
    }
}();

// The ranges of parts laid out one after another (param_offset) with consecutive layer ids (id_offset).
template <class... Ops, std::size_t N>
constexpr auto concat_param_ranges(const std::array<std::size_t, N>& param_offset,
                                   const std::array<std::size_t, N>& id_offset)
{
    std::array<ParamRange, (param_ranges_of<Ops>.size() + ... + 0)> out{};
    std::size_t k = 0, i = 0;
    auto add = [&](const auto& ranges) {
        for (const auto& r : ranges)
            out[k++] = {r.offset + param_offset[i], r.count, r.kind, r.layer + std::uint32_t(id_offset[i]), r.split};
        ++i;
    };
    (add(param_ranges_of<Ops>), ...);
    return out;
}

template <class O, ParamRuleType Rule, std::uint32_t First>
struct UpdatePlan {
    static constexpr auto ranges = param_ranges_of<O>;
    static constexpr core::Treatment treatment(std::size_t i) { return Rule::treat(ranges[i].kind, First + ranges[i].layer); }

    // Segments: the trainable ranges, a neighbour treated alike merged into the one before.
    template <bool Fill, std::size_t Size>
    static constexpr std::size_t make_segments(std::array<core::ParamSegment, Size>* out)
    {
        std::size_t k = 0, state = 0;
        bool open = false;   // the last range was trainable and its segment may grow
        core::Treatment last{};
        for (std::size_t i = 0; i < ranges.size(); ++i) {
            if (ranges[i].count == 0) continue;
            const core::Treatment t = treatment(i);
            if (t.frozen) {
                open = false;
                continue;
            }
            if (open && t == last) {
                if constexpr (Fill) (*out)[k - 1].count += ranges[i].count;
            } else {
                if constexpr (Fill) (*out)[k] = {ranges[i].offset, ranges[i].count, state, t.decay, t.lr_scale};
                ++k;
            }
            state += ranges[i].count;
            open = true;
            last = t;
        }
        return k;
    }
    static constexpr std::size_t segment_count = make_segments<false, 0>(nullptr);
    static constexpr std::array<core::ParamSegment, segment_count> segments = [] {
        std::array<core::ParamSegment, segment_count> out{};
        make_segments<true>(&out);
        return out;
    }();

    static constexpr std::size_t trainable = [] {
        std::size_t n = 0;
        for (const auto& s : segments) n += s.count;
        return n;
    }();

    // [begin, end) runs of frozen parameters, in order.
    template <bool Fill, std::size_t Size>
    static constexpr std::size_t make_frozen_runs(std::array<std::pair<std::size_t, std::size_t>, Size>* out)
    {
        std::size_t k = 0;
        bool open = false;
        for (std::size_t i = 0; i < ranges.size(); ++i) {
            if (ranges[i].count == 0) continue;
            if (!treatment(i).frozen) {
                open = false;
                continue;
            }
            if (open) {
                if constexpr (Fill) (*out)[k - 1].second += ranges[i].count;
            } else {
                if constexpr (Fill) (*out)[k] = {ranges[i].offset, ranges[i].offset + ranges[i].count};
                ++k;
            }
            open = true;
        }
        return k;
    }
    static constexpr std::size_t frozen_run_count = make_frozen_runs<false, 0>(nullptr);
    static constexpr std::array<std::pair<std::size_t, std::size_t>, frozen_run_count> frozen_runs = [] {
        std::array<std::pair<std::size_t, std::size_t>, frozen_run_count> out{};
        make_frozen_runs<true>(&out);
        return out;
    }();

    // The treatment of every parameter, hashed (FNV-1a over the segments and frozen runs).
    static constexpr std::uint64_t signature = [] {
        std::uint64_t h = 0xcbf29ce484222325ull;
        auto mix = [&](std::uint64_t v) {
            for (int b = 0; b < 8; ++b) h = (h ^ ((v >> (8 * b)) & 0xff)) * 0x100000001b3ull;
        };
        for (const auto& s : segments) {
            mix(s.begin);
            mix(s.count);
            mix(std::bit_cast<std::uint32_t>(s.decay));
            mix(std::bit_cast<std::uint32_t>(s.lr_scale));
        }
        for (const auto& [begin, end] : frozen_runs) {
            mix(begin);
            mix(end);
        }
        return h;
    }();
};

} // namespace replica::model
