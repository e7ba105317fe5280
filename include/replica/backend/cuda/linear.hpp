#pragma once
// Fully connected layer on the GPU through cuBLASLt (column-major: a row-major (r, c) matrix is a
// column-major (c, r) one). y (n, out) = x (n, in) W^T + b, W (out, in); FP32 products (no TF32, as
// PyTorch by default; a convolution run as products, conv/products.hpp, asks for TF32 where it may).
// The bias, and a ReLU that follows (Chain fuses it), are added in the product's epilogue, as is the
// tanh form of GELU that follows (linear_forward_gelu: the product's output goes to the auxiliary
// matrix, GELU of it to D, where cuBLASLt offers GELU_AUX_BIAS for the shape); the bias
// gradient comes from the weight gradient's epilogue (BGRADB) where cuBLASLt offers one and db is
// 16-byte aligned, else from a GEMV. A layer's parameters sit at any float offset of the flat
// parameter vector: every product is planned for the alignment of its pointers (cuBLASLt then offers
// only algorithms that can use them), and a bias that is not 16-byte aligned is copied to an aligned
// buffer first (PyTorch, too, uses the bias epilogue only on aligned biases). Plans are made once per
// product, shape and alignment and kept in the context's plan cache. Algorithms: cuBLASLt's heuristic
// choice, or timed as a step runs them (Options::benchmark, timing.hpp; never in deterministic mode),
// or taken from the tuning cache (tuning.hpp) where cuBLASLt offers the same candidates now.
//
// Element type T (float, bf16, fp16; deduced from the pointers): x, y, w, dx, dy, relu_y and dz are
// T, b, dw and db float. For bf16 and fp16 the products read T (CUDA_R_16BF, CUDA_R_16F) and compute
// in FP32 (tensor cores); y comes out in T with the bias and the ReLU applied before its one rounding.
// The bias the epilogue adds is b rounded to T (cuBLASLt's bias epilogues read a bias of D's type;
// PyTorch's autocast casts the bias to T too), converted into the context's buffer as the product is
// queued; where cuBLASLt offers no such epilogue for the shape, the product, rounded, then
// add_channel_bias of the float b, rounded again. dw and the BGRADB bias gradient come out in FP32,
// and the GEMV bias gradient is a GemmEx with FP32 output. Plans are kept per T.

#include <cublasLt.h>
#include <cublas_v2.h>

#include <algorithm>
#include <array>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "replica/backend/cuda/activation.hpp"
#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/elementwise.hpp"
#include "replica/backend/cuda/timing.hpp"
#include "replica/backend/cuda/tuning.hpp"
#include "replica/core/config.hpp"
#include "replica/core/number.hpp"

namespace REPLICA_NAMESPACE::backend::cuda {

namespace detail {

// A stored column-major matrix: rows x cols, leading dimension rows.
struct Matrix {
    std::uint64_t rows, cols;
};

inline cudaDataType_t cuda_type(StorageId s)
{
    return s == StorageId::fp32 ? CUDA_R_32F : s == StorageId::bf16 ? CUDA_R_16BF : CUDA_R_16F;
}

// Timed choices (Options::benchmark), process-wide: by kind of GPU and product.
struct MeasuredGemmKey {
    std::string device;
    std::array<std::uint64_t, 14> shape;   // A, B, D dims, op(A), op(B), epilogue, graphs, alignments, TF32, StorageId
    friend bool operator<(const MeasuredGemmKey& a, const MeasuredGemmKey& b)
    {
        return a.device != b.device ? a.device < b.device : a.shape < b.shape;
    }
};
inline std::map<MeasuredGemmKey, cublasLtMatmulAlgo_t>& measured_gemm_choices()
{
    static std::map<MeasuredGemmKey, cublasLtMatmulAlgo_t> choices;
    return choices;
}

// One line of Options::log: a timed choice among cuBLASLt's heuristic candidates for a product
// (MeasuredGemmKey's shape), each candidate named by its algorithm id and tile, with its seconds per
// call as CallTimer::fastest took them (a far slower one's: its first call's; "-": it could not run).
// `cached`: taken from the tuning cache (the times are those it was chosen by).
inline void log_gemm_choice(std::ostream& out, const MeasuredGemmKey& key, const cublasLtMatmulHeuristicResult_t* found,
                            const std::vector<double>& took, int chosen, bool cached = false)
{
    auto config = [](const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t what) {
        std::uint32_t v = 0;
        std::size_t written = 0;
        cublasLtMatmulAlgoConfigGetAttribute(&algo, what, &v, sizeof v, &written);
        return std::to_string(v);
    };
    const auto& d = key.shape;
    out << "replica: " << key.device << ": product A " << d[0] << "x" << d[1] << ", B " << d[2] << "x" << d[3] << " -> D " << d[4]
        << "x" << d[5] << " (ops " << d[6] << ", epilogue " << d[7] << ", alignments " << d[9] << "/" << d[10] << "/" << d[11]
        << (d[12] ? ", TF32" : "") << (d[13] ? std::string(", ") + storage_name(StorageId(d[13])) : std::string())
        << "): candidate " << chosen << " of " << took.size() << " chosen;";
    for (std::size_t i = 0; i < took.size(); ++i) {
        const bool timed = took[i] < CallTimer::never && took[i] >= 0.0;
        out << " [" << i << "] algo " << config(found[i].algo, CUBLASLT_ALGO_CONFIG_ID) << " tile "
            << config(found[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID) << " "
            << (timed ? std::to_string(int(took[i] * 1e7 + 0.5) / 10) + "." + std::to_string(int(took[i] * 1e7 + 0.5) % 10) + " us"
                      : std::string("-"));
    }
    out << (cached ? " (from the tuning cache)" : "") << std::endl;
}

// A product's record in the tuning cache. Key: MeasuredGemmKey's shape. Value: the chosen candidate's
// place among cuBLASLt's usable candidates, their count, the chosen algorithm's bytes (8 words), and
// each candidate's seconds (as doubles' bits).
inline core::TuningKey gemm_tuning_key(const Context& ctx, const MeasuredGemmKey& m)
{
    return {"product", tuning_environment(ctx), std::vector<std::uint64_t>(m.shape.begin(), m.shape.end())};
}
inline core::TuningValue gemm_tuning_value(const cublasLtMatmulAlgo_t& algo, int chosen, const std::vector<double>& took)
{
    static_assert(sizeof(cublasLtMatmulAlgo_t) == 8 * sizeof(std::uint64_t));
    core::TuningValue v{std::uint64_t(chosen), took.size(), 0, 0, 0, 0, 0, 0, 0, 0};
    std::memcpy(v.data() + 2, &algo, sizeof algo);
    for (double s : took) v.push_back(std::bit_cast<std::uint64_t>(s));
    return v;
}

// The place among found[0, usable) of the choice that the tuning cache holds for this product, if
// cuBLASLt offers the same candidates now: as many as then, and at the recorded place an algorithm
// identical byte for byte; its candidates' seconds into `took`. -1 where there is none; a record that
// is there but fails is refused (refuse_record).
inline int cached_gemm_choice(const Context& ctx, core::TuningCache& cache, const MeasuredGemmKey& measured,
                              const cublasLtMatmulHeuristicResult_t* found, int usable, std::vector<double>& took)
{
    const std::optional<core::TuningValue> record = cache.find(gemm_tuning_key(ctx, measured), tuning_log(ctx));
    if (!record) return -1;
    const core::TuningValue& v = *record;
    bool same = v.size() == 10 + std::size_t(usable) && v[1] == std::uint64_t(usable) && v[0] < v[1] &&
                std::memcmp(v.data() + 2, &found[v[0]].algo, sizeof(cublasLtMatmulAlgo_t)) == 0;
    took.clear();
    for (std::size_t i = 10; same && i < v.size(); ++i) {
        took.push_back(std::bit_cast<double>(v[i]));
        same = took.back() >= 0.0 && took.back() <= CallTimer::never;   // NaN fails too
    }
    if (!same) {
        refuse_record(ctx, cache, "product");
        return -1;
    }
    ++tuning_counters().cached;
    return int(v[0]);
}

// D = alpha op(A) op(B) (+ epilogue) with its bias pointer, on the context's stream.
// aux: the epilogue's auxiliary output (Gemm::aux), else null. c: added to the product (beta 1), laid
// out as D, else null.
inline cublasStatus_t run_gemm(const Context& ctx, const Gemm& g, const void* a, const void* b, void* d, const void* bias,
                               const cublasLtMatmulAlgo_t& algo, std::size_t workspace, void* aux = nullptr,
                               const void* c = nullptr)
{
    if (bias) {
        const cublasStatus_t s = cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
        if (s != CUBLAS_STATUS_SUCCESS) return s;
    }
    if (aux) {
        const cublasStatus_t s = cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux);
        if (s != CUBLAS_STATUS_SUCCESS) return s;
    }
    const float one = 1.0f, zero = 0.0f;
    return cublasLtMatmul(ctx.cublaslt(), g.desc, &one, a, g.a, b, g.b, c ? &one : &zero, c ? c : d, g.d, d, g.d, &algo,
                          ctx.blas_workspace(), workspace, ctx.stream());
}

// The product op(A) op(B) -> D with `epilogue`; usable = false if cuBLASLt has no algorithm for it.
inline Gemm make_gemm(const Context& ctx, Matrix a, cublasOperation_t op_a, Matrix b, cublasOperation_t op_b, Matrix d,
                      cublasLtEpilogue_t epilogue, std::size_t bias_length, const GemmKey& key)
{
    Gemm g;
    g.desc = make_matmul_desc(key.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F);
    REPLICA_CHECK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
    REPLICA_CHECK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
    REPLICA_CHECK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    const cudaDataType_t in_type = cuda_type(key.storage), out_type = key.float_output() ? CUDA_R_32F : in_type;
    if (key.storage != StorageId::fp32 && key.kind == GemmKey::weight_grad_bias) {   // the bias gradient is float
        const cudaDataType_t bias_type = CUDA_R_32F;
        REPLICA_CHECK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type));
    }
    if (epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {   // the auxiliary matrix is laid out as D, of D's type
        g.aux = true;
        const std::int64_t ld = std::int64_t(d.rows);
        REPLICA_CHECK(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld, sizeof ld));
    }
    g.a = make_matrix_layout(in_type, a.rows, a.cols, std::int64_t(a.rows));
    g.b = make_matrix_layout(in_type, b.rows, b.cols, std::int64_t(b.rows));
    g.d = make_matrix_layout(out_type, d.rows, d.cols, std::int64_t(d.rows));

    const MatmulPreference pref = make_matmul_preference();
    const std::size_t most = Context::blas_workspace_bytes;
    REPLICA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &most, sizeof most));
    const std::uint32_t align[] = {std::uint32_t(key.align_a), std::uint32_t(key.align_b), std::uint32_t(key.align_d)};
    REPLICA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align[0], sizeof align[0]));
    REPLICA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align[1], sizeof align[1]));
    REPLICA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align[2], sizeof align[2]));
    REPLICA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align[2], sizeof align[2]));
    constexpr int kMax = 8;
    cublasLtMatmulHeuristicResult_t found[kMax] = {};
    int count = 0;
    const cublasStatus_t h = cublasLtMatmulAlgoGetHeuristic(ctx.cublaslt(), g.desc, g.a, g.b, g.d, g.d, pref, kMax, found, &count);
    int usable = 0;   // the successful results, in cuBLASLt's order
    for (int i = 0; h == CUBLAS_STATUS_SUCCESS && i < count; ++i)
        if (found[i].state == CUBLAS_STATUS_SUCCESS) found[usable++] = found[i];
    if (usable == 0) return g;
    g.usable = true;
    g.algo = found[0].algo;
    g.workspace = found[0].workspaceSize;
    if (!ctx.options().benchmark || ctx.options().deterministic || usable == 1) return g;

    const MeasuredGemmKey measured{device_kind(ctx), {a.rows, a.cols, b.rows, b.cols, d.rows, d.cols,
                                                 std::uint64_t(op_a) * 4 + std::uint64_t(op_b), std::uint64_t(epilogue),
                                                 std::uint64_t(ctx.options().graphs), align[0], align[1], align[2],
                                                 std::uint64_t(key.tf32), std::uint64_t(key.storage)}};
    std::lock_guard lock(measured_mutex());
    auto& choices = measured_gemm_choices();
    auto it = choices.find(measured);
    if (it == choices.end()) {
        core::TuningCache* disk = tuning_cache(ctx);
        std::vector<double> took;
        int k = disk ? cached_gemm_choice(ctx, *disk, measured, found, usable, took) : -1;
        const bool cached = k >= 0;
        if (!cached) {
            const TimingScratch scratch(ctx, {a.rows * a.cols * sizeof(float), b.rows * b.cols * sizeof(float),
                                              d.rows * d.cols * sizeof(float), bias_length * sizeof(float),
                                              g.aux ? d.rows * d.cols * sizeof(float) : 0});
            CallTimer timer(ctx);
            took.assign(std::size_t(usable), CallTimer::never);
            k = CallTimer::fastest(usable, [&](int i, double give_up) {
                return took[std::size_t(i)] = timer.seconds([&] {
                    return run_gemm(ctx, g, scratch.floats(0), scratch.floats(1), scratch.floats(2),
                                    bias_length ? scratch.floats(3) : nullptr, found[i].algo, found[i].workspaceSize,
                                    g.aux ? scratch.floats(4) : nullptr) == CUBLAS_STATUS_SUCCESS;
                }, give_up);
            });
            if (disk) disk->record(gemm_tuning_key(ctx, measured), gemm_tuning_value(found[k].algo, k, took), tuning_log(ctx));
        }
        it = choices.emplace(measured, found[k].algo).first;
        if (ctx.options().log) log_gemm_choice(*ctx.options().log, measured, found, took, k, cached);
    }
    for (int i = 0; i < usable; ++i)   // the chosen one's workspace
        if (std::memcmp(&found[i].algo, &it->second, sizeof(cublasLtMatmulAlgo_t)) == 0) {
            g.algo = found[i].algo;
            g.workspace = found[i].workspaceSize;
        }
    return g;
}

// The alignment of a pointer: the largest power of two dividing it, at most 256.
inline int alignment(const void* p)
{
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    return int(std::min<std::uintptr_t>(a & (~a + 1), 256));
}

// Whether a product without an algorithm may fall back on other work: the bias gradient's (a GEMV),
// a 16-bit forward pass's with the bias (the product without it, then add_channel_bias), and a
// forward pass with GELU (the product, then gelu_tanh_forward).
inline bool has_fallback(GemmKey::Kind kind, StorageId storage)
{
    return kind == GemmKey::weight_grad_bias || kind == GemmKey::forward_gelu ||
           (storage != StorageId::fp32 && (kind == GemmKey::forward || kind == GemmKey::forward_relu));
}

// The product `kind` of a layer in -> out over n samples, for pointers A, B, D of these alignments,
// A and B of type `storage` (TF32 only applies to float).
inline const Gemm& linear_gemm(const Context& ctx, GemmKey::Kind kind, int in, int out, std::size_t n, const void* a,
                               const void* b, const void* d, bool tf32, StorageId storage = StorageId::fp32)
{
    const GemmKey key{kind, in, out, n, alignment(a), alignment(b), alignment(d), tf32 && storage == StorageId::fp32, storage};
    auto& gemms = ctx.plan_cache().gemms;
    if (auto it = gemms.find(key); it != gemms.end()) return it->second;
    const std::uint64_t i = std::uint64_t(in), o = std::uint64_t(out), m = n;
    Gemm g;
    switch (kind) {
    case GemmKey::forward:
    case GemmKey::forward_relu:   // y^T (out, n) = W stored (in, out), transposed, times x^T (in, n), + b
        g = make_gemm(ctx, {i, o}, CUBLAS_OP_T, {i, m}, CUBLAS_OP_N, {o, m},
                      kind == GemmKey::forward_relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS, o, key);
        break;
    case GemmKey::forward_gelu:   // the same, GELU's input to the auxiliary matrix and its output to D
        g = make_gemm(ctx, {i, o}, CUBLAS_OP_T, {i, m}, CUBLAS_OP_N, {o, m}, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, o, key);
        break;
    case GemmKey::forward_no_bias:
    case GemmKey::forward_relu_no_bias:   // the same without b
        g = make_gemm(ctx, {i, o}, CUBLAS_OP_T, {i, m}, CUBLAS_OP_N, {o, m},
                      kind == GemmKey::forward_relu_no_bias ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT, 0, key);
        break;
    case GemmKey::weight_grad_bias:   // dW^T (in, out) = x^T (in, n) times dy^T stored (out, n), transposed; db
    case GemmKey::weight_grad:
        g = make_gemm(ctx, {i, m}, CUBLAS_OP_N, {o, m}, CUBLAS_OP_T, {i, o},
                      kind == GemmKey::weight_grad_bias ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_DEFAULT,
                      kind == GemmKey::weight_grad_bias ? o : 0, key);
        break;
    case GemmKey::input_grad:   // dx^T (in, n) = W stored (in, out) times dy^T (out, n)
        g = make_gemm(ctx, {i, o}, CUBLAS_OP_N, {o, m}, CUBLAS_OP_N, {i, m}, CUBLASLT_EPILOGUE_DEFAULT, 0, key);
        break;
    case GemmKey::input_grad_t:   // dx by feature, stored (n, in): dy^T stored (out, n) and W stored (in, out), both transposed
        g = make_gemm(ctx, {o, m}, CUBLAS_OP_T, {i, o}, CUBLAS_OP_T, {m, i}, CUBLASLT_EPILOGUE_DEFAULT, 0, key);
        break;
    }
    if (!g.usable && !has_fallback(kind, storage))
        throw Error("cuBLASLt offers no algorithm for a fully connected layer of " + std::to_string(in) + " -> " +
                    std::to_string(out) + " over " + std::to_string(n) + " samples");
    return gemms.emplace(key, std::move(g)).first->second;
}

inline void run(const Context& ctx, const Gemm& g, const void* a, const void* b, void* d, const void* bias = nullptr,
                void* aux = nullptr, const void* c = nullptr)
{
    REPLICA_CHECK(run_gemm(ctx, g, a, b, d, bias, g.algo, g.workspace, aux, c));
}

// b where it is 16-byte aligned, else a copy of it in the context's aligned buffer (queued).
inline const float* aligned_bias(const Context& ctx, const float* b, int out)
{
    if (alignment(b) >= 16) return b;
    auto& buffer = ctx.plan_cache().aligned_bias;
    if (buffer.size() < std::size_t(out)) {
        ctx.drop_graphs();   // they read the old buffer
        buffer = ctx.allocate<float>(std::size_t(out));
    }
    REPLICA_CHECK(cudaMemcpyAsync(buffer.data(), b, sizeof(float) * std::size_t(out), cudaMemcpyDeviceToDevice, ctx.stream()));
    return buffer.data();
}

// The bias as a product's epilogue reads it (queued): float, aligned_bias; bf16 and fp16, b rounded to T
// in the context's buffer (256-byte aligned), which the product reads before the next layer's
// conversion overwrites it, the stream keeping the order.
template <core::Storage T>
const void* epilogue_bias(const Context& ctx, const float* b, int out)
{
    if constexpr (std::same_as<T, float>) {
        return aligned_bias(ctx, b, out);
    } else {
        auto& buffer = ctx.plan_cache().bias_in_storage;
        if (buffer.size() < sizeof(T) * std::size_t(out)) {
            ctx.drop_graphs();   // they read the old buffer
            buffer = ctx.allocate<unsigned char>(sizeof(T) * std::size_t(out));
        }
        T* t = reinterpret_cast<T*>(buffer.data());
        convert(ctx, b, t, std::size_t(out));
        return t;
    }
}
} // namespace detail

// relu: the ReLU after the layer is applied too (y is its output). tf32: products in TF32 (a
// convolution's, conv.hpp, where Options::allow_tf32; float only). b null: no bias (a convolution
// without one).
template <core::Storage T>
void linear_forward(const Context& ctx, int in, int out, const T* w, const float* b, const T* x, T* y, std::size_t n,
                    bool relu = false, bool tf32 = false)
{
    if (n == 0) return;
    constexpr StorageId s = storage_of<T>;
    if (!b) {
        const auto kind = relu ? GemmKey::forward_relu_no_bias : GemmKey::forward_no_bias;
        detail::run(ctx, detail::linear_gemm(ctx, kind, in, out, n, w, x, y, tf32, s), w, x, y);
        return;
    }
    const Gemm& g = detail::linear_gemm(ctx, relu ? GemmKey::forward_relu : GemmKey::forward, in, out, n, w, x, y, tf32, s);
    if constexpr (!std::same_as<T, float>) {
        if (!g.usable) {   // no bias epilogue for this 16-bit product: y (n, out) + b after it
            detail::run(ctx, detail::linear_gemm(ctx, GemmKey::forward_no_bias, in, out, n, w, x, y, tf32, s), w, x, y);
            add_channel_bias(ctx, b, y, n, std::size_t(out), 1, relu);
            return;
        }
    }
    detail::run(ctx, g, w, x, y, detail::epilogue_bias<T>(ctx, b, out));
}

// y = x W^T + b + addend (n, out; a Residual's other branch), then the ReLU when relu: the addend is
// the product's C (beta 1), added in float before the epilogue's bias, ReLU and one rounding. Where
// cuBLASLt offers no epilogue for the shape, linear_forward, then add and relu_forward.
template <core::Storage T>
void linear_forward_add(const Context& ctx, int in, int out, const T* w, const float* b, const T* x,
                        const std::type_identity_t<T>* addend, T* y, std::size_t n, bool relu = false)
{
    if (n == 0) return;
    // C is laid out and aligned as D: the key's D alignment is the lesser of the two.
    const void* d = detail::alignment(y) < detail::alignment(addend) ? static_cast<const void*>(y) : addend;
    const GemmKey::Kind kind = b ? (relu ? GemmKey::forward_relu : GemmKey::forward)
                                 : (relu ? GemmKey::forward_relu_no_bias : GemmKey::forward_no_bias);
    const Gemm& g = detail::linear_gemm(ctx, kind, in, out, n, w, x, d, false, storage_of<T>);
    if (!g.usable) {
        linear_forward(ctx, in, out, w, b, x, y, n);
        add(ctx, addend, y, n * std::size_t(out));
        if (relu) relu_forward(ctx, static_cast<const T*>(y), y, n * std::size_t(out));
        return;
    }
    detail::run(ctx, g, w, x, y, b ? detail::epilogue_bias<T>(ctx, b, out) : nullptr, nullptr, addend);
}

// y = x W^T + b, as linear_forward writes it, and activated = the tanh form of GELU of the same
// values, in the product's epilogue (GELU_AUX_BIAS: y is its auxiliary matrix), each rounded once: GELU
// of the float sum before y's rounding. Where cuBLASLt offers no such epilogue for the shape (or b is
// null), linear_forward and then gelu_tanh_forward of y (activation.hpp's bits).
template <core::Storage T>
void linear_forward_gelu(const Context& ctx, int in, int out, const T* w, const float* b, const T* x, T* y, T* activated,
                         std::size_t n)
{
    if (n == 0) return;
    // The product's D alignment key: the lesser of its two outputs'.
    const void* d = detail::alignment(y) < detail::alignment(activated) ? static_cast<const void*>(y) : activated;
    const Gemm* g = b ? &detail::linear_gemm(ctx, GemmKey::forward_gelu, in, out, n, w, x, d, false, storage_of<T>) : nullptr;
    if (!g || !g->usable) {
        linear_forward(ctx, in, out, w, b, x, y, n);
        gelu_tanh_forward(ctx, static_cast<const T*>(y), activated, n * std::size_t(out));
        return;
    }
    detail::run(ctx, *g, w, x, activated, detail::epilogue_bias<T>(ctx, b, out), y);
}

// dw, db (null without a bias) assigned; dx (may be null) assigned.
template <core::Storage T>
void linear_backward(const Context& ctx, int in, int out, const T* w, const T* x, const T* dy, T* dx, float* dw, float* db,
                     std::size_t n, bool tf32 = false)
{
    if (n == 0) {   // no samples: a zero gradient
        REPLICA_CHECK(cudaMemsetAsync(dw, 0, sizeof(float) * std::size_t(in) * std::size_t(out), ctx.stream()));
        if (db) REPLICA_CHECK(cudaMemsetAsync(db, 0, sizeof(float) * std::size_t(out), ctx.stream()));
        return;
    }
    constexpr StorageId s = storage_of<T>;
    const Gemm* with_bias = db && detail::alignment(db) >= 16
                                ? &detail::linear_gemm(ctx, GemmKey::weight_grad_bias, in, out, n, x, dy, dw, tf32, s)
                                : nullptr;
    if (with_bias && with_bias->usable) {
        detail::run(ctx, *with_bias, x, dy, dw, db);
    } else {
        detail::run(ctx, detail::linear_gemm(ctx, GemmKey::weight_grad, in, out, n, x, dy, dw, tf32, s), x, dy, dw);
        const float one = 1.0f, zero = 0.0f;
        // db (out) = dy^T (out, n) 1 (n)
        if constexpr (std::same_as<T, float>) {
            if (db) REPLICA_CHECK(cublasSgemv(ctx.cublas(), CUBLAS_OP_N, out, int(n), &one, dy, out, ctx.ones(n), 1, &zero, db, 1));
        } else if (db) {
            const cudaDataType_t type = detail::cuda_type(s);
            REPLICA_CHECK(cublasGemmEx(ctx.cublas(), CUBLAS_OP_N, CUBLAS_OP_N, out, 1, int(n), &one, dy, type, out,
                                       ctx.ones<T>(n), type, int(n), &zero, db, CUDA_R_32F, out, CUBLAS_COMPUTE_32F,
                                       CUBLAS_GEMM_DEFAULT));
        }
    }
    if (dx) detail::run(ctx, detail::linear_gemm(ctx, GemmKey::input_grad, in, out, n, w, dy, dx, tf32, s), w, dy, dx);
}

// The backward of the layer and the ReLU after it: relu_y and dy are the ReLU's output and its
// gradient; dz receives the layer output's gradient.
template <core::Storage T>
void linear_backward_relu(const Context& ctx, int in, int out, const T* w, const T* x, const T* relu_y, const T* dy, T* dz,
                          T* dx, float* dw, float* db, std::size_t n)
{
    relu_backward(ctx, relu_y, dy, dz, n * std::size_t(out));
    linear_backward<T>(ctx, in, out, w, x, dz, dx, dw, db, n);
}

} // namespace replica::backend::cuda
