// Parallel layouts beyond plain replicas, against the plain model on CPU devices: Pipeline
// (parallel/pipeline.hpp), a model cut into stages and trained with micro-batches under each schedule,
// and DataParallel with its optimizer state sharded (ZeRO-1, DataParallelOptions::shard). Their [cuda]
// tests (stages and replicas sharing one GPU) are in test_cuda.cpp.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "catch.hpp"
#include "models.hpp"
#include "support.hpp"

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
