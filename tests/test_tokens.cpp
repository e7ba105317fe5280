// Issue 43's token inputs on the CPU: SequenceCrossEntropy (classes on the last axis, a label per
// position) against PyTorch's F.cross_entropy (tests/pytorch/tokens.txt, written by
// tests/pytorch/make_token_fixtures.py) and its label checks.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "catch.hpp"
#include "fixtures.hpp"
#include "models.hpp"
#include "support.hpp"

using namespace replica;
using namespace replica::testing;

namespace {

static_assert(SequenceCrossEntropy::classes<Shape<5, 7>> == 7 && SequenceCrossEntropy::label_size<Shape<5, 7>> == 5);
static_assert(SoftmaxCrossEntropy::classes<Shape<5, 7>> == 5 && SoftmaxCrossEntropy::label_size<Shape<5, 7>> == 7);
static_assert(TinyTransformer::label_size == 6 && std::is_same_v<TinyTransformer::output_shape, Shape<6, 3>>);

std::vector<std::int32_t> to_ids(const std::vector<double>& v) { return {v.begin(), v.end()}; }

// max |got - want| / max |want|; infinite where a value is not finite.
double relative_error(const std::vector<float>& got, const std::vector<double>& want)
{
    REQUIRE(got.size() == want.size());
    double most = 0.0, error = 0.0;
    for (std::size_t i = 0; i < got.size(); ++i) {
        if (!std::isfinite(got[i])) return INFINITY;
        most = std::max(most, std::abs(want[i]));
        error = std::max(error, std::abs(double(got[i]) - want[i]));
    }
    return error / most;
}

} // namespace

TEST_CASE("SequenceCrossEntropy against PyTorch's F.cross_entropy on (N * T, V): loss, gradient, correct",
          "[cpu][tokens][loss][pytorch]")
{
    const auto f = read_fixture("tokens.txt");
    using Out = Shape<5, 7>;
    const std::vector<float> logits = to_float(f.at("seq_ce_logits"));
    const std::vector<std::int32_t> labels = to_ids(f.at("seq_ce_labels"));
    const std::size_t n = 3;
    REQUIRE(logits.size() == n * Out::size);
    backend::cpu::Context ctx;
    core::LossSlot slot;
    std::vector<float> d(logits.size(), std::nanf(""));
    // The mean over N * T positions: scale 1 / (N * T), the sum divided by it.
    const float scale = 1.0f / float(n * 5);
    SequenceCrossEntropy::forward_backward<Out>(ctx, logits.data(), labels.data(), n, scale, d.data(), &slot);
    const double loss = SequenceCrossEntropy::finish<Out>(slot) / double(n * 5);
    CAPTURE(loss, f.at("seq_ce_loss")[0]);
    // Softmax and sums in double, but each logit's difference from its row's maximum rounded to
    // float first: a few 1e-9 relative; the gradient is rounded once to float.
    CHECK(std::abs(loss - f.at("seq_ce_loss")[0]) < 1e-7 * std::abs(f.at("seq_ce_loss")[0]));
    CHECK(relative_error(d, f.at("seq_ce_dlogits")) < 1e-6);
    // correct: the positions whose arg-max (over the last axis) is the label, counted by hand.
    std::size_t want = 0;
    for (std::size_t i = 0; i < n * 5; ++i) {
        const auto row = logits.begin() + std::ptrdiff_t(i * 7);
        want += std::max_element(row, row + 7) - row == labels[i];
    }
    CHECK(SequenceCrossEntropy::correct<Out>(ctx, logits.data(), labels.data(), n) == want);
}

TEST_CASE("SequenceCrossEntropy refuses a label outside [0, classes), naming its sample and position",
          "[cpu][tokens][loss]")
{
    using Out = Shape<5, 7>;
    std::vector<std::int32_t> labels(3 * 5, 2);
    CHECK_NOTHROW(SequenceCrossEntropy::check_labels<Out>(labels.data(), 3));
    labels[2 * 5 + 3] = 7;
    CHECK(SequenceCrossEntropy::first_bad_label<Out>(labels.data(), 3) == 13);
    CHECK_THROWS_WITH(SequenceCrossEntropy::check_labels<Out>(labels.data(), 3),
                      Catch::Contains("label 7 of sample 2, position 3 is outside [0, 7)"));
    labels[13] = -1;
    CHECK_THROWS_WITH(SequenceCrossEntropy::check_labels<Out>(labels.data(), 3), Catch::Contains("sample 2, position 3"));

    // train_step refuses it before anything is queued: the parameters stay as they were.
    RandomBatches<TinyTransformer> data(4, 3);
    TinyTransformer net{Device::cpu(), 1};
    const std::vector<float> before = parameters(net);
    data.labels[1 * 6 + 4] = 3;
    SGD opt{{.lr = 0.1f}};
    CHECK_THROWS_WITH(train_step(net, opt, data.batch(0, 4, 0)), Catch::Contains("sample 1, position 4 is outside [0, 3)"));
    CHECK(parameters(net) == before);
    // The loss slot's own check, for what reaches the loss otherwise (evaluate does not check first).
    CHECK_THROWS_WITH(net.evaluate(data.inputs.data(), data.labels.data(), 4), Catch::Contains("sample 1, position 4"));
}

TEST_CASE("A per-position head trains with SequenceCrossEntropy: its accuracy is over positions", "[cpu][tokens][loss]")
{
    const RandomBatches<TinyTransformer> data(8, 5);
    TinyTransformer net{Device::cpu(), 4};
    Adam opt{{.lr = 0.01f}};
    const float first = train_step(net, opt, data.batch(0, 8, 0));
    float last = first;
    for (int s = 0; s < 60; ++s) last = train_step(net, opt, data.batch(0, 8, 0));
    CAPTURE(first, last);
    CHECK(last < 0.5f * first);
    Dataset set{data.inputs, data.labels, 8, TinyTransformer::input_shape::size, TinyTransformer::label_size};
    const Metrics m = evaluate(net, set);
    CHECK(std::abs(m.loss - double(last)) < 0.2 * double(last) + 0.05);
    CHECK(m.accuracy * 48.0 == std::round(m.accuracy * 48.0));   // a whole number of the 48 positions
    CHECK(m.accuracy > 0.5);
}
