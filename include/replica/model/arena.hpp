#pragma once
// Arena<Chain, InputSize>: a model's activation memory, one allocation on its device for up to
// capacity() samples, laid out as
//
//   [ kept activations (T) | saved state (floats) | output (T) | its gradient (T) | input in T | scratch ]
//
// where T is the chain's storage type; the input region exists in bf16 and fp16 only (inputs arrive
// as floats and are converted there), and only where the chain cannot keep the converted input in its
// scratch (model/chain.hpp, holds_input). It grows to the largest batch seen and is then reused, so a warm
// step allocates nothing. Regions are counted in floats; a 16-bit region is rounded up to 16 bytes
// (floats_for), so that every region starts aligned.

#include <array>
#include <cstddef>
#include <type_traits>

#include "replica/core/config.hpp"
#include "replica/core/tensor.hpp"
#include "replica/model/concepts.hpp"

namespace REPLICA_NAMESPACE::model {

template <class Chain, std::size_t InputSize>
class Arena {
public:
    using storage = typename Chain::storage;

    std::size_t capacity() const { return capacity_; }
    std::size_t bytes() const { return memory_.size() * sizeof(float); }
    bool owns_input() const { return owns_input_; }

    // Room for n samples, replacing the memory (nothing queued may still use it). own_input: the input
    // region exists even where the chain could keep the input in its scratch (a pipeline stage's slots,
    // whose inputs must outlive the other slots' passes).
    template <class Ctx>
    void allocate(Ctx& ctx, const Chain& chain, std::size_t n, bool own_input = false)
    {
        owns_input_ = own_input;
        keeps_input_ = reduced && (own_input || !chain.holds_input());
        memory_ = ctx.template allocate<float>(layout(n).back() + chain.scratch_size(ctx, n));
        capacity_ = n;
    }

    storage* kept() { return region<storage>(0); }
    float* saved() { return region<float>(1); }
    storage* y() { return region<storage>(2); }
    storage* dy() { return region<storage>(3); }
    storage* input() { return region<storage>(4); }   // empty unless the chain cannot hold the input
    float* scratch() { return region<float>(5); }

private:
    static constexpr bool reduced = !std::is_same_v<storage, float>;
    static constexpr std::size_t output_size = Chain::output_shape::size;

    // Where each region begins, in floats, for n samples; the last entry is where scratch begins.
    std::array<std::size_t, 6> layout(std::size_t n) const
    {
        std::array<std::size_t, 6> at{};
        at[1] = at[0] + floats_for<storage>(n * Chain::kept_size);
        at[2] = at[1] + n * Chain::saved_size;
        at[3] = at[2] + floats_for<storage>(n * output_size);
        at[4] = at[3] + floats_for<storage>(n * output_size);
        at[5] = at[4] + (keeps_input_ ? floats_for<storage>(n * InputSize) : 0);
        return at;
    }
    template <class T>
    T* region(std::size_t i)
    {
        return reinterpret_cast<T*>(memory_.data() + layout(capacity_)[i]);
    }

    core::Buffer<float> memory_;
    std::size_t capacity_ = 0;
    bool keeps_input_ = false;   // the input region exists
    bool owns_input_ = false;    // allocated with own_input
};

} // namespace replica::model
