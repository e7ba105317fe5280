#pragma once
// The parts a cuda::Context holds, each with one job: its streams and their events, the library
// handles, the caching allocator (allocator.hpp), the plan cache (what layers prepare once per shape,
// and the scratch they run with), the CUDA graph cache (captured steps and their parameters), and
// the reductions' memory. detail::State puts them together; it is made and owned by the Context
// (copies of a Context share it). Every resource is owned (handles.hpp): a constructor that throws
// half-way frees what it made. Only under nvcc.

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <compare>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "replica/backend/cuda/allocator.hpp"
#include "replica/backend/cuda/check.hpp"
#include "replica/backend/cuda/handles.hpp"
#include "replica/backend/cuda/options.hpp"
#include "replica/core/config.hpp"
#include "replica/core/device.hpp"
#include "replica/core/fixed_point.hpp"
#include "replica/core/number.hpp"
#include "replica/core/tensor.hpp"
#include "replica/core/window.hpp"

namespace REPLICA_NAMESPACE::backend::cuda {

// ---- streams ----

// The context's three streams, none synchronising with the legacy default stream: compute (every
// kernel, and the library handles), comm (collectives, communicator.hpp) and copy (copies that
// overlap compute); and the events that order them: `copied` (the compute stream waits for the copy
// stream's copies), `marker` (mark()) and two host marks (mark_for_host(k)), each re-recorded.
class Streams {
public:
    // Makes `device` current first: the streams and events belong to it.
    explicit Streams(int device)
        : compute_((check_device(device), make_stream())), comm_(make_stream()), copy_(make_stream()),
          copied_(make_event()), marker_(make_event()), host_mark_{make_event(), make_event()}
    {
    }
    cudaStream_t compute() const { return compute_; }
    cudaStream_t comm() const { return comm_; }
    cudaStream_t copy() const { return copy_; }
    cudaEvent_t copied() const { return copied_; }
    cudaEvent_t marker() const { return marker_; }
    cudaEvent_t host_mark(int k) const { return host_mark_[k]; }
    // The host waits for the compute and copy streams (errors ignored: for destructors).
    void drain() const noexcept
    {
        cudaStreamSynchronize(compute_);
        cudaStreamSynchronize(copy_);
    }

private:
    static int check_device(int device)
    {
        REPLICA_CHECK(cudaSetDevice(device));
        return device;
    }

    Stream compute_, comm_, copy_;
    Event copied_, marker_, host_mark_[2];
};

// ---- library handles ----

// cuDNN, cuBLAS and cuBLASLt handles, the first two bound to the compute stream, and cuBLAS's and
// cuBLASLt's workspace (ours, so that neither allocates inside a CUDA graph capture).
class Libraries {
public:
    static constexpr std::size_t blas_workspace_bytes = std::size_t{32} << 20;

    Libraries(cudaStream_t compute, CachingAllocator& allocator)
        : blas_workspace_(allocator.buffer<unsigned char>(blas_workspace_bytes)), cudnn_(make_cudnn(compute)),
          cublas_(make_cublas(compute, blas_workspace_.data(), blas_workspace_bytes)), cublaslt_(make_cublaslt())
    {
    }
    cudnnHandle_t cudnn() const { return cudnn_; }
    cublasHandle_t cublas() const { return cublas_; }
    cublasLtHandle_t cublaslt() const { return cublaslt_; }
    void* blas_workspace() { return blas_workspace_.data(); }

private:
    core::Buffer<unsigned char> blas_workspace_;   // first: it outlives the handles that use it
    CudnnHandle cudnn_;
    CublasHandle cublas_;
    CublasLtHandle cublaslt_;
};

// ---- the plan cache ----

// A convolution prepared for one geometry and batch size (conv/): cuDNN's descriptors, the
// algorithm of each of cuDNN's passes, which passes run as products over the windows instead
// (ConvPath), and the workspace the chosen ways need.
struct ConvPlan {
    bool gemm_forward = false, gemm_backward = false;
    TensorDescriptor x, y;
    FilterDescriptor w;
    ConvolutionDescriptor conv;
    cudnnConvolutionFwdAlgo_t fwd{};
    cudnnConvolutionBwdDataAlgo_t bwd_data{};
    cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
    std::size_t workspace = 0;
};

// The element type of a plan's activations and products' inputs (storage_of<T>): a bf16 plan is
// not a float plan.
enum class StorageId { fp32, bf16, fp16 };
template <core::Storage T>
inline constexpr StorageId storage_of = std::same_as<T, float> ? StorageId::fp32
                                        : std::same_as<T, core::bf16> ? StorageId::bf16
                                                                      : StorageId::fp16;
inline const char* storage_name(StorageId s) { return s == StorageId::fp32 ? "fp32" : s == StorageId::bf16 ? "bf16" : "fp16"; }

struct ConvKey {
    enum Use { convolution, direct, transposed };   // what the plan is for (conv.hpp)
    core::Window g;
    int cout;
    std::size_t n;
    int use = convolution;
    StorageId storage = StorageId::fp32;
    friend bool operator<(const ConvKey& a, const ConvKey& b)
    {
        auto t = [](const ConvKey& k) {
            return std::make_tuple(k.g.c, k.g.h, k.g.w, k.g.kh, k.g.kw, k.g.sh, k.g.sw, k.g.ph, k.g.pw, k.g.oh, k.g.ow, k.cout, k.n,
                                   k.use, k.storage);
        };
        return t(a) < t(b);
    }
};

// A matrix product D = op(A) op(B) (+ an epilogue) of fixed shapes through cuBLASLt: A and B of the
// key's storage type, D of it too or FP32 (GemmKey::float_output), computed and scaled in FP32.
struct Gemm {
    MatmulDesc desc;
    MatrixLayout a, b, d;
    cublasLtMatmulAlgo_t algo{};
    std::size_t workspace = 0;
    bool usable = false;   // cuBLASLt offers an algorithm (a bias-gradient epilogue may have none)
    bool aux = false;      // the epilogue also writes its input to an auxiliary matrix (GELU_AUX)
};

// Which product of a fully connected layer (linear.hpp), over how many samples, with which pointer
// alignments (bytes, at most 256: cuBLASLt offers only algorithms that can read and write them).
struct GemmKey {
    enum Kind { forward, forward_relu, weight_grad_bias, weight_grad, input_grad, input_grad_t, forward_no_bias,
                forward_relu_no_bias, forward_gelu };
    int kind, in, out;
    std::size_t n;
    int align_a, align_b, align_d;
    bool tf32;   // a convolution's products (conv.hpp) may use TF32, a fully connected layer's never
    StorageId storage = StorageId::fp32;   // A's and B's type; D's too unless float_output
    // The weight gradients, and the rows' gradient of a convolution's products, come out in FP32.
    bool float_output() const { return kind == weight_grad_bias || kind == weight_grad || kind == input_grad_t; }
    friend auto operator<=>(const GemmKey&, const GemmKey&) = default;
    // Written out: nvcc 13 leaves the == implied by a defaulted <=> undefined at link time.
    friend bool operator==(const GemmKey& a, const GemmKey& b)
    {
        return a.kind == b.kind && a.in == b.in && a.out == b.out && a.n == b.n && a.align_a == b.align_a &&
               a.align_b == b.align_b && a.align_d == b.align_d && a.tf32 == b.tf32 && a.storage == b.storage;
    }
};

namespace detail {
// What layers prepare once per shape and keep: convolution plans, cuBLASLt products; and the
// buffers they run with, each grown to the largest request: the workspace (cuDNN's and the product
// path's scratch; Context::workspace), the ones of a bias gradient's GEMV, and an aligned copy of a
// fully connected layer's bias. A buffer that grows moves, so whoever grows one drops the CUDA
// graphs (Context does).
struct PlanCache {
    // The rows (conv/products.hpp) that the workspace holds, left by a convolution's forward for its
    // backward: of input x (of type `storage`), window g, n samples. Any later use of the workspace
    // forgets them.
    struct Rows {
        const void* x = nullptr;
        core::Window g{};
        std::size_t n = 0;
        StorageId storage = StorageId::fp32;
    };

    std::map<ConvKey, ConvPlan> conv_plans;
    std::map<GemmKey, Gemm> gemms;
    core::Buffer<unsigned char> workspace;
    Rows workspace_rows;
    core::Buffer<float> ones;
    core::Buffer<core::bf16> ones_bf16;
    core::Buffer<core::fp16> ones_fp16;
    core::Buffer<float> aligned_bias;
    core::Buffer<unsigned char> bias_in_storage;   // a 16-bit product's bias rounded to its T (linear.hpp)

    void drop_plans()
    {
        conv_plans.clear();
        gemms.clear();
    }
};
} // namespace detail

// ---- the CUDA graph cache ----

// What a captured step reads from device memory because it changes from step to step (kernel
// arguments are frozen at capture): the dropout masks' seed and global first sample.
struct StepParams {
    std::uint64_t seed = 0, first_sample = 0;
};

// CUDA graphs are kept per (batch size, staging buffer) of a context.
struct GraphKey {
    std::size_t n;
    int slot;
    friend auto operator<=>(const GraphKey&, const GraphKey&) = default;
    // Written out: see GemmKey.
    friend bool operator==(const GraphKey& a, const GraphKey& b) { return a.n == b.n && a.slot == b.slot; }
};

// One captured part of a step, and what the host does after launching it: call the step's hook
// with `cut` (a DataParallel replica reduces the buckets complete from there), or at a sync point
// (core/hook.hpp: sync.data is not null) have it sum sync.count floats at sync.data over the
// replicas, or nothing. `exec` is owned by the context's GraphCache (null where two cuts met and
// nothing was captured).
struct Segment {
    static constexpr std::size_t no_cut = ~std::size_t{0};
    struct SyncPoint {
        float* data = nullptr;
        std::size_t count = 0, id = 0;
    };
    cudaGraphExec_t exec = nullptr;
    std::size_t cut = no_cut;
    SyncPoint sync = {};
};

namespace detail {
// The replayable steps of a context (Options::graphs): per key, its segments in order; the keys seen
// once (the first step of a key runs eagerly, growing plans, workspaces and scratch); whether a
// capture is under way and for which key; and the step parameters (StepParams) in two slots, on the
// host (page-locked) and on the device, since two steps may be in flight.
class GraphCache {
public:
    GraphCache() : step_host_(2) {}

    // The segments of a completely captured key; null if none (or its capture is under way).
    const std::vector<Segment>* find(const GraphKey& key) const
    {
        auto it = graphs_.find(key);
        return it == graphs_.end() || in_capture(key) ? nullptr : &it->second.segments;
    }
    bool in_capture(const GraphKey& key) const { return partial_ && *partial_ == key; }
    // True the first time a key is seen.
    bool first_time(const GraphKey& key) { return !std::exchange(warmed_[key], true); }

    bool capturing() const { return capturing_; }
    void set_capturing(bool on) { capturing_ = on; }
    // Keeps `exec` (none if it captured nothing) as the next segment of `key`, with what the host
    // does after it (Segment), whose capture is then under way; returns it for launching.
    cudaGraphExec_t add(const GraphKey& key, GraphExec exec, std::size_t cut, Segment::SyncPoint sync = {})
    {
        partial_ = key;
        const cudaGraphExec_t raw = exec;
        if (exec || cut != Segment::no_cut || sync.data) {
            Captured& c = graphs_[key];
            c.segments.push_back({raw, cut, sync});
            if (exec) c.execs.push_back(std::move(exec));
        }
        return raw;
    }
    // The capture under way is complete.
    void complete() { partial_.reset(); }
    // Forgets `key`'s segments and the capture under way.
    void abandon(const GraphKey& key)
    {
        capturing_ = false;
        graphs_.erase(key);
        partial_.reset();
    }
    // Every CUDA graph is stale (a buffer a captured step uses moved or grew).
    void drop()
    {
        graphs_.clear();
        warmed_.clear();
    }

    // How many keys hold segments, and how many segments end at a cut (for tests and diagnostics).
    std::size_t size() const { return graphs_.size(); }
    std::size_t cuts() const
    {
        std::size_t count = 0;
        for (const auto& [key, c] : graphs_)
            for (const Segment& s : c.segments) count += s.cut != Segment::no_cut;
        return count;
    }

    // Step parameters: the host copy of slot `slot` set, it becomes the slot a capture reads.
    bool has_step_device() const { return step_device_.size() != 0; }
    void keep_step_device(core::Buffer<StepParams> device) { step_device_ = std::move(device); }
    const StepParams* set_step(int slot, StepParams p)
    {
        step_host_[std::size_t(slot)] = p;
        step_slot_ = slot;
        return step_host_.data() + slot;
    }
    StepParams* step_device(int slot) { return step_device_.data() + slot; }
    // While a step is captured: its slot's parameters in device memory; otherwise null.
    const StepParams* step_params() const { return capturing_ ? step_device_.data() + step_slot_ : nullptr; }

private:
    struct Captured {
        std::vector<Segment> segments;   // their execs are views of `execs`
        std::vector<GraphExec> execs;
    };
    std::map<GraphKey, Captured> graphs_;
    std::map<GraphKey, bool> warmed_;
    bool capturing_ = false;
    std::optional<GraphKey> partial_;   // the key whose segments are being captured
    Pinned<StepParams> step_host_;
    core::Buffer<StepParams> step_device_;
    int step_slot_ = 0;                 // the slot of the last set_step(): a capture reads its params
};

// ---- reductions ----

// Memory for loss and metric reductions (loss.hpp): device scalars (grown on demand), a page-locked
// mirror of 4 doubles, and the reproducible mode's range check (page-locked, written by kernels).
struct Reductions {
    core::Buffer<double> device;
    Pinned<double> host{4};
    Pinned<core::FixedStatus> fixed_status{1};
};

// ---- the whole ----

// Members are made in order and destroyed in reverse: the device is current before the streams are
// made, the allocator outlives every buffer from it, the streams outlive everything queued on them.
struct State {
    explicit State(Device d)
        : device(d), options(default_options()), streams(d.index()), allocator(d.index(), streams.compute()),
          libraries(streams.compute(), allocator)
    {
    }
    State(const State&) = delete;
    State& operator=(const State&) = delete;
    // Waits for the work queued on the context's streams before anything it may use goes.
    ~State()
    {
        cudaSetDevice(device.index());
        streams.drain();
    }

    Device device;
    Options options;
    std::string kind;          // Context::device_kind(), made once
    unsigned multiprocessors = 0;   // Context::multiprocessors(), read once
    // Called while the host waits for the device (synchronize), with the seconds waited so far; it
    // throws to stop waiting (Context::set_watchdog).
    std::function<void(double)> watchdog;
    Streams streams;
    CachingAllocator allocator;
    Libraries libraries;
    PlanCache plans;
    GraphCache graphs;
    Reductions reductions;
};
} // namespace detail

} // namespace replica::backend::cuda
