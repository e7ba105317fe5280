#pragma once
// auto_parallel(model, devices): data parallelism without writing DataParallel.
//
//   auto model = auto_parallel(LeNet{});           // every GPU, or the CPU
//
// Returns the model itself, unwrapped (type M), when
//   - it already contains a DataParallel anywhere: the user took control (decided at compile time);
//   - disable_auto_data_parallelism<M> is true:
//       template <> inline constexpr bool disable_auto_data_parallelism<MyNet> = true;
// Otherwise returns AutoParallel<M>: on one device the model itself, on several a DataParallel<M, P>
// with the dispatch policy P that AutoOptions names; the choice is made once, at construction.

#include <chrono>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "replica/backend/backend.hpp"
#include "replica/parallel/data_parallel.hpp"

namespace replica {
// Opt-out: specialise to true for a model that must never be wrapped automatically.
template <class M>
inline constexpr bool disable_auto_data_parallelism = false;
} // namespace replica

namespace replica::parallel {

template <class M>
constexpr bool contains_data_parallel_()
{
    if constexpr (is_data_parallel<M>::value) return true;
    else return M::graph::has_data_parallel;
}
template <class M>
inline constexpr bool contains_data_parallel = contains_data_parallel_<M>();

template <class M>
inline constexpr bool wraps_automatically = !contains_data_parallel<M> && !disable_auto_data_parallelism<M>;

enum class DispatchChoice { single, threaded };

inline DispatchChoice parse_dispatch(std::string_view text)
{
    if (text == "single") return DispatchChoice::single;
    if (text == "threaded") return DispatchChoice::threaded;
    throw Error("bad dispatch '" + std::string(text) + "': write single or threaded");
}

struct AutoOptions {
    DispatchChoice dispatch = DispatchChoice::single;
    DataParallelOptions data_parallel = {};
};

template <class M>
class AutoParallel {
public:
    using replica_type = M;
    using input_shape = typename M::input_shape;
    using output_shape = typename M::output_shape;
    using loss = typename M::loss;
    using Evaluation = typename M::Evaluation;
    static constexpr std::size_t param_count = M::param_count;
    static constexpr std::size_t label_size = M::label_size;

    AutoParallel(M&& model, std::vector<Device> devices, AutoOptions options = {})
        : impl_(make(std::move(model), std::move(devices), options)) {}

    // "cpu:0" or "DataParallel<threaded> over cpu:0,cpu:1"
    std::string description() const
    {
        return std::visit(
            [](const auto& m) -> std::string {
                using T = std::decay_t<decltype(m)>;
                if constexpr (std::same_as<T, M>) return m.description();
                else {
                    std::string s = std::string("DataParallel<") + T::dispatch::name + "> over ";
                    for (std::size_t i = 0; i < m.devices().size(); ++i) s += (i ? "," : "") + m.devices()[i].name();
                    return s;
                }
            },
            impl_);
    }
    std::size_t replica_count() const
    {
        return std::visit([](const auto& m) -> std::size_t {
            if constexpr (requires { m.replica_count(); }) return m.replica_count();
            else return 1;
        }, impl_);
    }
    template <class T>
    bool holds() const { return std::holds_alternative<T>(impl_); }
    template <class T>
    T& get() { return std::get<T>(impl_); }

    std::vector<float> parameters() const { return std::visit([](const auto& m) { return m.parameters(); }, impl_); }
    std::vector<float> optimizer_state() const { return std::visit([](const auto& m) { return m.optimizer_state(); }, impl_); }
    void set_parameters(std::span<const float> w) { std::visit([&](auto& m) { m.set_parameters(w); }, impl_); }
    void set_optimizer_state(std::span<const float> s) { std::visit([&](auto& m) { m.set_optimizer_state(s); }, impl_); }

    double forward_backward(const model::Pass& pass, const float* x, const std::int32_t* labels, std::size_t n, float scale)
    {
        return std::visit([&](auto& m) { return m.forward_backward(pass, x, labels, n, scale); }, impl_);
    }
    template <class Opt>
    void update(const Opt& opt) { std::visit([&](auto& m) { m.update(opt); }, impl_); }
    Evaluation evaluate(const float* x, const std::int32_t* labels, std::size_t n)
    {
        return std::visit([&](auto& m) { return m.evaluate(x, labels, n); }, impl_);
    }
    void predict(const float* x, std::size_t n, float* out) { std::visit([&](auto& m) { m.predict(x, n, out); }, impl_); }

private:
    using Impl = std::variant<M, DataParallel<M, SingleThread>, DataParallel<M, Threaded>>;
    static Impl make(M&& model, std::vector<Device> devices, AutoOptions o)
    {
        core::require(!devices.empty(), "auto_parallel needs at least one device");
        if (devices.size() == 1) {
            if (model.device() == devices.front()) return Impl(std::in_place_index<0>, std::move(model));
            M moved{devices.front()};
            moved.set_parameters(model.parameters());
            moved.set_optimizer_state(model.optimizer_state());
            return Impl(std::in_place_index<0>, std::move(moved));
        }
        if (o.dispatch == DispatchChoice::threaded)
            return Impl(std::in_place_index<2>, std::move(model), std::move(devices), o.data_parallel);
        return Impl(std::in_place_index<1>, std::move(model), std::move(devices), o.data_parallel);
    }

    Impl impl_;
};

template <class M>
auto auto_parallel(M&& model, std::vector<Device> devices = backend::default_devices(), AutoOptions options = {})
{
    using T = std::remove_cvref_t<M>;
    static_assert(!std::is_lvalue_reference_v<M>,
                  "auto_parallel takes the model by value: pass std::move(model) or a temporary");
    if constexpr (!wraps_automatically<T>) return T(std::move(model));
    else return AutoParallel<T>(std::move(model), std::move(devices), options);
}

} // namespace replica::parallel

namespace replica {
using parallel::AutoOptions;
using parallel::AutoParallel;
using parallel::auto_parallel;
using parallel::DispatchChoice;
} // namespace replica
