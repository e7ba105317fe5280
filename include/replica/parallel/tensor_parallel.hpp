#pragma once
// TensorParallel<M, Ways>: model M (a Sequential) with its large layers split over Ways devices
// (Megatron-LM's tensor parallelism), trained as one model.
//
//   using Split = TensorParallel<models::CharGPT, 2>;
//   Split model{{Device::cpu(0), Device::cpu(1)}};           // M's parameters from seed 0
//   float loss = train_step(model, opt, batch);               // same API as M
//
// Rank r (on devices[r]) holds M with these layers replaced by their share (layers/tensor_parallel.hpp):
//   CausalSelfAttention<Heads>                -> HeadParallelAttention<Heads, Ways>   (Heads / Ways heads)
//   Linear<A>, activation, Linear<B>          -> ColumnParallelLinear<A, Ways>, the activation,
//                                                RowParallelLinear<B, Ways>          (A / Ways hidden units)
// (the activation elementwise: ReLU, GELU, Tanh, Sigmoid), at any depth of Sequentials and Residuals;
// every other layer is whole on every rank. Each rank runs the whole batch through its share; a split
// attention layer or MLP sums its output over the ranks in forward and its input gradient in backward
// (one communicator over the ranks' devices, backend/communicators.hpp: the host's between CPU
// devices, a kernel on a GPU the ranks share, NCCL between GPUs), in rank order, so every rank holds
// the same activations, and the layers that are whole get the same gradient and the same update on
// every rank with no further sum. Each rank updates its own parameters.
//
// Parameters, optimizer state and checkpoints are M's (replica_type = M): parameters() gathers each
// split block's pieces into M's block (core::ParamSplit says where each piece lies), set_parameters
// hands each rank its pieces; the parameters start as M's from the same seed. The result equals M's up
// to float summation order (the partial products summed over the ranks). An optimizer that looks at
// the whole gradient looks at the ranks' parts (model::update_in_parts): ClipGradNorm's norm (of an
// Accumulate's mean too) is summed over the ranks, each parameter once, on the host; LossScale skips
// every rank's update when any rank's gradient is not finite. Activations in bf16 or fp16 are summed
// over the ranks as floats (layers/tensor_parallel.hpp): each rank's part rounded to 16 bits first,
// so the result is M's within 16-bit rounding. Not yet: an Accumulate of a LossScale, the
// reproducible mode, a nested DataParallel; each is refused with a message.

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "replica/backend/backend.hpp"
#include "replica/backend/communicators.hpp"
#include "replica/core/config.hpp"
#include "replica/core/error.hpp"
#include "replica/layers/activation.hpp"
#include "replica/layers/attention.hpp"
#include "replica/layers/linear.hpp"
#include "replica/layers/tensor_parallel.hpp"
#include "replica/model/concepts.hpp"
#include "replica/model/param_layout.hpp"
#include "replica/model/residual.hpp"
#include "replica/model/sequential.hpp"
#include "replica/model/state_planes.hpp"
#include "replica/parallel/layout.hpp"
#include "replica/parallel/worker_pool.hpp"

namespace REPLICA_NAMESPACE::parallel {

namespace detail {
template <class L>
struct is_elementwise : std::false_type {};
template <>
struct is_elementwise<layers::ReLU> : std::true_type {};
template <class Rule>
struct is_elementwise<layers::Elementwise<Rule>> : std::true_type {};

template <class... Ts>
struct types {};

// Layer L as rank r of Ways holds it (the same type for every rank); `even`: every split layer
// divides by Ways (when it does not, type is not used).
template <class L, std::size_t Ways>
struct split {
    using type = L;
    static constexpr bool even = true;
};
template <std::size_t Heads, std::size_t Ways>
struct split<layers::CausalSelfAttention<Heads>, Ways> {
    using type = layers::HeadParallelAttention<Heads, Ways>;
    static constexpr bool even = Heads % Ways == 0;
};
template <class Body, class Shortcut, std::size_t Ways>
struct split<model::Residual<Body, Shortcut>, Ways> {
    using type = model::Residual<typename split<Body, Ways>::type, typename split<Shortcut, Ways>::type>;
    static constexpr bool even = split<Body, Ways>::even && split<Shortcut, Ways>::even;
};

// A Sequential's entries, an MLP (Linear, elementwise activation, Linear) at a time where one begins.
template <std::size_t Ways, class Done, class... Es>
struct split_entries;
template <std::size_t Ways, class... Done>
struct split_entries<Ways, types<Done...>> {
    using type = model::Sequential<Done...>;
    static constexpr bool even = true;
};
template <std::size_t Ways, class... Done, class E, class... Es>
struct split_entries<Ways, types<Done...>, E, Es...> {
    using rest = split_entries<Ways, types<Done..., typename split<E, Ways>::type>, Es...>;
    using type = typename rest::type;
    static constexpr bool even = split<E, Ways>::even && rest::even;
};
template <std::size_t Ways, class... Done, std::size_t A, class Act, std::size_t B, class... Es>
    requires is_elementwise<Act>::value
struct split_entries<Ways, types<Done...>, layers::Linear<A>, Act, layers::Linear<B>, Es...> {
    using rest = split_entries<Ways, types<Done..., layers::ColumnParallelLinear<A, Ways>, Act, layers::RowParallelLinear<B, Ways>>, Es...>;
    using type = typename rest::type;
    static constexpr bool even = A % Ways == 0 && rest::even;
};
template <class... E, std::size_t Ways>
struct split<model::Sequential<E...>, Ways> {
    using type = typename split_entries<Ways, types<>, E...>::type;
    static constexpr bool even = split_entries<Ways, types<>, E...>::even;
};
} // namespace detail

// M's layers as each of Ways ranks holds them.
template <class M, std::size_t Ways>
using tensor_split = typename detail::split<M, Ways>::type;

// TensorParallel<M, Ways> exists: M does not hold a nested DataParallel, has something to split, and
// Ways divides every split layer's heads or hidden units.
template <class M, std::size_t Ways>
inline constexpr bool tensor_splits = !M::chain::spans_devices &&
                                      detail::split<M, Ways>::even && !std::is_same_v<tensor_split<M, Ways>, M>;

template <class M, std::size_t Ways>
class TensorParallel : public LayoutOf<M, TensorParallel<M, Ways>> {
    static_assert(model::is_sequential<M>::value, "TensorParallel<M, Ways>: M must be a model, a Sequential<Input<...>, ...>");
    static_assert(Ways >= 2, "TensorParallel<M, Ways> splits over at least 2 devices");
    static_assert(!M::chain::spans_devices, "a TensorParallel's model cannot hold a nested DataParallel");
    static_assert(!std::is_same_v<tensor_split<M, Ways>, M>,
                  "TensorParallel<M, Ways>: M has nothing to split; it splits CausalSelfAttention<Heads> by heads, and "
                  "Linear<A>, an elementwise activation, Linear<B> by A's hidden units");
    static_assert(detail::split<M, Ways>::even,
                  "TensorParallel<M, Ways>: Ways must divide the Heads of every CausalSelfAttention<Heads> and the hidden "
                  "units A of every Linear<A>, activation, Linear<B> of M (each rank takes 1/Ways of them)");

public:
    // What rank r holds: M with its split layers' shares (the same type on every rank).
    using shard_type = tensor_split<M, Ways>;

private:
    using whole_chain = typename M::chain;
    using shard_chain = typename shard_type::chain;
    static constexpr auto whole_ranges = model::param_ranges_of<whole_chain>;
    static constexpr auto shard_ranges = model::param_ranges_of<shard_chain>;
    static_assert([] {
        if (whole_ranges.size() != shard_ranges.size()) return false;
        for (std::size_t i = 0; i < whole_ranges.size(); ++i) {
            const auto& w = whole_ranges[i];
            const auto& s = shard_ranges[i];
            const bool split = s.split.runs > 0;
            if (w.kind != s.kind || w.layer != s.layer) return false;
            if (split ? (s.count != s.split.runs * s.split.piece || w.count != s.count * Ways) : w.count != s.count) return false;
        }
        return true;
    }(), "TensorParallel: a rank's parameter blocks must be M's, whole or split (layers/tensor_parallel.hpp)");

public:
    // M's types and sizes (parallel/layout.hpp).
    using base = LayoutOf<M, TensorParallel>;
    using typename base::input_element, typename base::output_shape, typename base::update_plan, typename base::Evaluation;
    using base::param_count, base::trainable_count, base::statistics_count;
    static constexpr std::size_t ways = Ways;

    // Rank r on devices[r] (distinct CPU devices, distinct GPUs, or one GPU named Ways times); M's
    // parameters from `seed`.
    explicit TensorParallel(std::vector<Device> devices, std::uint64_t seed = 0)
        : devices_(check_devices(std::move(devices))), group_(std::make_unique<Group>()), pool_(Ways)
    {
        static_assert(model::TrainableModel<TensorParallel>);
        ranks_.reserve(Ways);
        for (std::size_t r = 0; r < Ways; ++r) {
            ranks_.emplace_back(std::vector<Device>{devices_[r]}, seed, 0, false, group_.get(), r);
            runs_.push_back(runs_of(r));
        }
        split_state_ = split_state_ranges();
        group_->connect(ranks_);
        typename M::chain whole{model::Build{0, std::span<const Device>(devices_).first(1)}};
        std::vector<float> w(param_count);
        whole.init(w.data(), seed);
        set_parameters(w);
        std::vector<float> s(statistics_count);
        whole.init_statistics(s.data());
        set_statistics(s);
    }
    TensorParallel(const TensorParallel&) = delete;
    TensorParallel& operator=(const TensorParallel&) = delete;

    std::size_t replica_count() const { return 1; }
    std::size_t global_replica_count() const { return 1; }
    int process_rank() const { return 0; }
    std::span<const Device> devices() const { return devices_; }
    const Device& device() const { return devices_.front(); }
    // "TensorParallel<2> over cpu:0,cpu:1"
    std::string description() const
    {
        std::string s = "TensorParallel<" + std::to_string(Ways) + "> over ";
        for (std::size_t i = 0; i < Ways; ++i) s += (i ? "," : "") + devices_[i].name();
        return s;
    }
    shard_type& rank(std::size_t r) { return ranks_.at(r); }
    const shard_type& rank(std::size_t r) const { return ranks_.at(r); }
    // Bytes of activation memory each rank holds for the largest batch seen.
    std::vector<std::size_t> activation_bytes() const
    {
        std::vector<std::size_t> b;
        for (const auto& s : ranks_) b.push_back(s.activation_bytes());
        return b;
    }

    std::vector<float> parameters() const
    {
        return gather(param_count, [&](std::size_t r) { return ranks_[r].parameters(); }, 1);
    }
    std::vector<float> gradients() const
    {
        return gather(param_count, [&](std::size_t r) { return ranks_[r].gradients(); }, 1);
    }
    void set_parameters(std::span<const float> w)
    {
        core::require(w.size() == param_count, "set_parameters: got " + std::to_string(w.size()) +
                                                   " values, the model has " + std::to_string(param_count));
        for (std::size_t r = 0; r < Ways; ++r) {
            std::vector<float> mine(shard_type::param_count);
            for (const Run& run : runs_[r]) std::copy_n(w.begin() + std::ptrdiff_t(run.whole), run.count, mine.begin() + std::ptrdiff_t(run.mine));
            ranks_[r].set_parameters(mine);
        }
    }
    // M's layout (model/state_planes.hpp): the ranks' slices of each parameter put back in place, in
    // the parameter-major order, then M's planes.
    std::vector<float> optimizer_state() const
    {
        if (!state_.kept().empty()) return state_.kept();
        std::vector<std::vector<float>> states;   // each rank's, read once
        const std::size_t shard_trainable = shard_type::trainable_count;
        for (const auto& rank : ranks_) states.push_back(state_.parameter_major(rank.optimizer_state(), shard_trainable));
        if (states.front().empty() || shard_trainable == 0) return {};
        const std::size_t per = states.front().size() / shard_trainable;
        return state_.plane_major(gather(per * trainable_count, [&](std::size_t r) { return std::move(states[r]); }, per, true),
                                  trainable_count);
    }
    // M's layout, as optimizer_state() gives it. Before the first update, which says how the state is
    // laid out in planes, it is kept whole and handed to the ranks then.
    void set_optimizer_state(std::span<const float> state)
    {
        core::require(trainable_count > 0 ? state.size() % trainable_count == 0 : state.empty(),
                      "set_optimizer_state: " + std::to_string(state.size()) +
                          " values is not a whole number for each of the " + std::to_string(trainable_count) +
                          " trainable parameters");
        if (state_.known()) hand_state(state);
        else state_.keep(state);
    }
    std::vector<float> statistics() const { return ranks_.front().statistics(); }
    void set_statistics(std::span<const float> s)
    {
        for (auto& r : ranks_) r.set_statistics(s);
    }

    // ---- the training contract (model/concepts.hpp) ----

    double forward_backward(const model::Pass& pass, const input_element* x, const std::int32_t* labels, std::size_t n,
                            float loss_scale)
    {
        M::check_inputs(x, n);
        double loss = 0.0;
        on_every_rank([&](shard_type& s, std::size_t r) {
            const double l = s.forward_backward(pass, x, labels, n, loss_scale);
            if (r == 0) loss = l;
        });
        return loss;
    }

    double reproducible_forward_backward(const model::Pass&, const input_element*, const std::int32_t*, std::size_t, float,
                                         std::size_t)
    {
        throw Error("the reproducible mode does not run over a TensorParallel yet: train the plain model, or a "
                    "DataParallel, in that mode");
    }

    // An optimizer that looks at the whole gradient (ClipGradNorm, LossScale, an Accumulate of a
    // ClipGradNorm) looks at it over the ranks (model::update_in_parts), each rank's part on its own
    // thread and the answers combined on the host in rank order. A sum of squares counts rank 0's
    // whole gradient (the blocks every rank holds alike, counted once, and its pieces of the split
    // ones) and the other ranks' pieces of the split blocks; a non-finite gradient on any rank skips
    // every rank's update.
    template <class Opt>
    void update(const Opt& opt)
    {
        static_assert(model::UpdatesInParts<Opt, backend::cpu::Context>,
                      "an optimizer that looks at the whole gradient without saying how to look at it in parts "
                      "(update_in_parts: an Accumulate of a LossScale, an optimizer of your own) cannot update a "
                      "TensorParallel yet: wrap the Accumulate in the LossScale, or train the plain model");
        if constexpr (model::UpdatesInParts<Opt, backend::cpu::Context>) {
            if (state_.adopt<Opt>()) hand_state(state_.take());
            Ranks parts{*this};
            model::update_in_parts(opt, parts);
        }
    }

    Evaluation evaluate(const input_element* x, const std::int32_t* labels, std::size_t n)
    {
        M::check_inputs(x, n);
        Evaluation e{};
        on_every_rank([&](shard_type& s, std::size_t r) {
            const Evaluation mine = s.evaluate(x, labels, n);
            if (r == 0) e = mine;
        });
        return e;
    }

    // Rank 0 writes `out`; the others' outputs, the same values, go to a buffer kept for them.
    void predict(const input_element* x, std::size_t n, float* out)
    {
        M::check_inputs(x, n);
        if (elsewhere_.size() < (Ways - 1) * n * output_shape::size) elsewhere_.resize((Ways - 1) * n * output_shape::size);
        on_every_rank([&](shard_type& s, std::size_t r) {
            s.predict(x, n, r == 0 ? out : elsewhere_.data() + (r - 1) * n * output_shape::size);
        });
    }

private:
    // M's optimizer state (its planes) to the ranks, each its slice in its own planes.
    void hand_state(std::span<const float> state)
    {
        const std::size_t per = trainable_count ? state.size() / trainable_count : 0;
        const std::vector<float> by_parameter = state_.parameter_major(state, trainable_count);
        for (std::size_t r = 0; r < Ways; ++r) {
            std::vector<float> mine(per * shard_type::trainable_count);
            for (const Run& run : runs_[r])
                if (run.trainable)
                    std::copy_n(by_parameter.begin() + std::ptrdiff_t(run.whole_state * per), run.count * per,
                                mine.begin() + std::ptrdiff_t(run.mine_state * per));
            ranks_[r].set_optimizer_state(state_.plane_major(mine, shard_type::trainable_count));
        }
    }
    // The sum over the ranks that the split layers call: the communicator over the ranks' contexts.
    class Group final : public layers::TensorGroup {
    public:
        std::size_t size() const override { return Ways; }
        void all_reduce(std::size_t rank, float* data, std::size_t count) override
        {
            comm_->all_reduce(rank, data, count, 0);
            comm_->wait(rank);
        }
        void connect(const std::vector<shard_type>& ranks)
        {
            contexts_.clear();
            for (const auto& r : ranks) contexts_.push_back(r.context());
            comm_ = backend::make_communicator(contexts_, 1);
        }
        // Releases the ranks waiting in a sum (one failed); the next step gets a new communicator.
        void abort() { comm_->abort(); }
        void reconnect() { comm_ = backend::make_communicator(contexts_, 1); }

    private:
        std::vector<backend::AnyContext> contexts_;
        std::unique_ptr<backend::Communicator> comm_;
    };

    // The ranks as a gradient in parts (model::GradientPartsContract), in rank order.
    struct Ranks {
        using context = backend::cpu::Context;
        using rule = typename shard_type::param_rule;
        TensorParallel& t;

        bool unscale(float inv_scale)
        {
            std::array<bool, Ways> finite{};
            t.on_every_rank([&](shard_type& s, std::size_t r) { finite[r] = s.template unscale<rule, 0>(inv_scale); });
            bool all = true;
            for (bool f : finite) all = all && f;
            return all;
        }
        double squares(core::GradientAt at = core::GradientAt::params)
        {
            const bool sums = at == core::GradientAt::state;
            std::array<double, Ways> squares{};
            t.on_every_rank([&](shard_type& s, std::size_t r) {
                squares[r] = s.template gradient_squares<rule, 0>(
                    r == 0 ? (sums ? t.whole_state_ : t.whole_) : (sums ? t.split_state_ : t.split_), at);
            });
            double total = 0.0;
            for (double part : squares) total += part;
            return total;
        }
        void clip(double squares, float max_norm, core::GradientAt at = core::GradientAt::params)
        {
            t.on_every_rank([&](shard_type& s, std::size_t) { s.template clip_gradient<rule, 0>(squares, max_norm, at); });
        }
        template <class O>
        void apply(const O& o)
        {
            t.on_every_rank([&](shard_type& s, std::size_t) { s.template update_part<rule, 0>(o); });
        }
    };

    // A run of parameters that rank r holds: M's [whole, whole + count) at the rank's [mine, ...), and
    // where their optimizer state begins in each (trainable ones).
    struct Run {
        std::size_t whole, mine, count;
        bool split, trainable;
        std::size_t whole_state, mine_state;
    };
    // The state index of parameter p under a plan's segments, or -1 for a frozen one.
    template <class Plan>
    static std::ptrdiff_t state_index(std::size_t p)
    {
        for (const core::ParamSegment& g : Plan::segments)
            if (p >= g.begin && p < g.begin + g.count) return std::ptrdiff_t(g.state + (p - g.begin));
        return -1;
    }
    static std::vector<Run> runs_of(std::size_t r)
    {
        std::vector<Run> runs;
        auto add = [&](std::size_t whole, std::size_t mine, std::size_t count, bool split) {
            if (count == 0) return;
            const std::ptrdiff_t ws = state_index<update_plan>(whole), ms = state_index<typename shard_type::update_plan>(mine);
            runs.push_back({whole, mine, count, split, ws >= 0 && ms >= 0, std::size_t(std::max<std::ptrdiff_t>(ws, 0)),
                            std::size_t(std::max<std::ptrdiff_t>(ms, 0))});
        };
        for (std::size_t i = 0; i < whole_ranges.size(); ++i) {
            const auto& w = whole_ranges[i];
            const auto& s = shard_ranges[i];
            if (s.split.runs == 0) {
                add(w.offset, s.offset, s.count, false);
            } else {
                for (std::size_t o = 0; o < s.split.runs; ++o)
                    add(w.offset + (o * Ways + r) * s.split.piece, s.offset + o * s.split.piece, s.split.piece, true);
            }
        }
        return runs;
    }
    // A rank's split blocks, [begin, end) in its parameters, adjacent ones joined.
    static std::vector<std::pair<std::size_t, std::size_t>> split_ranges()
    {
        std::vector<std::pair<std::size_t, std::size_t>> ranges;
        for (const auto& s : shard_ranges) {
            if (s.split.runs == 0 || s.count == 0) continue;
            if (!ranges.empty() && ranges.back().second == s.offset) ranges.back().second += s.count;
            else ranges.push_back({s.offset, s.offset + s.count});
        }
        return ranges;
    }
    // The same in state indices: the trainable parameters of the split blocks (rank 0's runs, whose
    // places in a rank's vector are every rank's).
    std::vector<std::pair<std::size_t, std::size_t>> split_state_ranges() const
    {
        std::vector<std::pair<std::size_t, std::size_t>> ranges;
        for (const Run& run : runs_.front()) {
            if (!run.split || !run.trainable) continue;
            if (!ranges.empty() && ranges.back().second == run.mine_state) ranges.back().second += run.count;
            else ranges.push_back({run.mine_state, run.mine_state + run.count});
        }
        return ranges;
    }
    // M's vector of `size` values from each rank's, of(r): `per` values for each parameter (by state
    // index when `by_state`); a block that is not split is rank 0's.
    template <class F>
    std::vector<float> gather(std::size_t size, F&& of, std::size_t per, bool by_state = false) const
    {
        std::vector<float> all(size);
        for (std::size_t r = 0; r < Ways; ++r) {
            const std::vector<float> mine = of(r);
            for (const Run& run : runs_[r]) {
                if (!(run.split || r == 0) || (by_state && !run.trainable)) continue;
                const std::size_t from = by_state ? run.mine_state : run.mine, to = by_state ? run.whole_state : run.whole;
                std::copy_n(mine.begin() + std::ptrdiff_t(from * per), run.count * per, all.begin() + std::ptrdiff_t(to * per));
            }
        }
        return all;
    }

    static std::vector<Device> check_devices(std::vector<Device> d)
    {
        core::require(d.size() == Ways, "a TensorParallel over " + std::to_string(Ways) + " devices needs " +
                                            std::to_string(Ways) + " devices, one a rank; got " + std::to_string(d.size()));
        for (std::size_t i = 0; i < d.size(); ++i)
            for (std::size_t j = 0; j < i; ++j)
                core::require(!(d[i] == d[j]) || d[i].is_cuda(),
                              "device " + d[i].name() + " appears twice in the TensorParallel's device list: number CPU "
                              "devices cpu:0, cpu:1, ...");
        backend::check_communicator_devices(d, false);
        return d;
    }

    // f(rank's model, r) on every rank at once, each on its own thread (their split layers wait for
    // each other); if one fails, the others are released from their sums and the first error is rethrown.
    template <class F>
    void on_every_rank(F&& f)
    {
        std::exception_ptr first;
        std::mutex m;
        pool_.run([&](std::size_t r) {
            try {
                f(ranks_[r], r);
            } catch (...) {
                {
                    const std::lock_guard lock(m);
                    if (!first) first = std::current_exception();
                }
                group_->abort();
            }
        });
        if (first) {
            group_->reconnect();
            std::rethrow_exception(first);
        }
    }

    std::vector<Device> devices_;
    std::unique_ptr<Group> group_;      // the ranks' split ops hold its address
    std::vector<shard_type> ranks_;
    std::vector<std::vector<Run>> runs_;   // rank r's parameters among M's
    model::SlicedState state_;             // the optimizer state's planes; a state set before the first update
    // Where a rank's gradient_squares reads: rank 0 all of its gradient, the others their split blocks.
    std::vector<std::pair<std::size_t, std::size_t>> whole_{{0, shard_type::param_count}}, split_ = split_ranges();
    // The same in state indices, for an Accumulate's sums (Ranks::squares at GradientAt::state).
    std::vector<std::pair<std::size_t, std::size_t>> whole_state_{{0, shard_type::trainable_count}}, split_state_;
    WorkerPool pool_;
    std::vector<float> elsewhere_;      // predict: the outputs of ranks 1 ..
};

template <class T>
struct is_tensor_parallel : std::false_type {};
template <class M, std::size_t W>
struct is_tensor_parallel<TensorParallel<M, W>> : std::true_type {};

} // namespace replica::parallel

namespace REPLICA_NAMESPACE {
using parallel::tensor_split;
using parallel::tensor_splits;
using parallel::TensorParallel;
} // namespace replica
