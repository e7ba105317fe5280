// Causal attention on one GPU: the tensor-core kernels (attention_tc.hpp) against the float-sum
// kernels (attention.hpp) on the same 16-bit inputs, side by side in one run. Prints, as JSON, each
// path's median forward and backward time over --steps launches (CUDA events, after a warm-up), the
// FLOP rate they reach (4 t^2 d n / 2 for the causal forward's two products, 2.5 times that for the
// backward's five), and the tensor-core results' difference from the float-sum ones in norm (o, lse,
// dqkv) and whether two tensor-core runs give the same bits.
//
// --dump FILE writes the tensor-core passes' results (o, lse, then dqkv, as stored; dqkv from a delta
// computed on the host in double) for comparing two builds' kernels bit for bit: bench/attention_ab.sh.
//
//   build/bench/attention_bench_cuda [--n 16] [--t 1024] [--heads 12] [--head 64] [--type bf16] [--steps 20]
//                                    [--dump FILE]

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "replica/backend/cuda/attention.hpp"
#include "replica/backend/cuda/context.hpp"
#include "replica/core/number.hpp"
#include "support/cli.hpp"

namespace {

using namespace replica;
namespace cuda = replica::backend::cuda;

double norm_relative(const std::vector<float>& a, const std::vector<float>& b)
{
    double diff = 0, ref = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        diff += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        ref += double(b[i]) * b[i];
    }
    return std::sqrt(diff / std::max(ref, 1e-300));
}

template <class T>
std::vector<float> widened(const std::vector<T>& v)
{
    std::vector<float> r(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) r[i] = core::to_float(v[i]);
    return r;
}

template <class T>
int run(std::size_t n, std::size_t t, std::size_t heads, std::size_t hd, std::size_t steps, const std::string& dump)
{
    const std::size_t d = heads * hd;
    cuda::Context ctx{Device::cuda(0)};
    if (!cuda::detail::attention_tc_serves<T>(ctx, hd)) {
        std::fprintf(stderr, "attention_bench: this GPU or build does not run the tensor-core kernels for heads of %zu\n", hd);
        return 1;
    }
    std::mt19937 gen(7);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    std::vector<T> qkv(n * t * 3 * d), d_o(n * t * d);
    for (auto& v : qkv) v = core::from_float<T>(2.0f * uniform(gen));
    for (auto& v : d_o) v = core::from_float<T>(uniform(gen));
    auto upload = [&](const auto& host) {
        auto b = ctx.allocate<std::remove_cvref_t<decltype(host[0])>>(host.size());
        ctx.upload(b.data(), host.data(), host.size());
        return b;
    };
    auto qkv_d = upload(qkv), d_o_d = upload(d_o);
    auto o_d = ctx.allocate<T>(n * t * d), dqkv_d = ctx.allocate<T>(n * t * 3 * d);
    auto lse_d = ctx.allocate<float>(n * heads * t), delta_d = ctx.allocate<float>(n * heads * t);
    const T* qkv_p = qkv_d.data();
    const T* d_o_p = d_o_d.data();
    auto forward = [&](bool tc) {
        if (tc) cuda::detail::attention_forward_tc<T>(ctx, qkv_p, o_d.data(), lse_d.data(), n, t, d, heads);
        else cuda::detail::attention_forward_simt<T>(ctx, qkv_p, o_d.data(), lse_d.data(), n, t, d, heads);
    };
    auto backward = [&](bool tc) {
        cuda::detail::attention_delta<T>(ctx, o_d.data(), d_o_p, delta_d.data(), n, t, d, heads);
        if (tc) cuda::detail::attention_backward_tc<T>(ctx, qkv_p, lse_d.data(), d_o_p, delta_d.data(), dqkv_d.data(), n, t, d, heads);
        else cuda::detail::attention_backward_simt<T>(ctx, qkv_p, lse_d.data(), d_o_p, delta_d.data(), dqkv_d.data(), n, t, d, heads);
    };
    struct Result {
        std::vector<float> o, lse, dqkv;
    };
    // Backward from the float-sum forward's o and lse on both paths, so that each pass is compared alone.
    auto results = [&](bool tc) {
        Result r;
        std::vector<T> o(n * t * d), dqkv(n * t * 3 * d);
        r.lse.resize(n * heads * t);
        forward(false);
        backward(tc);
        ctx.download(dqkv.data(), dqkv_d.data(), dqkv.size());
        forward(tc);
        ctx.download(o.data(), o_d.data(), o.size());
        ctx.download(r.lse.data(), lse_d.data(), r.lse.size());
        ctx.synchronize();
        r.o = widened(o);
        r.dqkv = widened(dqkv);
        return r;
    };
    const Result simt = results(false), tc = results(true), again = results(true);
    if (!dump.empty()) {   // the tensor-core passes alone: delta from the host, in double
        forward(true);
        std::vector<T> o(n * t * d), dqkv(n * t * 3 * d);
        std::vector<float> lse(n * heads * t), delta(n * heads * t);
        ctx.download(o.data(), o_d.data(), o.size());
        ctx.download(lse.data(), lse_d.data(), lse.size());
        ctx.synchronize();
        for (std::size_t r = 0; r < delta.size(); ++r) {
            const std::size_t sh = r / t, at = ((sh / heads) * t + r % t) * d + (sh % heads) * hd;
            double v = 0;
            for (std::size_t c = 0; c < hd; ++c) v += double(core::to_float(d_o[at + c])) * core::to_float(o[at + c]);
            delta[r] = float(v);
        }
        ctx.upload(delta_d.data(), delta.data(), delta.size());
        cuda::detail::attention_backward_tc<T>(ctx, qkv_p, lse_d.data(), d_o_p, delta_d.data(), dqkv_d.data(), n, t, d,
                                               heads);
        ctx.download(dqkv.data(), dqkv_d.data(), dqkv.size());
        ctx.synchronize();
        FILE* f = std::fopen(dump.c_str(), "wb");
        if (f == nullptr) throw std::runtime_error("cannot write " + dump);
        const bool written = std::fwrite(o.data(), sizeof(T), o.size(), f) == o.size() &&
                             std::fwrite(lse.data(), sizeof(float), lse.size(), f) == lse.size() &&
                             std::fwrite(dqkv.data(), sizeof(T), dqkv.size(), f) == dqkv.size();
        if (std::fclose(f) != 0 || !written) throw std::runtime_error("cannot write " + dump);
    }
    const bool same_bits = std::memcmp(tc.o.data(), again.o.data(), tc.o.size() * sizeof(float)) == 0 &&
                           std::memcmp(tc.lse.data(), again.lse.data(), tc.lse.size() * sizeof(float)) == 0 &&
                           std::memcmp(tc.dqkv.data(), again.dqkv.data(), tc.dqkv.size() * sizeof(float)) == 0;
    cudaEvent_t start, stop;
    REPLICA_CHECK(cudaEventCreate(&start));
    REPLICA_CHECK(cudaEventCreate(&stop));
    auto median_ms = [&](auto&& f) {
        for (int w = 0; w < 3; ++w) f();
        std::vector<float> ms;
        for (std::size_t s = 0; s < steps; ++s) {
            REPLICA_CHECK(cudaEventRecord(start, ctx.stream()));
            f();
            REPLICA_CHECK(cudaEventRecord(stop, ctx.stream()));
            REPLICA_CHECK(cudaEventSynchronize(stop));
            float m = 0;
            REPLICA_CHECK(cudaEventElapsedTime(&m, start, stop));
            ms.push_back(m);
        }
        std::sort(ms.begin(), ms.end());
        return double(ms[ms.size() / 2]);
    };
    const double flops = 2.0 * double(t) * double(t) * double(d) * double(n);   // causal: half of 4 t^2 d n
    std::printf("{\"type\": \"%s\", \"n\": %zu, \"t\": %zu, \"heads\": %zu, \"head\": %zu,\n", core::storage_name<T>, n, t,
                heads, hd);
    for (const bool on_tc : {false, true}) {
        const double f = median_ms([&] { forward(on_tc); }), b = median_ms([&] { backward(on_tc); });
        std::printf(" \"%s\": {\"forward_ms\": %.4f, \"backward_ms\": %.4f, \"forward_tflops\": %.1f, "
                    "\"backward_tflops\": %.1f},\n",
                    on_tc ? "tensor_cores" : "float_sums", f, b, flops / f * 1e-9, 2.5 * flops / b * 1e-9);
    }
    std::printf(" \"difference\": {\"o\": %.3g, \"lse\": %.3g, \"dqkv\": %.3g}, \"same_bits\": %s}\n",
                norm_relative(tc.o, simt.o), norm_relative(tc.lse, simt.lse), norm_relative(tc.dqkv, simt.dqkv),
                same_bits ? "true" : "false");
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return 0;
}

} // namespace

int main(int argc, char** argv)
{
    CLI::App app{"causal attention on one GPU: the tensor-core kernels against the float-sum ones", "attention_bench"};
    std::size_t n = 16, t = 1024, heads = 12, head = 64, steps = 20;
    std::string type = "bf16", dump;
    replica::examples::count_option(app, "--n", n, "samples", 1, 4096);
    replica::examples::count_option(app, "--t", t, "positions", 1, 65536);
    replica::examples::count_option(app, "--heads", heads, "heads", 1, 256);
    replica::examples::count_option(app, "--head", head, "features a head (at most 64 for the tensor-core kernels)", 1, 64);
    replica::examples::count_option(app, "--steps", steps, "timed launches of each pass", 1, 10000);
    app.add_option("--type", type, "activations")->check(CLI::IsMember({"bf16", "fp16"}));
    app.add_option("--dump", dump, "write the tensor-core results' bits to this file");
    if (int code = replica::examples::parse(app, argc, argv)) return code - 1;
    try {
        return type == "bf16" ? run<replica::core::bf16>(n, t, heads, head, steps, dump)
                              : run<replica::core::fp16>(n, t, heads, head, steps, dump);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "attention_bench: %s\n", e.what());
        return 1;
    }
}
