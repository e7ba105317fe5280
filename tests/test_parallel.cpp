// DataParallel over CPU replicas equals the single model; dispatch policies agree bit for bit;
// auto_parallel picks the right type; strong and weak scaling mean what they say.

#include <cmath>
#include <sstream>

#include "catch.hpp"
#include "models.hpp"
#include "support.hpp"

// The runner compiles the test files in groups (tests/meson.build): this file's names stay in its own
// namespace.
namespace test_parallel {

using namespace replica;
using namespace replica::testing;

namespace {

constexpr int kSteps = 3;
const SGDOptions kSgd{.lr = 0.05f, .momentum = 0.9f, .weight_decay = 5e-4f};

// Parameters after kSteps steps on batches of `batch` samples (the last step's batch is smaller when
// `batch` does not divide the data), for any model type built by make().
template <class Model, class Data>
std::vector<float> train_three_steps(Model& model, const Data& data, std::size_t batch)
{
    SGD opt{kSgd};
    std::size_t first = 0;
    for (int s = 0; s < kSteps; ++s) {
        const std::size_t n = s + 1 == kSteps ? std::max<std::size_t>(1, batch - 1) : batch;
        const float loss = train_step(model, opt, data.batch(first, n, first));
        REQUIRE(std::isfinite(loss));
        first += n;
    }
    return parameters(model);
}

template <class M>
void check_equivalence(std::size_t batch)
{
    const RandomBatches<M> data(3 * batch, 11);
    M single{Device::cpu(), 3};
    const auto expected = train_three_steps(single, data, batch);
    for (std::size_t replicas : {1, 2, 3, 4}) {
        CAPTURE(replicas, batch);
        DataParallel<M, SingleThread> one_thread{cpus(replicas), 3};
        DataParallel<M, Threaded> threaded{cpus(replicas), 3};
        const auto a = train_three_steps(one_thread, data, batch);
        const auto b = train_three_steps(threaded, data, batch);
        CHECK(max_relative_difference(expected, a) < 1e-5);
        CHECK(a == b);   // bit-identical
    }
}

} // namespace

TEST_CASE("DataParallel over 1-4 CPU replicas equals the single model: LeNet", "[cpu][parallel]")
{
    check_equivalence<LeNet>(7);   // 7 = uneven over 2, 3 and 4
    check_equivalence<LeNet>(2);   // fewer samples than replicas: idle replicas contribute nothing
}

TEST_CASE("DataParallel over 1-4 CPU replicas equals the single model: Concat and Dropout", "[cpu][parallel]")
{
    check_equivalence<ConcatDropoutNet>(9);
}

TEST_CASE("DataParallel over 1-4 CPU replicas equals the single model: FCN layers, per-pixel loss", "[cpu][parallel]")
{
    check_equivalence<SmallFCN>(5);
}

TEST_CASE("DataParallel over 1-4 CPU replicas equals the single model: AlexNet-like, whole", "[cpu][parallel]")
{
    check_equivalence<SmallAlexNetPlain>(6);
}

TEST_CASE("Nested DataParallel (features only) equals the plain model", "[cpu][parallel]")
{
    const std::size_t batch = 7;
    const RandomBatches<SmallAlexNetPlain> data(3 * batch, 5);
    SmallAlexNetPlain plain{Device::cpu(), 9};
    const auto expected = train_three_steps(plain, data, batch);
    for (std::size_t replicas : {1, 2, 3, 4}) {
        CAPTURE(replicas);
        SmallAlexNet<SingleThread> one_thread{cpus(replicas), 9};
        SmallAlexNet<Threaded> threaded{cpus(replicas), 9};
        static_assert(SmallAlexNet<Threaded>::param_count == SmallAlexNetPlain::param_count);
        const auto a = train_three_steps(one_thread, data, batch);
        const auto b = train_three_steps(threaded, data, batch);
        CHECK(max_relative_difference(expected, a) < 1e-5);
        CHECK(a == b);
    }
    // A batch of 2 on 3 feature replicas.
    const RandomBatches<SmallAlexNetPlain> tiny(6, 8);
    SmallAlexNetPlain plain2{Device::cpu(), 9};
    SmallAlexNet<Threaded> nested{cpus(3), 9};
    CHECK(max_relative_difference(train_three_steps(plain2, tiny, 2), train_three_steps(nested, tiny, 2)) < 1e-5);
}

TEST_CASE("A nested DataParallel reduces its gradient bucket by bucket and equals the plain model", "[cpu][parallel]")
{
    const DataParallelOptions defaults;
    REQUIRE(parallel::make_buckets(WideFeatures::chain::param_offset, defaults.first_bucket_floats, defaults.bucket_floats).size() == 2);
    const std::size_t batch = 7;
    const RandomBatches<WidePlain> data(3 * batch, 6);
    WidePlain plain{Device::cpu(), 4};
    const auto expected = train_three_steps(plain, data, batch);
    for (std::size_t replicas : {2, 3}) {
        CAPTURE(replicas);
        WideNested<SingleThread> one_thread{cpus(replicas), 4};
        WideNested<Threaded> threaded{cpus(replicas), 4};
        const auto a = train_three_steps(one_thread, data, batch);
        CHECK(max_relative_difference(expected, a) < 1e-5);
        CHECK(a == train_three_steps(threaded, data, batch));
    }
}

TEST_CASE("Gradient buckets: a small first one, then bucket_floats each, cut at layer boundaries", "[cpu][parallel]")
{
    // LeNet's parameters: conv 520 | conv 25050 | linear 400500 | linear 5010 (offsets 0, 520, 25570, 426070).
    using G = LeNet::chain;
    using Buckets = std::vector<std::pair<std::size_t, std::size_t>>;
    const DataParallelOptions defaults;
    CHECK(parallel::make_buckets(G::param_offset, defaults.first_bucket_floats, defaults.bucket_floats) ==
          Buckets{{25570, 431080}, {0, 25570}});   // the classifier, then the convolutions
    CHECK(parallel::make_buckets(G::param_offset, 1 << 20, 1 << 20) == Buckets{{0, 431080}});
    CHECK(parallel::make_buckets(G::param_offset, 1 << 20, 20000) == Buckets{{25570, 431080}, {520, 25570}, {0, 520}});
    CHECK(parallel::make_buckets(G::param_offset, 5000, 1 << 20) == Buckets{{426070, 431080}, {0, 426070}});
    CHECK(parallel::make_buckets(G::param_offset, 1, 1) == Buckets{{426070, 431080}, {25570, 426070}, {520, 25570}, {0, 520}});
    DataParallel<LeNet, SingleThread> dp{cpus(2)};
    CHECK(dp.bucket_count() == 2);
}

TEST_CASE("DataParallel gradients are the single model's, bucket by bucket", "[cpu][parallel]")
{
    // Small buckets: one per layer with parameters, reduced while backward runs (Threaded).
    const RandomBatches<LeNet> data(9, 3);
    LeNet single{Device::cpu()};
    DataParallel<LeNet, Threaded> dp{cpus(3), 0, {.bucket_floats = 1}};
    CHECK(dp.bucket_count() == 4);
    const model::Pass pass{.seed = 1, .first_sample = 0, .training = true};
    single.forward_backward(pass, data.inputs.data(), data.labels.data(), 9, 1.0f / 9);
    dp.forward_backward(pass, data.inputs.data(), data.labels.data(), 9, 1.0f / 9);
    CHECK(max_relative_difference(single.gradients(), dp.gradients()) < 1e-5);
    for (std::size_t r = 1; r < 3; ++r) CHECK(dp.replica(r).gradients() == dp.replica(0).gradients());
}

// A model's step(), as train_step calls it, queues the update behind backward (and the all-reduce)
// before it waits: the same losses and parameters as forward_backward, then update.
template <class Model>
void check_step_is_forward_backward_then_update(Model& a, Model& b)
{
    const RandomBatches<LeNet> data(14, 5);
    SGD opt{kSgd};
    for (std::size_t first : {0, 7}) {
        const model::Pass pass{.seed = 2, .first_sample = first, .training = true};
        const float* x = data.inputs.data() + first * LeNet::input_shape::size;
        const double la = a.step({pass, x, data.labels.data() + first, 7, 1.0f / 7}, opt);
        const double lb = b.forward_backward(pass, x, data.labels.data() + first, 7, 1.0f / 7);
        b.update(opt);
        CHECK(la == lb);
        CHECK(a.parameters() == b.parameters());
        CHECK(a.optimizer_state() == b.optimizer_state());
    }
    CHECK(a.parameters() != LeNet{Device::cpu()}.parameters());   // it did train
}

TEST_CASE("A training step is forward_backward then the update", "[cpu][parallel]")
{
    LeNet a{Device::cpu()}, b{Device::cpu()};
    check_step_is_forward_backward_then_update(a, b);
    DataParallel<LeNet, SingleThread> c{cpus(2)}, d{cpus(2)};
    check_step_is_forward_backward_then_update(c, d);
    DataParallel<LeNet, Threaded> e{cpus(3)}, f{cpus(3)};
    check_step_is_forward_backward_then_update(e, f);
    for (std::size_t r = 1; r < 3; ++r) CHECK(e.replica(r).parameters() == e.replica(0).parameters());
}

// Six steps, each naming the next batch (`ahead`) so that the model queues that step behind this one,
// or not; `detour`: the batch named at step 1 is not the one step 2 trains on; `interrupt`: evaluate
// after step 2 (the step queued ahead stays valid) and new parameters after step 4 (it must be dropped).
template <class Model, class Data>
std::pair<std::vector<float>, std::vector<float>> six_steps(Model& model, const Data& data, bool ahead, bool detour,
                                                            bool interrupt)
{
    SGD opt{kSgd};
    std::vector<float> losses;
    for (std::size_t s = 0; s < 6; ++s) {
        const auto b = data.batch(s * 5, 5, s * 5), next = data.batch((s + 1) * 5 % 30, 5, (s + 1) * 5);
        const auto wrong = data.batch(25, 5, 99);
        losses.push_back(train_step(model, opt, b, {}, !ahead ? nullptr : detour && s == 1 ? &wrong : &next));
        if (interrupt && s == 2) CHECK(std::isfinite(model.evaluate(data.inputs.data(), data.labels.data(), 7).loss_sum));
        if (interrupt && s == 4) {
            auto w = parameters(model);
            for (float& v : w) v *= 0.5f;
            model.set_parameters(w);
        }
    }
    return {parameters(model), losses};
}

template <class Model>
void check_ahead(Model& plain, Model& ahead, Model& detour, Model& interrupted, Model& interrupted_ahead)
{
    const RandomBatches<LeNet> data(30, 8);
    const auto expected = six_steps(plain, data, false, false, false);
    CHECK(six_steps(ahead, data, true, false, false) == expected);
    CHECK(six_steps(detour, data, true, true, false) == expected);
    const auto interrupted_plain = six_steps(interrupted, data, false, false, true);
    CHECK(interrupted_plain != expected);
    CHECK(six_steps(interrupted_ahead, data, true, false, true) == interrupted_plain);
}

TEST_CASE("A step queued ahead (train_step's next batch) trains the same bits as one queued in its turn", "[cpu][parallel]")
{
    {
        LeNet a{Device::cpu()}, b{Device::cpu()}, c{Device::cpu()}, d{Device::cpu()}, e{Device::cpu()};
        check_ahead(a, b, c, d, e);
    }
    {
        DataParallel<LeNet, SingleThread> a{cpus(2)}, b{cpus(2)}, c{cpus(2)}, d{cpus(2)}, e{cpus(2)};
        check_ahead(a, b, c, d, e);
    }
    {
        DataParallel<LeNet, Threaded> a{cpus(3)}, b{cpus(3)}, c{cpus(3)}, d{cpus(3)}, e{cpus(3)};
        check_ahead(a, b, c, d, e);
    }
}

TEST_CASE("Dropout masks follow the global sample, not the replica", "[cpu][parallel]")
{
    using Net = Sequential<Input<20>, Dropout<0.5>, Linear<3>>;
    const RandomBatches<Net> data(8, 2);
    Net single{Device::cpu()};
    DataParallel<Net, SingleThread> dp{cpus(3)};
    const model::Pass pass{.seed = 42, .first_sample = 100, .training = true};
    single.forward_backward(pass, data.inputs.data(), data.labels.data(), 8, 0.125f);
    dp.forward_backward(pass, data.inputs.data(), data.labels.data(), 8, 0.125f);
    CHECK(max_relative_difference(single.gradients(), dp.gradients()) < 1e-6);
    // A different seed changes the masks, hence the gradient.
    Net other{Device::cpu()};
    other.forward_backward(model::Pass{.seed = 43, .first_sample = 100}, data.inputs.data(), data.labels.data(), 8, 0.125f);
    CHECK(other.gradients() != single.gradients());
}

TEST_CASE("evaluate and predict split over replicas as the single model", "[cpu][parallel]")
{
    const RandomBatches<LeNet> data(11, 4);
    LeNet single{Device::cpu()};
    DataParallel<LeNet, Threaded> dp{cpus(4)};
    const auto a = predict(single, data.inputs.data(), 11);
    const auto b = predict(dp, data.inputs.data(), 11);
    // Replicas run smaller products (other BLAS blockings, and convolutions through oneDNN or im2col by
    // shape): other rounding, measured over the whole output (an element near zero has no relative scale).
    CHECK(norm_relative(a, b) < 1e-5);
    const auto ea = single.evaluate(data.inputs.data(), data.labels.data(), 11);
    const auto eb = dp.evaluate(data.inputs.data(), data.labels.data(), 11);
    CHECK(ea.correct == eb.correct);
    CHECK(std::abs(ea.loss_sum - eb.loss_sum) < 1e-4 * std::abs(ea.loss_sum));
}

TEST_CASE("A DataParallel built from a model keeps its parameters", "[cpu][parallel]")
{
    LeNet net{Device::cpu(), 5};
    const auto w = parameters(net);
    DataParallel<LeNet, SingleThread> dp{std::move(net), cpus(3)};
    CHECK(parameters(dp) == w);
    CHECK(dp.replica(2).parameters() == w);
}

TEST_CASE("Bad device lists are refused with a clear error", "[cpu][parallel]")
{
    CHECK(error_message([] { DataParallel<LeNet> dp{{Device::cpu(0), Device::cpu(0)}}; }).find("appears twice") != std::string::npos);
    // Checked before any replica is made, so a CPU build says so too.
    CHECK(error_message([] { DataParallel<LeNet> dp{{Device::cpu(0), Device::cuda(0)}}; })
              .find("DataParallel replicas must all be CPU or all CUDA devices (got cpu:0,cuda:0)") != std::string::npos);
    CHECK(error_message([] { DataParallel<LeNet> dp{{Device::cuda(0), Device::cuda(0), Device::cuda(1)}}; })
              .find("the device list cuda:0,cuda:0,cuda:1 repeats a GPU and names others") != std::string::npos);
    CHECK(error_message([] { DataParallel<LeNet> dp{std::vector<Device>{}}; }).find("at least one device") != std::string::npos);
    CHECK(error_message([] { parse_devices("gpu:0"); }).find("write cpu:N or cuda:N") != std::string::npos);
    CHECK(error_message([] { parse_devices("cpu:x"); }).find("must be a number") != std::string::npos);
}

// ---- auto_parallel: compile-time decisions ----

using OptOutNet = Sequential<Input<4>, Linear<2>>;
} // namespace test_parallel
template <>
inline constexpr bool replica::disable_auto_data_parallelism<test_parallel::OptOutNet> = true;
namespace test_parallel {

static_assert(std::same_as<decltype(auto_parallel(LeNet{Device::cpu()})), AutoParallel<LeNet>>);
static_assert(std::same_as<decltype(auto_parallel(SmallAlexNet<Threaded>{Device::cpu()})), SmallAlexNet<Threaded>>,
              "a model with a nested DataParallel is left alone");
static_assert(std::same_as<decltype(auto_parallel(DataParallel<LeNet>{{Device::cpu()}})), DataParallel<LeNet>>,
              "a DataParallel is left alone");
static_assert(std::same_as<decltype(auto_parallel(OptOutNet{Device::cpu()})), OptOutNet>,
              "disable_auto_data_parallelism<M> = true opts out");
static_assert(parallel::contains_data_parallel<SmallAlexNet<SingleThread>>);
static_assert(!parallel::contains_data_parallel<LeNet>);

TEST_CASE("auto_parallel wraps over several devices and not over one", "[cpu][parallel]")
{
    auto one = auto_parallel(LeNet{Device::cpu()}, {Device::cpu(0)});
    CHECK(one.holds<LeNet>());
    CHECK(one.replica_count() == 1);
    auto three = auto_parallel(LeNet{Device::cpu()}, cpus(3), {.dispatch = DispatchChoice::threaded});
    CHECK(three.holds<DataParallel<LeNet, Threaded>>());
    CHECK(three.replica_count() == 3);
    CHECK(three.description() == "DataParallel<threaded> over cpu:0,cpu:1,cpu:2");
    // The wrapped model trains as the single one.
    const RandomBatches<LeNet> data(12, 1);
    LeNet single{Device::cpu()};
    CHECK(max_relative_difference(train_three_steps(single, data, 4), train_three_steps(three, data, 4)) < 1e-5);
}

TEST_CASE("Strong and weak scaling: global batch and steps per epoch", "[cpu][parallel]")
{
    using parallel::global_batch;
    CHECK(global_batch(64, 4, Scaling::strong) == 64);
    CHECK(global_batch(64, 4, Scaling::weak) == 256);
    CHECK(global_batch(64, 1, Scaling::weak) == 64);
    // Shares: uneven splits give the first replicas one more, and cover the batch exactly once.
    std::size_t covered = 0;
    for (std::size_t r = 0; r < 3; ++r) {
        const auto s = parallel::share(10, 3, r);
        CHECK(s.offset == covered);
        CHECK(s.count == (r == 0 ? 4u : 3u));
        covered += s.count;
    }
    CHECK(covered == 10);
    CHECK(parallel::share(2, 3, 2).count == 0);
}

TEST_CASE("auto_parallel takes more devices only when they beat every smaller choice by the margin", "[cpu][parallel]")
{
    using D = DispatchChoice;
    auto pick = [](std::vector<parallel::Candidate> c) {
        const auto& chosen = c[parallel::choose(c, 0.05)];
        return std::pair{chosen.count, chosen.dispatch};
    };
    // 4% faster is not enough; the faster policy of a device count wins.
    CHECK(pick({{1, D::single, 100}, {2, D::single, 104}, {2, D::threaded, 103}}) == std::pair{std::size_t{1}, D::single});
    CHECK(pick({{1, D::single, 100}, {2, D::single, 110}, {2, D::threaded, 130}}) == std::pair{std::size_t{2}, D::threaded});
    // 3 devices beat 2 by only 2%: 2 devices; by 9%: 3 devices.
    CHECK(pick({{1, D::single, 100}, {2, D::threaded, 110}, {3, D::threaded, 112}}) == std::pair{std::size_t{2}, D::threaded});
    CHECK(pick({{1, D::single, 100}, {2, D::threaded, 110}, {3, D::threaded, 120}}) == std::pair{std::size_t{3}, D::threaded});
    // A slower larger choice never wins, even after a clearly faster middle one.
    CHECK(pick({{1, D::single, 100}, {2, D::threaded, 150}, {4, D::threaded, 140}}) == std::pair{std::size_t{2}, D::threaded});
    // GoogLeNet-32 on 4 H200s as first measured: 3 threaded only 8% over 1 device.
    CHECK(pick({{1, D::single, 1806}, {2, D::single, 834}, {2, D::threaded, 1419}, {3, D::single, 583},
                {3, D::threaded, 1949}}) == std::pair{std::size_t{3}, D::threaded});
    CHECK(parallel::choose(std::vector<parallel::Candidate>{{1, D::single, 0}}, 0.05) == 0);
}

TEST_CASE("auto_parallel can measure every choice and keep the fastest", "[cpu][parallel]")
{
    LeNet net{Device::cpu(), 3};
    const auto w = parameters(net);
    std::ostringstream log;
    auto model = auto_parallel(std::move(net), cpus(2),
                               {.dispatch = DispatchChoice::measured, .batch_size = 8, .steps = 2, .log = &log});
    CAPTURE(log.str());
    CHECK(log.str().find("auto_parallel measured (samples/s): 1 device ") != std::string::npos);
    CHECK(log.str().find(" 2 single ") != std::string::npos);
    CHECK(log.str().find(" 2 threaded ") != std::string::npos);
    CHECK(log.str().find("; chose ") != std::string::npos);
    // Measuring trained copies, never the model: it starts where it was.
    CHECK(parameters(model) == w);
    CHECK(model.optimizer_state().empty());
    const bool one = log.str().find("chose 1 device") != std::string::npos;
    CHECK(model.replica_count() == (one ? 1u : 2u));
    CHECK(model.holds<LeNet>() == one);

    // One device: nothing to measure, and the log says so (not a rate of 0).
    std::ostringstream single;
    auto alone = auto_parallel(LeNet{Device::cpu(), 3}, cpus(1),
                               {.dispatch = DispatchChoice::measured, .batch_size = 8, .steps = 2, .log = &single});
    CHECK(single.str() == "auto_parallel: one device (cpu:0), nothing to measure\n");
    CHECK(alone.holds<LeNet>());
}

TEST_CASE("process_devices gives each process on a machine its contiguous share", "[cpu][parallel]")
{
    // A stand-in for MPI: `local` processes on this machine, this one the `mine`-th.
    struct Machine final : parallel::ProcessGroup {
        int mine, local;
        Machine(int m, int l) : mine(m), local(l) {}
        int rank() const override { return mine; }
        int size() const override { return local; }
        int local_rank() const override { return mine; }
        int local_size() const override { return local; }
        std::unique_ptr<parallel::Communicator> span(std::unique_ptr<parallel::Communicator> c, std::size_t) override { return c; }
        void broadcast(void*, std::size_t) override {}
        void sum(double*, std::size_t) override {}
    };
    const std::vector<Device> four = cpus(4);
    CHECK(parallel::process_devices(Machine(0, 1), four) == four);
    CHECK(parallel::process_devices(Machine(1, 2), four) == std::vector<Device>{Device::cpu(2), Device::cpu(3)});
    CHECK(parallel::process_devices(Machine(3, 4), four) == std::vector<Device>{Device::cpu(3)});
    CHECK(parallel::process_devices(Machine(1, 2), {Device::cpu()}) == std::vector<Device>{Device::cpu()});   // shared CPU
    CHECK(error_message([&] { parallel::process_devices(Machine(0, 3), four); }).find("evenly") != std::string::npos);
}

// ---- the bf16 all-reduce (DataParallelOptions::gradient_reduction) ----

TEST_CASE("A bf16 all-reduce rounds each replica's bucket, sums in float in rank order and rounds once; sync "
          "points stay float", "[cpu][parallel]")
{
    using backend::sum_rounded_to_bf16;
    const float third = 1.0f + 3.0f / 512.0f;   // 1 + 3 * 2^-9: bf16 keeps 2^-7 steps above 1, so it rounds up
    // Rounded first: 3 (1 + 2^-7) = 3 + 3 * 2^-7, a tie between bf16 neighbours 2^-6 apart, to the even one,
    // 3.03125; the float sum 3 + 9 * 2^-9 would round to 3.015625.
    const std::vector<std::vector<float>> hand{
        {third, 1.0f, 0.75f, -2.0f, 1e-3f},
        {third, 1.0f / 256.0f, 0.25f, 1.0f / 128.0f, 0.0f},
        {third, 0.0f, 0.0f, 0.0f, 0.0f},
    };
    // 1 + 2^-8 is a tie that rounds to 1: the sum is rounded after it is formed. -2 + 2^-7 is a bf16 value.
    const std::vector<float> expected{3.03125f, 1.0f, 1.0f, -2.0f + 1.0f / 128.0f, core::round_through<core::bf16>(1e-3f)};
    REQUIRE(core::round_through<core::bf16>((third + third) + third) == 3.015625f);
    const std::size_t count = expected.size();
    const std::vector<const float*> columns{hand[0].data(), hand[1].data(), hand[2].data()};
    for (std::size_t i = 0; i < count; ++i) {
        CAPTURE(i);
        CHECK(sum_rounded_to_bf16(columns, i) == expected[i]);
    }

    // Bucket 0 in bf16, id 1 (a sync point: ids from BucketPlan::buckets on) in float, in both forms.
    const parallel::BucketPlan plan{.buckets = 1, .largest = count, .reduction = GradientReduction::bf16};
    std::vector<float> float_sum(count);
    for (std::size_t i = 0; i < count; ++i) float_sum[i] = (hand[0][i] + hand[1][i]) + hand[2][i];
    REQUIRE(float_sum != expected);
    for (std::size_t id : {0, 1}) {
        CAPTURE(id);
        const std::vector<float>& want = id == 0 ? expected : float_sum;
        auto grouped = hand, threaded = hand;
        parallel::HostCommunicator comm(3, plan);
        std::vector<float*> ptrs{grouped[0].data(), grouped[1].data(), grouped[2].data()};
        comm.group_all_reduce(ptrs, count, id);
        parallel::WorkerPool pool(3);
        pool.run([&](std::size_t r) { comm.all_reduce(r, threaded[r].data(), count, id); });
        for (std::size_t r = 0; r < 3; ++r) {
            CAPTURE(r);
            CHECK(grouped[r] == want);
            CHECK(threaded[r] == want);
        }
    }
}

TEST_CASE("DataParallel with a bf16 all-reduce trains as one model to bf16's precision, and not as the fp32 "
          "all-reduce does", "[cpu][parallel]")
{
    const std::size_t batch = 7;
    const RandomBatches<LeNet> data(3 * batch, 11);
    LeNet single{Device::cpu(), 3};
    const auto initial = parameters(single);
    const auto expected = train_three_steps(single, data, batch);
    const DataParallelOptions bf16_reduce{.gradient_reduction = GradientReduction::bf16};
    for (std::size_t replicas : {2, 3}) {
        CAPTURE(replicas);
        DataParallel<LeNet, Threaded> in_bf16{cpus(replicas), 3, bf16_reduce};
        DataParallel<LeNet, SingleThread> one_thread{cpus(replicas), 3, bf16_reduce};
        DataParallel<LeNet, Threaded> in_fp32{cpus(replicas), 3};
        CHECK(in_bf16.gradient_reduction() == GradientReduction::bf16);
        const auto got = train_three_steps(in_bf16, data, batch);
        const auto fp32 = train_three_steps(in_fp32, data, batch);
        CAPTURE(update_error(got, expected, initial), update_error(fp32, expected, initial));
        // Per element the bf16 all-reduce rounds each replica's term and the sum, each within 2^-9 of
        // its value: a few of 2^-9 of the update (more where terms cancel).
        CHECK(update_error(got, expected, initial) < 4.0 / 512.0);
        CHECK(update_error(fp32, expected, initial) < 1e-5);
        CHECK(update_error(got, expected, initial) > 1e-4);   // the option does something
        CHECK(train_three_steps(one_thread, data, batch) == got);   // the host rule in both forms
        // Every replica received the same rounded sum, so they stay equal bit for bit.
        for (std::size_t r = 1; r < replicas; ++r) CHECK(in_bf16.replica(r).parameters() == got);
    }
}

TEST_CASE("The reproducible mode refuses a bf16 all-reduce, when the Trainer is made and at a step", "[cpu][parallel]")
{
    const DataParallelOptions bf16_reduce{.gradient_reduction = GradientReduction::bf16};
    DataParallel<LeNet, Threaded> dp{cpus(2), 3, bf16_reduce};
    SGD opt{kSgd};
    const std::string refusal = "the reproducible mode sums the gradient exactly, and a bf16 all-reduce would round it";
    CHECK(error_message([&] { Trainer trainer{dp, opt, {.reproducible = true}}; }).find(refusal) != std::string::npos);
    auto chosen = auto_parallel(LeNet{Device::cpu(), 3}, cpus(2),
                                {.dispatch = DispatchChoice::threaded, .data_parallel = bf16_reduce});
    CHECK(error_message([&] { Trainer trainer{chosen, opt, {.reproducible = true}}; }).find(refusal) != std::string::npos);
    const RandomBatches<LeNet> data(8, 11);
    CHECK(error_message([&] { train_step(dp, opt, data.batch(0, 8, 0), kReproducible); }).find(refusal) !=
          std::string::npos);
    // fp32 (the default) is accepted, and so is bf16 without the reproducible mode.
    DataParallel<LeNet, Threaded> fp32{cpus(2), 3};
    Trainer accepted{fp32, opt, {.reproducible = true}};
    Trainer fast{dp, opt, {}};
    // Across processes, CPU replicas reduce over MPI in fp32 only.
    struct TwoProcesses final : parallel::ProcessGroup {
        int rank() const override { return 0; }
        int size() const override { return 2; }
        std::unique_ptr<parallel::Communicator> span(std::unique_ptr<parallel::Communicator> c, std::size_t) override { return c; }
        void broadcast(void*, std::size_t) override {}
        void sum(double*, std::size_t) override {}
    } processes;
    const std::vector<backend::AnyContext> contexts{backend::cpu::Context(Device::cpu(0)), backend::cpu::Context(Device::cpu(1))};
    CHECK(error_message([&] {
              parallel::make_communicator(contexts, 2, &processes, {.buckets = 2, .largest = 8, .reduction = GradientReduction::bf16});
          }).find("CPU replicas over MPI reduce in fp32") != std::string::npos);
    CHECK(parallel::make_communicator(contexts, 2, &processes) != nullptr);
}

} // namespace test_parallel
