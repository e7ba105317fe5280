// Parallel layouts beyond plain replicas, against the plain model on CPU devices: Pipeline
// (parallel/pipeline.hpp), a model cut into stages and trained with micro-batches under each schedule,
// TensorParallel (parallel/tensor_parallel.hpp), a model's attention and MLPs split over devices, and
// DataParallel with its optimizer state sharded (ZeRO-1, DataParallelOptions::shard); and optimizers
// that look at the whole gradient over them (layout_checks.hpp). Their [cuda] tests (stages, ranks
// and replicas sharing one GPU) are in test_cuda.cpp.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "catch.hpp"
#include "layout_checks.hpp"
#include "models.hpp"
#include "support.hpp"

// The runner compiles the test files in groups (tests/meson.build): this file's names stay in its own
// namespace.
namespace test_layouts {

using namespace replica;
using namespace replica::testing;

namespace {

// Stage 1 of 3: Dropout, Linear<16> (layers 2 and 3), reading the 16 features of layer 1.
static_assert(std::is_same_v<Pipeline<PipeMlp, Cuts<2, 4>>::stage_type<1>::input_shape, Shape<16>>);
static_assert(Pipeline<PipeMlp, Cuts<2, 4>>::stage_type<1>::param_count == 16 * 16 + 16);
static_assert(std::is_same_v<Pipeline<PipeGpt, Cuts<3>>::stage_type<1>::input_shape, Shape<8, 16>>);
static_assert(Pipeline<PipeGpt, Cuts<3>>::param_count == PipeGpt::param_count);
static_assert(model::TrainableModel<Pipeline<PipeGpt, Cuts<2, 4>, GPipe>>);

template <class M>
auto data_for()
{
    if constexpr (M::reads_tokens) return TokenBatches<M>(50, 3);
    else return RandomBatches<M>(50, 3);
}

// 5 AdamW steps of 10 samples (weight decay on the weights and embeddings); the losses in `losses`.
template <class Model, class Data>
std::vector<float> five_adamw_steps(Model& model, const Data& data, std::vector<double>* losses = nullptr)
{
    AdamW opt{{.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.95f, .weight_decay = 0.1f}};
    for (std::size_t s = 0; s < 5; ++s) {
        const double l = train_step(model, opt, data.batch(s * 10, 10, s * 10));
        if (losses) losses->push_back(l);
    }
    return parameters(model);
}

template <class M, class C, class S>
void check_equals_plain(std::size_t micro_batches)
{
    using P = Pipeline<M, C, S>;
    CAPTURE(P::stage_count, S::name, micro_batches);
    const auto data = data_for<M>();
    M plain{Device::cpu(), 5};
    P piped{cpus(P::stage_count), 5, {.micro_batches = micro_batches}};
    REQUIRE(differences(parameters(piped), parameters(plain)) == "");   // M's parameters, M's layout
    std::vector<double> want_losses, got_losses;
    const std::vector<float> want = five_adamw_steps(plain, data, &want_losses);
    const std::vector<float> got = five_adamw_steps(piped, data, &got_losses);
    if (micro_batches == 1) {   // the same sums in the same order: the same bits
        CHECK(differences(got, want) == "");
        CHECK(differences(piped.optimizer_state(), plain.optimizer_state()) == "");
    } else {   // each stage sums its micro-batches' gradients: float rounding
        const std::vector<bool> noise = zero_gradient<M>(data);
        // The GPT's: 2 blocks' key biases, and the rows of tokens that the batch lacks (exact zeros).
        const auto zeros = std::size_t(std::count(noise.begin(), noise.end(), true));
        CHECK((M::reads_tokens ? zeros >= 2 * 16 && zeros < 200 : zeros == 0));
        CHECK(norm_relative(without(want, noise), without(got, noise)) < 1e-6);
    }
    for (std::size_t s = 0; s < 5; ++s) CHECK(got_losses[s] == Approx(want_losses[s]).epsilon(1e-6));
}

} // namespace

TEST_CASE("The schedules: GPipe runs every forward then every backward; 1F1B keeps at most p - s in flight",
          "[cpu][pipeline]")
{
    auto spelled = [](const std::vector<PipelineTask>& tasks) {
        std::string s;
        for (const auto& t : tasks) s += (t.backward ? "B" : "F") + std::to_string(t.micro) + " ";
        return s;
    };
    CHECK(spelled(GPipe::tasks(1, 3, 3)) == "F0 F1 F2 B0 B1 B2 ");
    CHECK(GPipe::slots(1, 3, 5) == 5);
    CHECK(spelled(OneFOneB::tasks(0, 3, 4)) == "F0 F1 F2 B0 F3 B1 B2 B3 ");
    CHECK(spelled(OneFOneB::tasks(1, 3, 4)) == "F0 F1 B0 F2 B1 F3 B2 B3 ");
    CHECK(spelled(OneFOneB::tasks(2, 3, 4)) == "F0 B0 F1 B1 F2 B2 F3 B3 ");
    CHECK(spelled(OneFOneB::tasks(0, 4, 2)) == "F0 F1 B0 B1 ");   // fewer micro-batches than stages
    CHECK(OneFOneB::slots(0, 3, 4) == 3);
    CHECK(OneFOneB::slots(2, 3, 4) == 1);
    CHECK(OneFOneB::slots(0, 4, 2) == 2);
    // In every order a stage's backward of i comes after its forward of i, each exactly once.
    for (std::size_t p : {2, 3, 4})
        for (std::size_t m : {1, 2, 5})
            for (std::size_t s = 0; s < p; ++s)
                for (const auto& tasks : {GPipe::tasks(s, p, m), OneFOneB::tasks(s, p, m)}) {
                    std::vector<int> seen(m, 0);
                    for (const auto& t : tasks) {
                        if (t.backward) CHECK(seen[t.micro] == 1);
                        seen[t.micro] += 1;
                    }
                    for (int v : seen) CHECK(v == 2);
                }
}

TEST_CASE("A Pipeline of 2 and 3 stages equals the plain model after 5 AdamW steps, GPipe and 1F1B",
          "[cpu][pipeline]")
{
    SECTION("an MLP with dropout")
    {
        check_equals_plain<PipeMlp, Cuts<3>, GPipe>(4);
        check_equals_plain<PipeMlp, Cuts<3>, OneFOneB>(4);
        check_equals_plain<PipeMlp, Cuts<2, 4>, GPipe>(3);
        check_equals_plain<PipeMlp, Cuts<1, 5>, OneFOneB>(4);
    }
    SECTION("a GPT of two blocks")
    {
        check_equals_plain<PipeGpt, Cuts<3>, OneFOneB>(4);
        check_equals_plain<PipeGpt, Cuts<2, 4>, GPipe>(4);
        check_equals_plain<PipeGpt, Cuts<3, 5>, OneFOneB>(3);
    }
    SECTION("one micro-batch: the same bits")
    {
        check_equals_plain<PipeMlp, Cuts<2, 4>, OneFOneB>(1);
        check_equals_plain<PipeGpt, Cuts<3>, GPipe>(1);
    }
}

TEST_CASE("A Pipeline evaluates and predicts as the plain model, and takes its parameters and optimizer state",
          "[cpu][pipeline]")
{
    const auto data = data_for<PipeGpt>();
    PipeGpt plain{Device::cpu(), 2};
    Pipeline<PipeGpt, Cuts<2, 4>> piped{cpus(3), 9, {.micro_batches = 3}};
    five_adamw_steps(plain, data);
    piped.set_parameters(plain.parameters());
    piped.set_optimizer_state(plain.optimizer_state());
    CHECK(differences(piped.parameters(), plain.parameters()) == "");
    CHECK(differences(piped.optimizer_state(), plain.optimizer_state()) == "");

    const auto batch = data.batch(0, 20, 0);
    const auto want = plain.evaluate(batch.inputs, batch.labels, 20);
    const auto got = piped.evaluate(batch.inputs, batch.labels, 20);
    CHECK(got.loss_sum == Approx(want.loss_sum).epsilon(1e-6));
    CHECK(got.correct == want.correct);
    std::vector<float> want_out(20 * PipeGpt::output_shape::size), got_out(want_out.size());
    plain.predict(batch.inputs, 20, want_out.data());
    piped.predict(batch.inputs, 20, got_out.data());
    CHECK(differences(got_out, want_out) == "");   // the same layers on the same samples

    // Training on from the same state stays with the plain model (but for the parameters of no gradient).
    const std::vector<bool> noise = zero_gradient<PipeGpt>(data);
    const std::vector<float> want_w = five_adamw_steps(plain, data);
    const std::vector<float> got_w = five_adamw_steps(piped, data);
    CHECK(norm_relative(without(want_w, noise), without(got_w, noise)) < 1e-6);
}

TEST_CASE("A checkpoint written by a Pipeline loads into the plain model, and one of the plain model into a Pipeline",
          "[cpu][pipeline][checkpoint]")
{
    const TempDir dir;
    const auto data = data_for<PipeGpt>();
    Pipeline<PipeGpt, Cuts<3>, GPipe> piped{cpus(2), 4, {.micro_batches = 2}};
    AdamW opt{{.lr = 0.01f}};
    for (std::size_t s = 0; s < 2; ++s) train_step(piped, opt, data.batch(s * 10, 10, s * 10));
    save_checkpoint(dir / "piped.ckpt", piped, {.step = 2}, opt);
    PipeGpt plain{Device::cpu(), 0};
    AdamW loaded{{.lr = 0.01f}};
    CHECK(load_checkpoint(dir / "piped.ckpt", plain, loaded).step == 2);
    CHECK(differences(plain.parameters(), piped.parameters()) == "");
    CHECK(differences(plain.optimizer_state(), piped.optimizer_state()) == "");
    CHECK(loaded.step_count() == opt.step_count());

    train_step(plain, loaded, data.batch(20, 10, 20));
    save_checkpoint(dir / "plain.ckpt", plain, {.step = 3}, loaded);
    Pipeline<PipeGpt, Cuts<2, 4>, OneFOneB> other{cpus(3), 1};
    AdamW again{{.lr = 0.01f}};
    load_checkpoint(dir / "plain.ckpt", other, again);
    CHECK(differences(other.parameters(), plain.parameters()) == "");
    CHECK(differences(other.optimizer_state(), plain.optimizer_state()) == "");
}

TEST_CASE("A Pipeline refuses a device list of another length, repeated CPU devices, no micro-batches, and "
          "the reproducible mode",
          "[cpu][pipeline]")
{
    using P = Pipeline<PipeMlp, Cuts<3>>;
    CHECK_THROWS_WITH((P{cpus(3)}), Catch::Contains("a Pipeline of 2 stages needs 2 devices"));
    CHECK_THROWS_WITH((P{{Device::cpu(0), Device::cpu(0)}}), Catch::Contains("appears twice"));
    CHECK_THROWS_WITH((P{cpus(2), 0, {.micro_batches = 0}}), Catch::Contains("micro_batches must be at least 1"));
    P piped{cpus(2)};
    const auto data = data_for<PipeMlp>();
    SGD opt{{.lr = 0.1f}};
    CHECK_THROWS_WITH(train_step(piped, opt, data.batch(0, 8, 0), {.reproducible = true, .micro_shard = 4}),
                      Catch::Contains("reproducible mode does not run over a Pipeline"));
}

namespace {
// 5 steps of 10 samples under opt; parameters and optimizer state after them.
template <class Model, class Data, class Opt>
std::pair<std::vector<float>, std::vector<float>> five_steps_with(Model& model, const Data& data, Opt opt)
{
    for (std::size_t s = 0; s < 5; ++s) train_step(model, opt, data.batch(s * 10, 10, s * 10));
    return {parameters(model), model.optimizer_state()};
}

template <class M, class Dispatch, class Opt>
void check_sharded(const Opt& opt)
{
    const auto data = data_for<M>();
    for (std::size_t replicas : {2, 3, 4}) {
        CAPTURE(replicas, Dispatch::name);
        DataParallel<M, Dispatch> whole{cpus(replicas), 5};
        DataParallel<M, Dispatch> sharded{cpus(replicas), 5, {.shard = Shard::optimizer_state}};
        const auto want = five_steps_with(whole, data, opt);
        const auto got = five_steps_with(sharded, data, opt);
        CHECK(differences(got.first, want.first) == "");
        CHECK(differences(got.second, want.second) == "");   // the shards, one after the other
        constexpr std::size_t per = Opt::state_per_param;
        for (std::size_t r = 0; r < replicas; ++r) {
            CAPTURE(r);
            CHECK(differences(sharded.replica(r).parameters(), want.first) == "");   // every replica has every shard
            CHECK(sharded.optimizer_state_floats(r) == parallel::share(M::trainable_count, replicas, r).count * per);
            CHECK(whole.optimizer_state_floats(r) == M::trainable_count * per);
        }
        // The state set back (a resumed run): kept whole until the next update, which hands each
        // replica its shard; one more step on both gives the same bits.
        DataParallel<M, Dispatch> resumed{cpus(replicas), 6, {.shard = Shard::optimizer_state}};
        resumed.set_parameters(want.first);
        resumed.set_statistics(whole.statistics());   // BatchNorm's sums are centred on its running means
        resumed.set_optimizer_state(want.second);
        CHECK(differences(resumed.optimizer_state(), want.second) == "");
        Opt once = opt, again = opt;
        train_step(whole, once, data.batch(0, 10, 50));
        train_step(resumed, again, data.batch(0, 10, 50));
        CHECK(differences(parameters(resumed), parameters(whole)) == "");
        CHECK(differences(resumed.optimizer_state(), whole.optimizer_state()) == "");
    }
}
} // namespace

TEST_CASE("ZeRO-1: optimizer state sharded over 2-4 CPU replicas gives the unsharded bits, 1/N of the state a replica",
          "[cpu][parallel][zero]")
{
    SECTION("a GPT, AdamW with clipping, both policies")
    {
        const ClipGradNorm opt{AdamW{{.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.95f, .weight_decay = 0.1f}}, 0.5f};
        check_sharded<PipeGpt, Threaded>(opt);
        check_sharded<PipeGpt, SingleThread>(opt);
    }
    SECTION("BatchNorm over the global batch and residual blocks, SGD with momentum")
    {
        check_sharded<SmallResNet, Threaded>(SGD{{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f}});
    }
    SECTION("bf16 activations")
    {
        check_sharded<with_precision<PipeMlp, bf16>, Threaded>(Adam{{.lr = 0.01f}});
    }
    SECTION("an Accumulate of SGD with momentum: two planes of state, the sums mid-window")
    {
        check_sharded<PipeGpt, Threaded>(Accumulate{SGD{{.lr = 0.05f, .momentum = 0.9f}}, 2});
    }
}

TEST_CASE("ZeRO-1: a checkpoint of a sharded run loads into the plain model and into another shard count",
          "[cpu][parallel][zero][checkpoint]")
{
    const TempDir dir;
    const auto data = data_for<PipeGpt>();
    DataParallel<PipeGpt, Threaded> three{cpus(3), 2, {.shard = Shard::optimizer_state}};
    AdamW opt{{.lr = 0.01f}};
    five_steps_with(three, data, opt);
    save_checkpoint(dir / "zero.ckpt", three, {.step = 5}, opt);
    PipeGpt plain{Device::cpu(), 0};
    AdamW a{{.lr = 0.01f}};
    load_checkpoint(dir / "zero.ckpt", plain, a);
    CHECK(differences(plain.parameters(), three.parameters()) == "");
    CHECK(differences(plain.optimizer_state(), three.optimizer_state()) == "");
    DataParallel<PipeGpt, Threaded> two{cpus(2), 0, {.shard = Shard::optimizer_state}};
    AdamW b{{.lr = 0.01f}};
    load_checkpoint(dir / "zero.ckpt", two, b);
    CHECK(differences(two.optimizer_state(), three.optimizer_state()) == "");
    // Both go on alike: the plain model, and 2 shards from 3's state.
    const auto want = five_steps_with(plain, data, a);
    const auto got = five_steps_with(two, data, b);
    CHECK(norm_relative(without(want.first, zero_gradient<PipeGpt>(data)), without(got.first, zero_gradient<PipeGpt>(data))) < 1e-6);
    // A state of the wrong size is refused.
    CHECK_THROWS_WITH((DataParallel<PipeGpt, Threaded>{cpus(2), 0, {.processes = nullptr, .shard = Shard::optimizer_state}}
                           .set_optimizer_state(std::vector<float>(7))),
                      Catch::Contains("not a whole number"));
}

namespace {
// A rank of 2 holds: the attention's heads and the MLP's hidden units split, the rest whole.
using SplitBlock = tensor_split<TransformerBlock<2, 16>, 2>;
static_assert(std::is_same_v<SplitBlock,
                             Sequential<Residual<Sequential<LayerNorm<>, HeadParallelAttention<2, 2>>>,
                                        Residual<Sequential<LayerNorm<>, ColumnParallelLinear<64, 2>, GELUWith<GeluApprox::tanh>,
                                                            RowParallelLinear<16, 2>>>>>);
static_assert(std::is_same_v<tensor_split<SplitMlp, 2>, Sequential<Input<12>, ColumnParallelLinear<16, 2>, ReLU,
                                                                    RowParallelLinear<16, 2>, GELU, Linear<5>>>);
// Dropout between two Linears is not an elementwise activation of the split units: that pair stays whole.
static_assert(std::is_same_v<tensor_split<PipeMlp, 2>, Sequential<Input<12>, Linear<16>, ReLU, Dropout<0.2>,
                                                                  ColumnParallelLinear<16, 2>, GELU, RowParallelLinear<5, 2>>>);
// Each rank of 4 holds a quarter of TinyGpt's attention and MLP weights and all of the rest.
static_assert(TensorParallel<TinyGpt, 4>::shard_type::param_count ==
              TinyGpt::param_count - 3 * (4 * 32 * 32 + 3 * 32 + 2 * 32 * 128 + 128) / 4);
static_assert(model::TrainableModel<TensorParallel<PipeGpt, 2>>);

template <class M, std::size_t Ways>
void check_split_equals_plain()
{
    using TP = TensorParallel<M, Ways>;
    CAPTURE(Ways);
    const auto data = data_for<M>();
    M plain{Device::cpu(), 5};
    TP split{cpus(Ways), 5};
    REQUIRE(differences(parameters(split), parameters(plain)) == "");   // M's parameters, M's layout
    std::vector<double> want_losses, got_losses;
    const std::vector<float> want = five_adamw_steps(plain, data, &want_losses);
    const std::vector<float> got = five_adamw_steps(split, data, &got_losses);
    // The ranks' partial products summed in another order than one product's: float rounding. Left
    // out: parameters whose gradient is zero up to rounding (attention's key biases, absent tokens'
    // rows), whose Adam steps are the signs of rounding noise.
    const std::vector<bool> noise = zero_gradient<M>(data);
    CHECK(norm_relative(without(want, noise), without(got, noise)) < 1e-6);
    for (std::size_t s = 0; s < 5; ++s) CHECK(got_losses[s] == Approx(want_losses[s]).epsilon(1e-6));
    CHECK(norm_relative(split.optimizer_state(), plain.optimizer_state()) < 1e-5);
    // Every rank holds the same whole blocks, bit for bit: the same sums reached every rank.
    const auto ranges = model::param_ranges_of<typename TP::shard_type::chain>;
    for (std::size_t r = 1; r < Ways; ++r) {
        const std::vector<float> first = split.rank(0).parameters(), other = split.rank(r).parameters();
        for (const auto& range : ranges)
            if (range.split.runs == 0)
                for (std::size_t i = range.offset; i < range.offset + range.count; ++i) REQUIRE(other[i] == first[i]);
    }
}
} // namespace

TEST_CASE("TensorParallel: attention split by heads and MLPs by hidden units over 2 and 4 CPU devices equal the "
          "plain model after 5 AdamW steps",
          "[cpu][tensor]")
{
    SECTION("a GPT of two blocks, 2 ways") { check_split_equals_plain<PipeGpt, 2>(); }
    SECTION("a GPT with its head tied to the token embedding, 2 and 4 ways")
    {
        check_split_equals_plain<TinyGpt, 2>();
        check_split_equals_plain<TinyGpt, 4>();
    }
    SECTION("an MLP, its first pair split") { check_split_equals_plain<SplitMlp, 2>(); }
}

TEST_CASE("TensorParallel with bf16 activations: the sums over the ranks in float, the plain bf16 model within "
          "bf16 rounding, the whole blocks the same bits on every rank",
          "[cpu][tensor][precision]")
{
    check_bf16_split_equals_plain(cpus(2));
}

TEST_CASE("TensorParallel evaluates and predicts as the plain model, and its checkpoints are the plain model's",
          "[cpu][tensor][checkpoint]")
{
    const TempDir dir;
    const auto data = data_for<TinyGpt>();
    TinyGpt plain{Device::cpu(), 2};
    five_adamw_steps(plain, data);
    TensorParallel<TinyGpt, 2> split{cpus(2), 9};
    split.set_parameters(plain.parameters());
    split.set_optimizer_state(plain.optimizer_state());
    CHECK(differences(split.parameters(), plain.parameters()) == "");
    CHECK(differences(split.optimizer_state(), plain.optimizer_state()) == "");

    const auto batch = data.batch(0, 20, 0);
    const auto want = plain.evaluate(batch.inputs, batch.labels, 20);
    const auto got = split.evaluate(batch.inputs, batch.labels, 20);
    CHECK(got.loss_sum == Approx(want.loss_sum).epsilon(1e-6));
    CHECK(got.correct == want.correct);
    std::vector<float> want_out(20 * TinyGpt::output_shape::size), got_out(want_out.size());
    plain.predict(batch.inputs, 20, want_out.data());
    split.predict(batch.inputs, 20, got_out.data());
    CHECK(norm_relative(got_out, want_out) < 1e-6);
    const std::vector<std::int32_t> prompt{3, 1, 4};   // generate decodes M from the gathered parameters
    CHECK(generate(split, prompt, 8, {.seed = 1}) == generate(plain, prompt, 8, {.seed = 1}));

    AdamW opt{{.lr = 0.01f}};
    train_step(split, opt, data.batch(0, 10, 0));
    save_checkpoint(dir / "split.ckpt", split, {.step = 1}, opt);
    TinyGpt loaded{Device::cpu(), 0};
    AdamW again{{.lr = 0.01f}};
    CHECK(load_checkpoint(dir / "split.ckpt", loaded, again).step == 1);
    CHECK(differences(loaded.parameters(), split.parameters()) == "");
    CHECK(differences(loaded.optimizer_state(), split.optimizer_state()) == "");
    TensorParallel<TinyGpt, 4> four{cpus(4), 0};
    AdamW more{{.lr = 0.01f}};
    load_checkpoint(dir / "split.ckpt", four, more);
    CHECK(differences(four.parameters(), split.parameters()) == "");
    CHECK(differences(four.optimizer_state(), split.optimizer_state()) == "");
}

TEST_CASE("TensorParallel refuses a device list of another length, repeated CPU devices, the reproducible mode and "
          "bad token ids on every rank; a split layer outside it is refused",
          "[cpu][tensor]")
{
    using TP = TensorParallel<TinyGpt, 2>;
    CHECK_THROWS_WITH((TP{cpus(3)}), Catch::Contains("needs 2 devices"));
    CHECK_THROWS_WITH((TP{{Device::cpu(0), Device::cpu(0)}}), Catch::Contains("appears twice"));
    CHECK_THROWS_WITH((Sequential<Input<4>, ColumnParallelLinear<4, 2>>{Device::cpu()}),
                      Catch::Contains("runs in a TensorParallel<M, 2> model only"));
    TP split{cpus(2)};
    const auto data = data_for<TinyGpt>();
    AdamW opt{{.lr = 0.01f}};
    CHECK_THROWS_WITH(train_step(split, opt, data.batch(0, 8, 0), {.reproducible = true, .micro_shard = 4}),
                      Catch::Contains("reproducible mode does not run over a TensorParallel"));
    std::vector<std::int32_t> bad(data.inputs.begin(), data.inputs.begin() + 2 * 16);
    bad[5] = 64;
    CHECK_THROWS_WITH(train_step(split, opt, TokenBatch{bad.data(), data.labels.data(), 2, 0, 7}),
                      Catch::Contains("64"));
    // It trains on after a refusal, as the plain model does.
    TinyGpt plain{Device::cpu(), 0};
    AdamW same{{.lr = 0.01f}};
    const double want = train_step(plain, same, data.batch(0, 10, 0));
    CHECK(train_step(split, opt, data.batch(0, 10, 0)) == Approx(want).epsilon(1e-6));
}

TEST_CASE("auto_parallel given a memory budget picks the first layout that fits and trains it; none fitting is "
          "refused with every layout's figures",
          "[cpu][tensor][pipeline][memory]")
{
    const auto data = data_for<PipeGpt>();
    auto figures = [](std::size_t batch) {
        AutoOptions o{.batch_size = batch, .log = nullptr};
        o.memory_budget = 1;
        return AutoParallel<PipeGpt>::layouts(2, o);
    };
    auto need_in = [](const std::vector<parallel::Candidate>& all, Layout l) {
        for (const auto& c : all)
            if (c.layout == l && c.count == 2) return c.memory.total();
        FAIL("no such layout");
        return std::size_t{0};
    };
    const auto all = figures(10);
    auto need = [&](Layout l) { return need_in(all, l); };
    const std::size_t whole = need(Layout::data);
    // The parameters and gradients (floats) and AdamW's 2 floats a parameter, plus 5 samples' activations.
    CHECK(whole == PipeGpt::param_count * 16 + 5 * parallel::activation_bytes_per_sample<PipeGpt>);
    CHECK(need(Layout::sharded) == whole - PipeGpt::param_count * 4);   // half the optimizer state
    using Rank = TensorParallel<PipeGpt, 2>::shard_type;                 // the whole batch, half the blocks
    CHECK(need(Layout::tensor) == Rank::param_count * 16 + 10 * parallel::activation_bytes_per_sample<Rank>);
    CHECK(need(Layout::pipeline) < whole);

    PipeGpt plain{Device::cpu(), 4};
    const std::vector<bool> noise = zero_gradient<PipeGpt>(data);
    const std::vector<float> want = without(five_adamw_steps(plain, data), noise);
    const std::vector<Layout> order{Layout::data, Layout::sharded, Layout::tensor, Layout::pipeline};
    std::vector<Layout> chosen_layouts;
    for (std::size_t batch : {10, 2}) {   // with fewer samples the tensor layout needs less than ZeRO-1
        const auto some = figures(batch);
        for (Layout l : {Layout::sharded, Layout::tensor, Layout::pipeline}) {
            const std::size_t budget = need_in(some, l);
            CAPTURE(batch, int(l), budget);
            Layout expected = l;   // the first layout in the order that fits this budget
            for (Layout earlier : order) {
                if (earlier == l) break;
                if (need_in(some, earlier) <= budget) {
                    expected = earlier;
                    break;
                }
            }
            AutoOptions o{.dispatch = DispatchChoice::threaded, .batch_size = batch, .log = nullptr};
            o.memory_budget = budget;
            auto model = auto_parallel(PipeGpt{Device::cpu(), 4}, cpus(2), o);
            CHECK(model.layout() == expected);
            const char* built[] = {"DataParallel<threaded> over cpu:0,cpu:1", "optimizer state sharded", "TensorParallel<2> over",
                                   "Pipeline<1F1B> over"};
            CHECK_THAT(model.description(), Catch::Contains(built[int(expected)]));
            CHECK(model.memory().total() <= budget);
            CHECK(norm_relative(want, without(five_adamw_steps(model, data), noise)) < 1e-6);
            chosen_layouts.push_back(model.layout());
        }
    }
    for (Layout l : {Layout::sharded, Layout::tensor, Layout::pipeline})
        CHECK(std::count(chosen_layouts.begin(), chosen_layouts.end(), l) > 0);
    const AutoOptions base{.batch_size = 10, .log = nullptr};
    // A budget no layout fits: the error gives every layout's figures.
    AutoOptions tiny = base;
    tiny.memory_budget = need(Layout::pipeline) - 1;
    REQUIRE(need(Layout::pipeline) < std::min(need(Layout::tensor), need(Layout::sharded)));
    {
        CHECK_THROWS_WITH(auto_parallel(PipeGpt{Device::cpu(), 4}, cpus(2), tiny),
                          Catch::Contains("no layout fits the memory budget") && Catch::Contains("pipeline over 2 devices") &&
                              Catch::Contains("tensor-parallel over 2 devices") && Catch::Contains("ZeRO-1 over 2 devices"));
    }
    // Measuring: only the layouts that fit are timed, and the choice trains.
    std::ostringstream log;
    AutoOptions measured = base;
    measured.dispatch = DispatchChoice::measured;
    measured.steps = 1;
    measured.log = &log;
    // A budget that the two layouts needing least fit, and the other two not.
    std::vector<std::pair<std::size_t, Layout>> needs;
    for (Layout l : order) needs.emplace_back(need(l), l);
    std::sort(needs.begin(), needs.end());
    measured.memory_budget = needs[1].first;
    REQUIRE(needs[2].first > measured.memory_budget);
    auto chosen = auto_parallel(PipeGpt{Device::cpu(), 4}, cpus(2), measured);
    CAPTURE(log.str());
    CHECK(log.str().find("auto_parallel measured (samples/s):") != std::string::npos);
    const std::pair<Layout, const char*> timed[] = {{Layout::data, " 2 threaded "}, {Layout::sharded, "ZeRO-1 over 2 devices"},
                                                    {Layout::tensor, "tensor-parallel over 2 devices"},
                                                    {Layout::pipeline, "pipeline over 2 devices"}};
    for (const auto& [l, name] : timed) {
        CAPTURE(name);
        CHECK((log.str().find(name) != std::string::npos) == (need(l) <= measured.memory_budget));
    }
    CHECK(chosen.memory().total() <= measured.memory_budget);
    CHECK(norm_relative(want, without(five_adamw_steps(chosen, data), noise)) < 1e-6);
    // An Accumulate of a LossScale is refused at run time where a pipeline or tensor layout was chosen
    // (a compile error there, which every other layout takes); a LossScale of a ClipGradNorm trains
    // there as on the plain model.
    AutoOptions pipe = base;
    pipe.memory_budget = need(Layout::pipeline);
    auto piped = auto_parallel(PipeGpt{Device::cpu(), 4}, cpus(2), pipe);
    REQUIRE((piped.layout() == Layout::pipeline || piped.layout() == Layout::tensor));
    Accumulate scaled{LossScale{AdamW{{.lr = 0.01f}}}, 2};
    CHECK_THROWS_WITH(train_step(piped, scaled, data.batch(0, 10, 0)), Catch::Contains("to fit its memory budget"));
    PipeGpt again{Device::cpu(), 4};
    LossScale clipped{ClipGradNorm{SGD{{.lr = 0.1f}}, 0.05f}}, same = clipped;
    train_step(again, clipped, data.batch(0, 10, 0));
    train_step(piped, same, data.batch(0, 10, 0));
    CHECK(norm_relative(without(parameters(again), noise), without(parameters(piped), noise)) < 1e-6);
}

TEST_CASE("DataParallel of Pipelines: replicas of 2- and 3-stage pipelines over 4 and 6 CPU devices equal the plain "
          "model; checkpoints are the plain model's",
          "[cpu][pipeline][parallel]")
{
    const TempDir dir;
    {
        const auto data = data_for<PipeGpt>();
        const std::vector<bool> noise = zero_gradient<PipeGpt>(data);
        PipeGpt plain{Device::cpu(), 5};
        DataParallel<Pipeline<PipeGpt, Cuts<3>>, Threaded> both{cpus(4), 5, {}, {.micro_batches = 2}};
        CHECK(both.replica_count() == 2);
        CHECK(both.description() == "DataParallel<threaded> of Pipeline<1F1B> over cpu:0,cpu:1 | cpu:2,cpu:3");
        REQUIRE(differences(parameters(both), parameters(plain)) == "");
        std::vector<double> want_losses, got_losses;
        const std::vector<float> want = without(five_adamw_steps(plain, data, &want_losses), noise);
        const std::vector<float> got = without(five_adamw_steps(both, data, &got_losses), noise);
        CHECK(norm_relative(want, got) < 1e-6);
        for (std::size_t s = 0; s < 5; ++s) CHECK(got_losses[s] == Approx(want_losses[s]).epsilon(1e-6));
        // Both replicas made the same update from the same summed gradient.
        CHECK(differences(both.replica(1).parameters(), both.replica(0).parameters()) == "");
        const auto batch = data.batch(0, 9, 0);
        const auto e = both.evaluate(batch.inputs, batch.labels, 9), w = plain.evaluate(batch.inputs, batch.labels, 9);
        CHECK(e.loss_sum == Approx(w.loss_sum).epsilon(1e-5));
        AdamW opt{{.lr = 0.01f}};
        train_step(both, opt, data.batch(0, 10, 0));
        save_checkpoint(dir / "dp-pipe.ckpt", both, {.step = 1}, opt);
        PipeGpt loaded{Device::cpu(), 0};
        AdamW again{{.lr = 0.01f}};
        load_checkpoint(dir / "dp-pipe.ckpt", loaded, again);
        CHECK(differences(loaded.parameters(), both.parameters()) == "");
        CHECK(differences(loaded.optimizer_state(), both.optimizer_state()) == "");
    }
    {
        const auto data = data_for<PipeMlp>();
        PipeMlp plain{Device::cpu(), 5};
        DataParallel<Pipeline<PipeMlp, Cuts<2, 4>, GPipe>, SingleThread> three{cpus(6), 5, {}, {.micro_batches = 3}};
        CHECK(norm_relative(five_adamw_steps(plain, data), five_adamw_steps(three, data)) < 1e-6);
    }
    using Both = DataParallel<Pipeline<PipeMlp, Cuts<3>>, Threaded>;
    CHECK_THROWS_WITH((Both{cpus(3)}), Catch::Contains("needs a multiple of 2 devices"));
    CHECK_THROWS_WITH((Both{cpus(4), 0, {.shard = Shard::optimizer_state}}), Catch::Contains("cannot shard"));
}

namespace {
// 3 steps of 10 samples with its own copy of opt; the parameters after, less those of no gradient.
template <class Model, class Data, class Opt>
std::vector<float> three_steps(Model& model, const Data& data, Opt opt, const std::vector<bool>& noise)
{
    for (std::size_t s = 0; s < 3; ++s) train_step(model, opt, data.batch(s * 10, 10, s * 10));
    return without(parameters(model), noise);
}

// Frozen: the embeddings (whole on every rank, in the first stage), every bias (split ones too) and
// the LayerNorms' shifts (in both stages of a cut).
struct FreezeBiasesAndEmbeddings {
    static constexpr core::Treatment treat(core::ParamKind kind, std::uint32_t layer)
    {
        if (kind == core::ParamKind::bias || kind == core::ParamKind::shift || kind == core::ParamKind::embedding)
            return {.frozen = true};
        return DecayWeights::treat(kind, layer);
    }
};

// ClipGradNorm{opt, max_norm} over the layout that make() builds (M's parameters from seed 5) against
// the plain model: a bound that clips every step (the plain model's result differs from opt's alone
// by more than float rounding), and one that none reaches (opt's alone, bit for bit).
template <class M, class Make, class Opt>
void check_clip_equals_plain(Make&& make, const Opt& opt, double clip_effect)
{
    const auto data = data_for<M>();
    const std::vector<bool> noise = zero_gradient<M>(data);
    M unclipped{Device::cpu(), 5};
    const std::vector<float> alone = three_steps(unclipped, data, opt, noise);
    for (const float max_norm : {0.05f, 1e4f}) {
        CAPTURE(max_norm);
        M plain{Device::cpu(), 5};
        auto layout = make();
        const std::vector<float> want = three_steps(plain, data, ClipGradNorm{opt, max_norm}, noise);
        const std::vector<float> got = three_steps(layout, data, ClipGradNorm{opt, max_norm}, noise);
        CHECK(norm_relative(want, got) < 1e-6);
        if (max_norm < 1.0f) CHECK(norm_relative(want, alone) > clip_effect);
        else CHECK(differences(want, alone) == "");
    }
}
} // namespace

TEST_CASE("ClipGradNorm over a TensorParallel, a Pipeline and a DataParallel of pipelines clips by the whole "
          "model's norm, as on the plain model",
          "[cpu][tensor][pipeline][clip]")
{
    const SGD sgd{{.lr = 0.1f, .momentum = 0.9f}};
    SECTION("TensorParallel, 2 and 4 ways: the split blocks' pieces of every rank, the whole blocks once")
    {
        check_clip_equals_plain<PipeGpt>([] { return TensorParallel<PipeGpt, 2>{cpus(2), 5}; }, sgd, 1e-3);
        check_clip_equals_plain<TinyGpt>([] { return TensorParallel<TinyGpt, 4>{cpus(4), 5}; }, sgd, 1e-3);
        check_clip_equals_plain<SplitMlp>([] { return TensorParallel<SplitMlp, 2>{cpus(2), 5}; },
                                          AdamW{{.lr = 0.01f, .weight_decay = 0.1f}}, 1e-4);
    }
    SECTION("Pipeline of 2 stages: every stage's squares")
    {
        using Two = Pipeline<PipeGpt, Cuts<3>>;
        check_clip_equals_plain<PipeGpt>([] { return Two{cpus(2), 5, {.micro_batches = 2}}; }, sgd, 1e-3);
        using TwoMlp = Pipeline<PipeMlp, Cuts<3>, GPipe>;
        check_clip_equals_plain<PipeMlp>([] { return TwoMlp{cpus(2), 5, {.micro_batches = 3}}; },
                                         AdamW{{.lr = 0.01f, .weight_decay = 0.1f}}, 1e-4);
    }
    SECTION("frozen parameters count as none, on every stage and every rank")
    {
        using Frozen = with_param_rule<PipeGpt, FreezeBiasesAndEmbeddings>;
        check_clip_equals_plain<Frozen>([] { return TensorParallel<Frozen, 2>{cpus(2), 5}; }, sgd, 1e-3);
        check_clip_equals_plain<Frozen>([] { return Pipeline<Frozen, Cuts<3>>{cpus(2), 5, {.micro_batches = 2}}; }, sgd,
                                        1e-3);
    }
    SECTION("DataParallel of 2 pipelines of 2 stages")
    {
        using Both = DataParallel<Pipeline<PipeGpt, Cuts<3>>, Threaded>;
        check_clip_equals_plain<PipeGpt>([] { return Both{cpus(4), 5, {}, {.micro_batches = 2}}; }, sgd, 1e-3);
    }
}

TEST_CASE("LossScale over a Pipeline, a TensorParallel and a DataParallel of pipelines: an overflow in one part "
          "skips every part's update, and the scale moves as on the plain model",
          "[cpu][tensor][pipeline][loss_scale]")
{
    const LossScaleOptions o{.init_scale = 0x1p120f, .backoff_factor = 0x1p-10f, .growth_interval = 2};
    const AdamW adamw{{.lr = 0.01f, .weight_decay = 0.1f}};
    SECTION("Pipeline of 2 and 3 stages, GPipe and 1F1B; one micro-batch: the same bits")
    {
        check_scaled_equals_plain<PipeMlp>([] { return Pipeline<PipeMlp, Cuts<3>, GPipe>{cpus(2), 5, {.micro_batches = 2}}; },
                                           LossScale{ClipGradNorm{adamw, 0.5f}, o}, 1e-6);
        check_scaled_equals_plain<PipeMlp>(
            [] { return Pipeline<PipeMlp, Cuts<2, 4>, OneFOneB>{cpus(3), 5, {.micro_batches = 1}}; }, LossScale{adamw, o}, 0.0);
    }
    SECTION("TensorParallel, 2 ways: the overflow on rank 0 only")
    {
        check_scaled_equals_plain<SplitMlp>([] { return TensorParallel<SplitMlp, 2>{cpus(2), 5}; },
                                            LossScale{ClipGradNorm{adamw, 0.5f}, o}, 1e-6);
    }
    SECTION("an Accumulate of 2 batches: the window with the overflow dropped, on a Pipeline and a TensorParallel")
    {
        check_scaled_equals_plain<PipeMlp>([] { return Pipeline<PipeMlp, Cuts<3>>{cpus(2), 5, {.micro_batches = 2}}; },
                                           LossScale{Accumulate{ClipGradNorm{adamw, 0.5f}, 2}, o}, 1e-6);
        check_scaled_equals_plain<SplitMlp>([] { return TensorParallel<SplitMlp, 2>{cpus(2), 5}; },
                                            LossScale{Accumulate{adamw, 2}, o}, 1e-6);
    }
    SECTION("DataParallel of 2 pipelines of 2 stages")
    {
        using Both = DataParallel<Pipeline<PipeMlp, Cuts<3>>, Threaded>;
        check_scaled_equals_plain<PipeMlp>([] { return Both{cpus(4), 5, {}, {.micro_batches = 2}}; }, LossScale{adamw, o},
                                           1e-6);
    }
}

TEST_CASE("An Accumulate of a ClipGradNorm over a TensorParallel, a Pipeline and a DataParallel of pipelines clips "
          "each window's mean by the whole model's norm, as on the plain model",
          "[cpu][tensor][pipeline][clip]")
{
    const SGD sgd{{.lr = 0.1f, .momentum = 0.9f}};
    SECTION("TensorParallel, 2 ways, and with frozen parameters")
    {
        check_accumulated_clip_equals_plain<PipeGpt>([] { return TensorParallel<PipeGpt, 2>{cpus(2), 5}; }, sgd, 1e-3, 1e-6);
        using Frozen = with_param_rule<PipeGpt, FreezeBiasesAndEmbeddings>;
        check_accumulated_clip_equals_plain<Frozen>([] { return TensorParallel<Frozen, 2>{cpus(2), 5}; }, sgd, 1e-3, 1e-6);
    }
    SECTION("Pipeline of 2 and 3 stages, 1F1B and GPipe")
    {
        check_accumulated_clip_equals_plain<PipeGpt>(
            [] { return Pipeline<PipeGpt, Cuts<3>, OneFOneB>{cpus(2), 5, {.micro_batches = 2}}; }, sgd, 1e-3, 1e-6);
        check_accumulated_clip_equals_plain<PipeGpt>(
            [] { return Pipeline<PipeGpt, Cuts<2, 4>, GPipe>{cpus(3), 5, {.micro_batches = 2}}; }, sgd, 1e-3, 1e-6);
    }
    SECTION("DataParallel of 2 pipelines of 2 stages")
    {
        using Both = DataParallel<Pipeline<PipeGpt, Cuts<3>>, Threaded>;
        check_accumulated_clip_equals_plain<PipeGpt>([] { return Both{cpus(4), 5, {}, {.micro_batches = 2}}; }, sgd, 1e-3,
                                                     1e-6);
    }
}

} // namespace test_layouts
