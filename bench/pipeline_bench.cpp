// What a Pipeline's schedule costs: a GPT of 4 blocks (CharGPT's sizes, head untied) cut into 2 stages
// on 2 devices, trained with m micro-batches under GPipe and 1F1B; for each, the median step, the
// measured bubble (PipelineTimes::idle_fraction: 1 - the stages' busy time over 2 x the step's) beside
// GPipe's (p - 1) / (m + p - 1), and each stage's activation memory; beside them, the plain model on
// one device, a DataParallel over the two (whole and with ZeRO-1) and a TensorParallel over the two
// (attention split by heads, MLPs by hidden units).
//
//   build/bench/pipeline_bench [--devices cpu:0,cpu:1] [--batch 32] [--steps 10] [--json]
//   build/bench/pipeline_bench --devices cuda:0,cuda:0      # two stages (and two replicas) sharing a GPU
//
// On CPU devices each stage computes on its own thread with one BLAS thread, so the busy time is the
// stage's compute; on GPUs it is the host's queueing, not the device's.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "replica/replica.hpp"
#include "support/cli.hpp"

namespace {

using namespace replica;
using Net = Sequential<Input<Tokens<64>>, Embedding<256, 128>, PositionEmbedding<64>, TransformerBlock<4, 128>,
                       TransformerBlock<4, 128>, TransformerBlock<4, 128>, TransformerBlock<4, 128>, LayerNorm<>,
                       Linear<256>, SequenceCrossEntropy>;
using clock_type = std::chrono::steady_clock;

struct Data {
    std::vector<std::int32_t> ids, labels;
    explicit Data(std::size_t n) : ids(n * 64), labels(n * 64)
    {
        for (std::size_t i = 0; i < ids.size(); ++i) {
            ids[i] = std::int32_t(core::random_bits(1, core::Stream::synthetic, 0, i, 0) % 256);
            labels[i] = std::int32_t(core::random_bits(1, core::Stream::synthetic, 1, i, 0) % 256);
        }
    }
};

struct Result {
    double step_ms, idle;
};

// Median step (ms) over `steps` after 2 warm-up steps, and the median idle fraction where the model
// reports one.
template <class Model>
Result measure(Model& model, const Data& data, std::size_t batch, std::size_t steps)
{
    AdamW opt{{.lr = 1e-3f}};
    std::vector<double> ms, idle;
    for (std::size_t s = 0; s < steps + 2; ++s) {
        const TokenBatch b{data.ids.data(), data.labels.data(), batch, s * batch, 7};
        const auto t0 = clock_type::now();
        train_step(model, opt, b);
        const double t = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
        if (s < 2) continue;
        ms.push_back(t);
        if constexpr (requires { model.last_step_times(); }) idle.push_back(model.last_step_times().idle_fraction());
    }
    std::sort(ms.begin(), ms.end());
    std::sort(idle.begin(), idle.end());
    return {ms[ms.size() / 2], idle.empty() ? 0.0 : idle[idle.size() / 2]};
}

} // namespace

int main(int argc, char** argv)
try {
    CLI::App app{"a 2-stage Pipeline's step and bubble under GPipe and 1F1B, against the plain model", "pipeline_bench"};
    std::size_t batch = 32, steps = 10;
    std::string devices_text = "cpu:0,cpu:1";
    bool json = false;
    replica::examples::count_option(app, "--batch", batch, "samples a step", 1, 4096);
    replica::examples::count_option(app, "--steps", steps, "timed steps (after 2 warm-up steps)", 1, 100000);
    app.add_option("--devices", devices_text, "the two stages' devices (one GPU twice: stages sharing it)");
    app.add_flag("--json", json, "one JSON object on stdout");
    if (int code = replica::examples::parse(app, argc, argv)) return code - 1;
    std::vector<Device> devices;
    for (std::size_t begin = 0; begin <= devices_text.size();) {
        const std::size_t comma = std::min(devices_text.find(',', begin), devices_text.size());
        devices.push_back(Device::parse(devices_text.substr(begin, comma - begin)));
        begin = comma + 1;
    }
    core::require(devices.size() == 2, "--devices: name two devices, one a stage, as in cpu:0,cpu:1 or cuda:0,cuda:0");
    if (devices.front().is_cpu()) backend::cpu::set_blas_threads(1);
    const Data data(batch * (steps + 2));

    Net plain{devices.front(), 0};
    const Result one = measure(plain, data, batch, steps);
    DataParallel<Net, Threaded> dp{devices, 0};
    const Result two = measure(dp, data, batch, steps);
    std::string rows;
    if (!json) std::printf("%-24s %10s %10s %10s  %s\n", "layout", "step ms", "bubble", "(p-1)/(m+p-1)", "activations MiB a stage");
    auto row = [&](const std::string& name, const Result& r, double expected, const std::vector<std::size_t>& bytes) {
        std::string mib;
        for (std::size_t b : bytes) mib += (mib.empty() ? "" : ",") + std::to_string(double(b) / 1048576.0).substr(0, 6);
        if (json) {
            rows += std::string(rows.empty() ? "" : ",") + "{\"layout\":\"" + name + "\",\"step_ms\":" + std::to_string(r.step_ms) +
                    ",\"bubble\":" + std::to_string(r.idle) + ",\"expected\":" + std::to_string(expected) +
                    ",\"activation_mib\":[" + mib + "]}";
        } else {
            std::printf("%-24s %10.1f %10.3f %10.3f  %s\n", name.c_str(), r.step_ms, r.idle, expected, mib.c_str());
        }
    };
    DataParallel<Net, Threaded> zero{devices, 0, {.shard = Shard::optimizer_state}};
    const Result sharded = measure(zero, data, batch, steps);
    row("plain (1 device)", one, 0.0, {plain.activation_bytes()});
    row("DataParallel (2)", two, 0.0, {dp.activation_bytes()});
    row("DataParallel ZeRO-1 (2)", sharded, 0.0, {zero.activation_bytes()});
    using TP2 = TensorParallel<Net, 2>;
    TP2 split{devices, 0};
    const Result tensor = measure(split, data, batch, steps);
    row("TensorParallel (2)", tensor, 0.0, split.activation_bytes());
    // Floats a device holds besides activations: parameters and gradients, and optimizer state (AdamW: 2
    // a trainable parameter), as each layout keeps them.
    using P2 = Pipeline<Net, Cuts<4>>;
    constexpr std::size_t first = P2::stage_type<0>::param_count, second = P2::stage_type<1>::param_count;
    const std::string state0 = std::to_string(zero.optimizer_state_floats(0)), state1 = std::to_string(zero.optimizer_state_floats(1));
    if (!json) {
        std::printf("\nfloats a device holds: parameters + gradients | optimizer state (AdamW)\n");
        std::printf("%-24s %s\n", "plain, DataParallel", (std::to_string(2 * Net::param_count) + " | " +
                                                         std::to_string(dp.optimizer_state_floats(0))).c_str());
        std::printf("%-24s %s\n", "ZeRO-1 (2)", (std::to_string(2 * Net::param_count) + " | " + state0 + ", " + state1).c_str());
        std::printf("%-24s %s\n", "TensorParallel (2)", (std::to_string(2 * TP2::shard_type::param_count) + " each | " +
                                                        std::to_string(split.rank(0).optimizer_state().size()) + " each").c_str());
        std::printf("%-24s %s\n", "Pipeline (2 stages)", (std::to_string(2 * first) + ", " + std::to_string(2 * second) + " | " +
                                                         std::to_string(2 * first) + ", " + std::to_string(2 * second)).c_str());
    }
    for (std::size_t m : {1, 2, 4, 8}) {
        const double expected = 1.0 / double(m + 1);
        {
            Pipeline<Net, Cuts<4>, GPipe> p{devices, 0, {.micro_batches = m}};
            const Result r = measure(p, data, batch, steps);   // before activation_bytes: the slots it made
            row("GPipe m=" + std::to_string(m), r, expected, p.activation_bytes());
        }
        {
            Pipeline<Net, Cuts<4>, OneFOneB> p{devices, 0, {.micro_batches = m}};
            const Result r = measure(p, data, batch, steps);
            row("1F1B m=" + std::to_string(m), r, expected, p.activation_bytes());
        }
    }
    if (json) std::printf("{\"batch\":%zu,\"steps\":%zu,\"devices\":\"%s\",\"rows\":[%s]}\n", batch, steps, devices_text.c_str(), rows.c_str());
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
}
