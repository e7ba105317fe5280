#pragma once
// Text from a token model: its next-token logits one position at a time with a cache of keys and
// values (Decoder), and sampling from them (generate).
//
//   std::vector<std::int32_t> text = generate(model, prompt, 200, {.temperature = 0.8f, .top_k = 40, .seed = 1});
//   Decoder<Gpt> decoder{model};                        // the parameters, copied to the host once
//   std::span<const float> logits = decoder.push(id);   // (Vocab): the token after those pushed
//
// Model: a token model, Sequential<Input<Tokens<Context>>, Embedding<Vocab, Dim>, ..., Layer giving
// (Context, Vocab) logits[, SequenceCrossEntropy]> (models::GPT), or a DataParallel of one, on any
// device: decoding reads model.parameters() and runs on the host, in float, each op's decode
// (layers/decode.hpp); an op without one (a convolution) makes it a compile error naming the op.
// Products are summed in double in a fixed order, without BLAS or threads, so that the same
// parameters, prompt, n and options give the same ids on every run.
//
// The window. The logits after push(id) are the model's at the last position of the window, the ids
// pushed since reset() and numbered from position 0, up to Context of them; pushing onto a full
// window first drops all but its last max(Context / 2, 1) - 1 ids, renumbered from 0, and decodes
// them again, then the new id: the window is then its last max(Context / 2, 1) ids. A token thus
// costs one position, and every Context / 2 tokens or so the window's Context / 2 positions are
// decoded again: at most two positions a token on average. A prompt longer than Context is read the
// same way, id by id.
//
// Sampling (Sampler, generate's): the next id is drawn from softmax(logits / temperature) over the
// top_k largest logits (all with top_k = 0; ties: the lower id first), by one uniform draw of
// core::random_uniform(seed, Stream::sample, 0, position, 0), position that of the new id in the
// output (the prompt's first id at 0). A temperature near 0 picks the largest logit (greedy), and
// top_k = 1 does at any temperature.
//
// Refused with replica::Error: an empty prompt, a prompt id outside [0, Vocab) (the message names
// its position and value), a temperature that is not finite and > 0, top_k > Vocab. The decoder and
// the sampler allocate once: a token allocates nothing beyond the output's own growth.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "replica/core/config.hpp"
#include "replica/core/error.hpp"
#include "replica/core/rng.hpp"
#include "replica/layers/decode.hpp"
#include "replica/model/concepts.hpp"

namespace REPLICA_NAMESPACE::train {

struct GenerateOptions {
    float temperature = 1.0f;   // logits are divided by it; finite and > 0
    std::size_t top_k = 0;      // draw among the top_k largest logits; 0: all
    std::uint64_t seed = 0;     // the draws' (Stream::sample)
};

namespace detail {
inline std::string id_text(std::int32_t id, std::size_t vocabulary)
{
    return "token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(vocabulary) + ")";
}
} // namespace detail

// The next-token logits of a token model, one pushed id at a time (see the top: the window).
template <class Model>
class Decoder {
    using M = typename model::replica_of<Model>::type;   // the Sequential it runs: its replicas' for a DataParallel
    static_assert(requires { M::reads_tokens; } && M::reads_tokens,
                  "Decoder and generate need a token model: Sequential<Input<Tokens<Context>>, Embedding<Vocab, "
                  "Dim>, ...>");
    using chain = typename M::chain;
    static_assert(!M::reads_tokens || (chain::output_shape::rank == 2 &&
                                       layers::row_size<typename chain::output_shape> == M::vocabulary),
                  "Decoder and generate read next-token logits: the model's output must be (positions, Vocab), "
                  "Vocab its Embedding's (a TiedHead, or a Linear<Vocab>, last)");

public:
    static constexpr std::size_t context = chain::input_shape::size;   // the window's most positions
    static constexpr std::size_t vocabulary = M::vocabulary;
    // Ids a full window keeps when a new one is pushed, the new one included.
    static constexpr std::size_t kept = std::max<std::size_t>(context / 2, 1);

    explicit Decoder(const Model& model) : Decoder(model.parameters()) {}
    // From the model's flat parameters (M::param_count of them, in its layout).
    explicit Decoder(std::vector<float> params)
        : params_(std::move(params)), cache_(chain::decode_cache), scratch_(chain::decode_scratch),
          logits_(vocabulary)
    {
        core::require(params_.size() == M::param_count, "Decoder: got " + std::to_string(params_.size()) +
                                                            " parameters for a model of " + std::to_string(M::param_count));
        window_.reserve(context);
    }

    // A new sequence: the window empty.
    void reset() { window_.clear(); }

    // Appends id to the window (see the top) and returns the logits of the token after it, valid until
    // the next push. Error for an id outside [0, Vocab).
    std::span<const float> push(std::int32_t id)
    {
        core::require(id >= 0 && std::size_t(id) < vocabulary, "Decoder::push: " + detail::id_text(id, vocabulary));
        if (window_.size() == context) {
            window_.erase(window_.begin(), window_.end() - std::ptrdiff_t(kept - 1));
            for (std::size_t p = 0; p < window_.size(); ++p) decode(window_[p], p);
        }
        window_.push_back(id);
        decode(id, window_.size() - 1);
        return logits_;
    }

    // The ids the last logits are of, at positions 0, 1, ...
    std::span<const std::int32_t> window() const { return window_; }
    std::span<const float> logits() const { return logits_; }

private:
    void decode(std::int32_t id, std::size_t position)
    {
        // The first op reads the id through x (layers/op.hpp's token_ids).
        chain::decode(layers::DecodeArgs{.params = params_.data(),
                                         .x = reinterpret_cast<const float*>(static_cast<const void*>(&id)),
                                         .y = logits_.data(),
                                         .position = position,
                                         .cache = cache_.data(),
                                         .scratch = scratch_.data()});
    }

    std::vector<float> params_;
    std::vector<float> cache_;
    std::vector<float> scratch_;
    std::vector<float> logits_;
    std::vector<std::int32_t> window_;
};

// Draws an id from logits as generate does (see the top); its buffers grow to the vocabulary once.
class Sampler {
public:
    explicit Sampler(const GenerateOptions& options) : options_(options)
    {
        core::require(std::isfinite(options.temperature) && options.temperature > 0.0f,
                      "generate: temperature " + std::to_string(options.temperature) +
                          " must be finite and > 0 (near 0 is greedy; top_k = 1 is greedy at any temperature)");
    }

    // The id drawn from logits for output position `position` (the draw's counter).
    std::int32_t operator()(std::span<const float> logits, std::uint64_t position)
    {
        const std::size_t v = logits.size();
        core::require(v > 0 && options_.top_k <= v, "generate: top_k " + std::to_string(options_.top_k) +
                                                        " is more than the vocabulary of " + std::to_string(v) +
                                                        " (0 draws among all)");
        order_.resize(v);
        weights_.resize(v);
        for (std::size_t i = 0; i < v; ++i) order_[i] = std::int32_t(i);
        std::size_t k = v;
        if (options_.top_k > 0 && options_.top_k < v) {
            k = options_.top_k;
            std::partial_sort(order_.begin(), order_.begin() + std::ptrdiff_t(k), order_.end(),
                              [&](std::int32_t a, std::int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
        }
        float most = logits[order_[0]];
        for (std::size_t i = 1; i < k; ++i) most = std::max(most, logits[order_[i]]);
        double total = 0.0;
        for (std::size_t i = 0; i < k; ++i)
            total += weights_[i] = std::exp((double(logits[order_[i]]) - double(most)) / double(options_.temperature));
        const double target = double(core::random_uniform(options_.seed, core::Stream::sample, 0, position, 0)) * total;
        double sum = 0.0;
        std::size_t chosen = 0;
        for (std::size_t i = 0; i < k; ++i) {
            if (weights_[i] <= 0.0) continue;
            chosen = i;
            sum += weights_[i];
            if (sum > target) break;
        }
        return order_[chosen];
    }

private:
    GenerateOptions options_;
    std::vector<std::int32_t> order_;
    std::vector<double> weights_;
};

// The prompt followed by n ids drawn one after the other (see the top).
template <class Model>
std::vector<std::int32_t> generate(const Model& model, std::span<const std::int32_t> prompt, std::size_t n,
                                   const GenerateOptions& options = {})
{
    constexpr std::size_t vocabulary = Decoder<Model>::vocabulary;
    core::require(!prompt.empty(), "generate: the prompt is empty: give it at least one token id");
    for (std::size_t p = 0; p < prompt.size(); ++p)
        core::require(prompt[p] >= 0 && std::size_t(prompt[p]) < vocabulary,
                      "generate: at position " + std::to_string(p) + " of the prompt, " +
                          detail::id_text(prompt[p], vocabulary));
    core::require(options.top_k <= vocabulary, "generate: top_k " + std::to_string(options.top_k) +
                                                   " is more than the model's vocabulary of " +
                                                   std::to_string(vocabulary) + " (0 draws among all)");
    Sampler sample{options};
    Decoder<Model> decoder{model};
    std::vector<std::int32_t> out(prompt.begin(), prompt.end());
    out.reserve(prompt.size() + n);
    std::span<const float> logits;
    for (const std::int32_t id : prompt) logits = decoder.push(id);
    for (std::size_t i = 0; i < n; ++i) {
        out.push_back(sample(logits, out.size()));
        if (i + 1 < n) logits = decoder.push(out.back());
    }
    return out;
}

} // namespace replica::train

namespace REPLICA_NAMESPACE {
using train::Decoder;
using train::generate;
using train::GenerateOptions;
using train::Sampler;
} // namespace replica
