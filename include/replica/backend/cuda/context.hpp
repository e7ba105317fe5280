#pragma once
// The CUDA context of one replica: its device, a compute, a communication and a copy stream, cuDNN,
// cuBLAS and cuBLASLt handles (the first two bound to the compute stream), a workspace, a caching
// allocator, and the per-layer plans (cuDNN and cuBLASLt descriptors and algorithms) chosen once per
// shape. Only under nvcc.
//
// Copies of a Context share one state; a Buffer from allocate() must not outlive it.

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <compare>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "replica/backend/cuda/allocator.hpp"
#include "replica/backend/cuda/check.hpp"
#include "replica/core/backoff.hpp"
#include "replica/core/device.hpp"
#include "replica/core/event.hpp"
#include "replica/core/fixed_point.hpp"
#include "replica/core/tensor.hpp"
#include "replica/core/window.hpp"

namespace replica::backend::cuda {

// Process-wide defaults for new contexts (read when a context is made).
// How a convolution runs (not a transposed one, nor one that our direct kernels take, conv.hpp).
enum class ConvPath {
    timed,           // per pass (forward; the two gradients), the faster of cuDNN and the products, timed per
                     // layer and batch size; needs Options::benchmark, else cudnn
    cudnn,           // cuDNN's algorithms
    gemm,            // as products over its windows: im2row, then a fully connected layer over every output pixel
    gemm_forward,    // the forward pass as products, the gradients by cuDNN (for measurements and tests)
    gemm_backward,   // the forward pass by cuDNN, the gradients as products (likewise)
};

struct Options {
    // TF32 tensor cores for convolutions (PyTorch's default), their products too (ConvPath::gemm);
    // never for fully connected layers.
    bool allow_tf32 = true;
    // Only deterministic cuDNN algorithms, and cuDNN's and cuBLASLt's own heuristic choices: the same
    // in every context and every run (benchmark is then not used).
    bool deterministic = false;
    // Choose each convolution's algorithms and each fully connected layer's products by timing the
    // candidates of cuDNN's and cuBLASLt's heuristics as a step runs them (timing.hpp), once per shape
    // and kind of GPU in the process. On an H200 (convolutions): LeNet 0.209 -> 0.179 ms a step,
    // AlexNet 6.83 -> 6.29, GoogLeNet-32 7.70 -> 7.33; TextCNN and FCN unchanged. A new shape's first
    // step takes longer (milliseconds per layer, more with conv_path's product path timed too).
    bool benchmark = true;
    // Capture a model's training step (forward, loss and backward) in CUDA graphs once per batch
    // size and staging buffer and replay them, so that a step costs a few launches on the host (LeNet
    // on an H200: 0.28 instead of 0.84 ms; GoogLeNet-32: 9.2 instead of 11.7 ms). A DataParallel
    // replica's step is captured in segments, cut where a gradient bucket is complete: its all-reduce
    // is queued between two segments, eagerly, so it overlaps the rest of backward and no graph holds
    // a collective. A nested DataParallel runs eagerly; the reproducible mode replays its micro-shards.
    bool graphs = true;
    // How convolutions run (ConvPath). `timed` compares, once per shape and kind of GPU, the product
    // path's forward with cuDNN's timed forward algorithm and its backward with cuDNN's two timed
    // gradient algorithms, and keeps cuDNN for a pass unless the products are 3% faster. On an H200
    // it takes LeNet's second layer (20 -> 50 channels, 5 x 5 over 12 x 12), for which cuDNN's best
    // kernels run at 8 TFLOP/s: LeNet 0.169 -> 0.151 ms a step (batch 32: 0.136 -> 0.123), and
    // AlexNet's first layer forward only (3 channels: cuDNN runs FP32 kernels): AlexNet 6.06 -> 5.83
    // once each pass was chosen on its own; GoogLeNet-32 6.96 -> 6.88, then 6.83 -> 6.74; the text CNN
    // and the FCN run as fast as before. Deterministic mode with `timed`: cuDNN.
    ConvPath conv_path = ConvPath::timed;
    // Where each timed convolution choice is written, one line per shape and kind of GPU as it is
    // made (the layer, cuDNN's chosen algorithms and their times, the product path's times and which
    // passes take it); nullptr: nowhere. `train_bench --log-choices` sets std::cerr.
    std::ostream* log = nullptr;
};

// What a captured step reads from device memory because it changes from step to step (kernel
// arguments are frozen at capture): the dropout masks' seed and global first sample.
struct StepParams {
    std::uint64_t seed = 0, first_sample = 0;
};

// Graphs are kept per (batch size, staging buffer) of a context.
struct GraphKey {
    std::size_t n;
    int slot;
    friend auto operator<=>(const GraphKey&, const GraphKey&) = default;
    // Written out: nvcc 13 leaves the == implied by a defaulted <=> undefined at link time.
    friend bool operator==(const GraphKey& a, const GraphKey& b) { return a.n == b.n && a.slot == b.slot; }
};

// One captured part of a step, and what the host does after launching it: call the step's hook
// with `cut` (a DataParallel replica reduces the buckets complete from there), or at a sync point
// (core/hook.hpp: sync.data is not null) have it sum sync.count floats at sync.data over the
// replicas, or nothing.
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
inline Options& default_options()
{
    static Options o;
    return o;
}

// Every visible GPU, honouring CUDA_VISIBLE_DEVICES; empty when there is none (or no driver).
inline std::vector<Device> visible_devices()
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return {};
    }
    std::vector<Device> out;
    for (int i = 0; i < n; ++i) out.push_back(Device::cuda(i));
    return out;
}

// A cuDNN convolution prepared for one geometry and batch size.
struct ConvPlan {
    bool gemm_forward = false, gemm_backward = false;   // which passes run as products over its windows (ConvPath)
    cudnnTensorDescriptor_t x = nullptr, y = nullptr;
    cudnnFilterDescriptor_t w = nullptr;
    cudnnConvolutionDescriptor_t conv = nullptr;
    cudnnConvolutionFwdAlgo_t fwd{};
    cudnnConvolutionBwdDataAlgo_t bwd_data{};
    cudnnConvolutionBwdFilterAlgo_t bwd_filter{};
    std::size_t workspace = 0;
};

struct ConvKey {
    enum Use { convolution, direct, transposed };   // what the plan is for (conv.hpp)
    core::Window g;
    int cout;
    std::size_t n;
    int use = convolution;
    friend bool operator<(const ConvKey& a, const ConvKey& b)
    {
        auto t = [](const ConvKey& k) {
            return std::make_tuple(k.g.c, k.g.h, k.g.w, k.g.kh, k.g.kw, k.g.sh, k.g.sw, k.g.ph, k.g.pw, k.g.oh, k.g.ow, k.cout, k.n,
                                   k.use);
        };
        return t(a) < t(b);
    }
};

// A matrix product D = op(A) op(B) (+ an epilogue) of fixed shapes through cuBLASLt, FP32 throughout.
struct Gemm {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
    std::size_t workspace = 0;
    bool usable = false;   // cuBLASLt offers an algorithm (a bias-gradient epilogue may have none)
    void destroy()
    {
        if (desc) cublasLtMatmulDescDestroy(desc);
        for (auto l : {a, b, d})
            if (l) cublasLtMatrixLayoutDestroy(l);
        *this = {};
    }
};

// Which product of a fully connected layer (linear.hpp), over how many samples, with which pointer
// alignments (bytes, at most 256: cuBLASLt offers only algorithms that can read and write them).
struct GemmKey {
    enum Kind { forward, forward_relu, weight_grad_bias, weight_grad, input_grad, input_grad_t, forward_no_bias,
                forward_relu_no_bias };
    int kind, in, out;
    std::size_t n;
    int align_a, align_b, align_d;
    bool tf32;   // a convolution's products (conv.hpp) may use TF32, a fully connected layer's never
    friend auto operator<=>(const GemmKey&, const GemmKey&) = default;
    friend bool operator==(const GemmKey& a, const GemmKey& b)   // see GraphKey
    {
        return a.kind == b.kind && a.in == b.in && a.out == b.out && a.n == b.n && a.align_a == b.align_a &&
               a.align_b == b.align_b && a.align_d == b.align_d && a.tf32 == b.tf32;
    }
};

namespace detail {
struct State {
    Device device;
    Options options;
    std::string kind;   // detail::device_kind(): what makes two GPUs time the same
    cudaStream_t stream = nullptr, comm = nullptr, copy = nullptr;
    cudaEvent_t copied = nullptr;   // the compute stream waits for the copy stream's copies
    cudnnHandle_t cudnn = nullptr;
    cublasHandle_t cublas = nullptr;
    cublasLtHandle_t cublaslt = nullptr;
    std::unique_ptr<CachingAllocator> allocator;
    core::Buffer<unsigned char> workspace;
    // The rows (conv.hpp's product path) that the workspace holds, left by a convolution's forward for
    // its backward: of input x, window g, n samples. Any later use of the workspace forgets them.
    struct Rows {
        const float* x = nullptr;
        core::Window g{};
        std::size_t n = 0;
    } workspace_rows;
    core::Buffer<float> ones;
    core::Buffer<double> reduce;          // device scalars for loss and metric reductions
    double* host_reduce = nullptr;        // pinned mirror
    core::FixedStatus* fixed_status = nullptr;   // pinned: the reproducible mode's range check
    cudaEvent_t marker = nullptr;         // re-recorded by mark()
    cudaEvent_t host_mark[2] = {};        // re-recorded by mark_for_host(k)
    std::map<ConvKey, ConvPlan> conv_plans;
    std::map<GemmKey, Gemm> gemms;
    core::Buffer<float> aligned_bias;     // a fully connected layer's bias, where it is not 16-byte aligned
    // Set by a communicator spanning processes: called while synchronize() waits (with the seconds
    // waited so far); it throws to stop waiting for a peer that died or hangs.
    std::function<void(double)> watchdog;
    // CUDA graphs (Options::graphs): the replayable steps, the keys seen once (the first step of a
    // key runs eagerly, growing plans, workspaces and scratch), and the step's parameters.
    std::map<GraphKey, std::vector<Segment>> graphs;
    std::map<GraphKey, bool> warmed;
    bool capturing = false;
    std::optional<GraphKey> partial;            // the key whose segments are being captured
    StepParams* step_host = nullptr;            // pinned, one per step slot (two steps may be in flight)
    core::Buffer<StepParams> step_device;       // one per step slot
    int step_slot = 0;                          // the slot of the last set_step(): a capture reads its params
    void* cublas_workspace = nullptr;           // ours, so that cuBLAS allocates nothing inside a capture
    static constexpr std::size_t kCublasWorkspace = std::size_t{32} << 20;

    // A buffer a captured step uses moved or grew: every graph is stale.
    void drop_graphs()
    {
        for (auto& [key, segments] : graphs)
            for (auto& s : segments)
                if (s.exec) cudaGraphExecDestroy(s.exec);   // none where two cuts met
        graphs.clear();
        warmed.clear();
    }

    explicit State(Device d) : device(d), options(default_options())
    {
        REPLICA_CHECK(cudaSetDevice(d.index()));
        REPLICA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        REPLICA_CHECK(cudaStreamCreateWithFlags(&comm, cudaStreamNonBlocking));
        REPLICA_CHECK(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking));
        REPLICA_CHECK(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming));
        REPLICA_CHECK(cudnnCreate(&cudnn));
        REPLICA_CHECK(cudnnSetStream(cudnn, stream));
        REPLICA_CHECK(cublasCreate(&cublas));
        REPLICA_CHECK(cublasSetStream(cublas, stream));
        REPLICA_CHECK(cublasSetMathMode(cublas, CUBLAS_PEDANTIC_MATH));   // FP32 GEMMs, as PyTorch by default
        REPLICA_CHECK(cublasLtCreate(&cublaslt));
        REPLICA_CHECK(cudaMallocHost(&host_reduce, 4 * sizeof(double)));
        REPLICA_CHECK(cudaMallocHost(&fixed_status, sizeof(core::FixedStatus)));
        *fixed_status = {};
        REPLICA_CHECK(cudaMallocHost(&step_host, 2 * sizeof(StepParams)));
        step_host[0] = step_host[1] = {};
        REPLICA_CHECK(cudaEventCreateWithFlags(&marker, cudaEventDisableTiming));
        for (auto& e : host_mark) REPLICA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        allocator = std::make_unique<CachingAllocator>(d.index());
        cublas_workspace = allocator->allocate(kCublasWorkspace);
        REPLICA_CHECK(cublasSetWorkspace(cublas, cublas_workspace, kCublasWorkspace));
    }
    State(const State&) = delete;
    State& operator=(const State&) = delete;
    void drop_plans()
    {
        drop_graphs();
        for (auto& [key, p] : conv_plans) {
            cudnnDestroyTensorDescriptor(p.x);
            cudnnDestroyTensorDescriptor(p.y);
            cudnnDestroyFilterDescriptor(p.w);
            cudnnDestroyConvolutionDescriptor(p.conv);
        }
        conv_plans.clear();
        for (auto& [key, g] : gemms) g.destroy();
        gemms.clear();
    }
    ~State()
    {
        cudaSetDevice(device.index());
        cudaStreamSynchronize(stream);
        drop_plans();   // and the graphs
        step_device = {};
        aligned_bias = {};
        allocator->release(cublas_workspace);
        cudaFreeHost(step_host);
        workspace = {};
        ones = {};
        reduce = {};
        cudaFreeHost(host_reduce);
        cudaFreeHost(fixed_status);
        cudaEventDestroy(marker);
        for (auto e : host_mark) cudaEventDestroy(e);
        cublasLtDestroy(cublaslt);
        cublasDestroy(cublas);
        cudnnDestroy(cudnn);
        cudaStreamSynchronize(copy);
        cudaEventDestroy(copied);
        cudaStreamDestroy(copy);
        cudaStreamDestroy(comm);
        cudaStreamDestroy(stream);
    }
};
} // namespace detail

class Context {
public:
    static constexpr bool host_visible = false;
    using GraphKey = cuda::GraphKey;
    using Segment = cuda::Segment;

    explicit Context(Device device) : state_(make(device)) {}

    const Device& device() const { return state_->device; }
    const Options& options() const { return state_->options; }
    cudaStream_t stream() const { return state_->stream; }
    cudaStream_t comm_stream() const { return state_->comm; }
    cudnnHandle_t cudnn() const { return state_->cudnn; }
    cublasHandle_t cublas() const { return state_->cublas; }
    cublasLtHandle_t cublaslt() const { return state_->cublaslt; }
    // cuBLAS's and cuBLASLt's workspace (ours, so that nothing is allocated inside a capture).
    void* blas_workspace() const { return state_->cublas_workspace; }
    static constexpr std::size_t blas_workspace_bytes = detail::State::kCublasWorkspace;
    detail::State& state() const { return *state_; }

    // Makes this context's device current for the calling thread.
    void activate() const { REPLICA_CHECK(cudaSetDevice(state_->device.index())); }

    // Zero-filled device memory from the caching allocator.
    template <class T>
    core::Buffer<T> allocate(std::size_t n) const
    {
        if (n == 0) return {};
        activate();
        synchronize();   // a cached block may still be in use by work queued before it was released
        void* p = state_->allocator->allocate(n * sizeof(T));
        return core::Buffer<T>(static_cast<T*>(p), n,
                               [](void* m, void* owner) { static_cast<CachingAllocator*>(owner)->release(m); },
                               state_->allocator.get());
    }

    // Host -> device, finished when it returns (host memory may be reused at once).
    template <class T>
    void upload(T* dst, const T* src, std::size_t n) const
    {
        if (n == 0) return;
        activate();
        REPLICA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyHostToDevice, stream()));
        REPLICA_CHECK(cudaStreamSynchronize(stream()));
    }
    // Device -> host (or another device), queued on the compute stream: synchronize() before reading.
    template <class T>
    void download(T* dst, const T* src, std::size_t n) const
    {
        if (n == 0) return;
        activate();
        REPLICA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDefault, stream()));
    }
    // A device copy of n host values, queued on the compute stream; the host memory must stay valid
    // until the step has finished (train_step waits for its loss).
    template <class T>
    const T* stage(const T* host, T* staging, std::size_t n) const
    {
        if (n) REPLICA_CHECK(cudaMemcpyAsync(staging, host, n * sizeof(T), cudaMemcpyDefault, stream()));
        return staging;
    }
    // CUDA graphs (Options::graphs). set_step() queues the step's parameters into device memory (the
    // captured dropout kernels read them there); begin_capture() .. end_segment() record what this
    // thread queues on the compute stream, and on streams that join it, into the next segment of the
    // step kept under `key`, and launch it; graph(key) gives the segments to replay, in order. A
    // failed capture leaves the stream usable and keeps nothing of the key (abandon_capture()).
    // One StepParams per step slot: the step queued ahead must not overwrite the one of the step still
    // waiting to run (its copy may not have run yet). The slot's previous step has finished (the host
    // waited for it before queueing the step after next).
    void set_step(int slot, std::uint64_t seed, std::uint64_t first_sample) const
    {
        auto& st = *state_;
        if (st.step_device.size() == 0) st.step_device = allocate<StepParams>(2);
        st.step_host[slot] = {seed, first_sample};
        st.step_slot = slot;
        REPLICA_CHECK(cudaMemcpyAsync(st.step_device.data() + slot, st.step_host + slot, sizeof(StepParams),
                                      cudaMemcpyHostToDevice, stream()));
    }
    // While a step is captured: its slot's StepParams in device memory (set_step); otherwise null.
    const StepParams* step_params() const
    {
        return state_->capturing ? state_->step_device.data() + state_->step_slot : nullptr;
    }
    const std::vector<Segment>* graph(const GraphKey& key) const
    {
        auto it = state_->graphs.find(key);
        return it == state_->graphs.end() || in_capture(key) ? nullptr : &it->second;
    }
    bool in_capture(const GraphKey& key) const { return state_->partial && *state_->partial == key; }
    // True the first time a key is seen: that step runs eagerly.
    bool first_time(const GraphKey& key) const { return !std::exchange(state_->warmed[key], true); }
    void begin_capture() const
    {
        activate();
        REPLICA_CHECK(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal));
        state_->capturing = true;
    }
    // Ends the capture begun last, keeps it as the key's next segment (none if it captured nothing)
    // and launches it.
    void end_segment(const GraphKey& key, std::size_t cut, Segment::SyncPoint sync = {}) const
    {
        state_->capturing = false;
        cudaGraph_t g = nullptr;
        REPLICA_CHECK(cudaStreamEndCapture(stream(), &g));
        std::size_t nodes = 0;
        cudaError_t e = cudaGraphGetNodes(g, nullptr, &nodes);
        cudaGraphExec_t exec = nullptr;
        if (e == cudaSuccess && nodes > 0) e = cudaGraphInstantiate(&exec, g, 0);
        cudaGraphDestroy(g);
        REPLICA_CHECK(e);
        state_->partial = key;
        if (exec || cut != Segment::no_cut || sync.data) state_->graphs[key].push_back({exec, cut, sync});
        launch(exec);
    }
    // The capture of `key` is complete: graph(key) replays it from now on.
    void end_capture(const GraphKey& key) const
    {
        end_segment(key, Segment::no_cut);
        state_->partial.reset();
    }
    void abandon_capture(const GraphKey& key) const
    {
        if (state_->capturing) {
            cudaGraph_t g = nullptr;
            if (cudaStreamEndCapture(stream(), &g) == cudaSuccess && g) cudaGraphDestroy(g);
            cudaGetLastError();
        }
        state_->capturing = false;
        if (auto it = state_->graphs.find(key); it != state_->graphs.end()) {
            for (auto& s : it->second)
                if (s.exec) cudaGraphExecDestroy(s.exec);
            state_->graphs.erase(it);
        }
        state_->partial.reset();
    }
    void launch(cudaGraphExec_t exec) const
    {
        if (exec) REPLICA_CHECK(cudaGraphLaunch(exec, stream()));
    }
    // A buffer captured steps use (the model's activations) moved.
    void drop_graphs() const { state_->drop_graphs(); }

    // Copies that overlap compute (the next step's input while this one runs): copy_async() queues
    // on the copy stream, which waits for nothing on the compute stream (the caller knows that nothing
    // queued still reads the destination); end_copies() returns the event that compute work must wait
    // for (wait()) before reading what was copied. One set of copies at a time.
    void begin_copies() const { activate(); }
    template <class T>
    void copy_async(T* dst, const T* host, std::size_t n) const
    {
        if (n) REPLICA_CHECK(cudaMemcpyAsync(dst, host, n * sizeof(T), cudaMemcpyDefault, state_->copy));
    }
    core::Event end_copies() const
    {
        REPLICA_CHECK(cudaEventRecord(state_->copied, state_->copy));
        return {state_->copied};
    }

    // The host waits for everything queued on the compute stream, or only for what was queued before
    // mark_for_host() returned `until` (a training step's loss, with its update queued after it).
    void synchronize() const
    {
        wait_host("cudaStreamSynchronize", [&] { return cudaStreamSynchronize(stream()); }, [&] { return cudaStreamQuery(stream()); });
    }
    void synchronize(core::Event until) const
    {
        const auto e = static_cast<cudaEvent_t>(until.handle);
        wait_host("cudaEventSynchronize", [&] { return cudaEventSynchronize(e); }, [&] { return cudaEventQuery(e); });
    }
    // Two events per context (k = 0, 1: two steps in flight), each re-recorded: synchronize(until)
    // before the next mark_for_host(k) of the same k.
    core::Event mark_for_host(int k) const
    {
        activate();
        REPLICA_CHECK(cudaEventRecord(state_->host_mark[k], stream()));
        return {state_->host_mark[k]};
    }

    // The work queued so far on the compute stream, for another stream (of any device) to wait for.
    // One event per context, re-recorded: wait for it before the next mark().
    core::Event mark() const
    {
        activate();
        REPLICA_CHECK(cudaEventRecord(state_->marker, stream()));
        return {state_->marker};
    }
    // Work queued from now on waits for `e`.
    void wait(core::Event e) const
    {
        if (e.handle) REPLICA_CHECK(cudaStreamWaitEvent(stream(), static_cast<cudaEvent_t>(e.handle), 0));
    }

    // Scratch for cuDNN and the product path (conv.hpp), grown to the largest request and kept; the
    // caller may overwrite it.
    void* workspace(std::size_t bytes) const
    {
        state_->workspace_rows = {};
        auto& w = state_->workspace;
        if (w.size() < bytes) {
            state_->drop_graphs();
            w = allocate<unsigned char>(bytes);
        }
        return w.data();
    }
    // n ones (bias gradients as a GEMV).
    const float* ones(std::size_t n) const
    {
        auto& o = state_->ones;
        if (o.size() < n) {
            state_->drop_graphs();
            o = allocate<float>(n);
            std::vector<float> host(n, 1.0f);
            upload(o.data(), host.data(), n);
        }
        return o.data();
    }

private:
    // Blocks (no watchdog), or polls with backoff calling the watchdog (a communicator across processes).
    template <class Block, class Query>
    void wait_host(const char* call, Block&& block, Query&& query) const
    {
        if (!state_->watchdog) {
            detail::check(block(), call, __FILE__, __LINE__);
            return;
        }
        const core::Backoff wait;
        for (;;) {
            const cudaError_t e = query();
            if (e == cudaSuccess) return;
            if (e != cudaErrorNotReady) detail::check(e, call, __FILE__, __LINE__);
            state_->watchdog(wait.waited());
            wait.pause();
        }
    }

    static std::shared_ptr<detail::State> make(Device device)
    {
        core::require(device.is_cuda(), "cuda::Context made for " + device.name());
        int count = 0;
        if (cudaGetDeviceCount(&count) != cudaSuccess) {
            const auto e = cudaGetLastError();
            throw Error("cannot use " + device.name() + ": " + cudaGetErrorString(e) +
                        ". No usable GPU: check the driver with nvidia-smi, or train on cpu devices");
        }
        core::require(count > 0, "cannot use " + device.name() + ": this process sees no GPU (check "
                                 "CUDA_VISIBLE_DEVICES and nvidia-smi), or train on cpu devices");
        core::require(device.index() < count, "no device " + device.name() + ": this process sees " +
                                                  std::to_string(count) + " GPU(s) (CUDA_VISIBLE_DEVICES renumbers "
                                                  "them); pick one of cuda:0..cuda:" + std::to_string(count - 1));
        return std::make_shared<detail::State>(device);
    }

    std::shared_ptr<detail::State> state_;
};

// The reproducible mode: from now on only deterministic algorithms, chosen by heuristics (a measured
// choice can differ from one run to the next). Plans made before (convolutions' and fully connected
// layers') are dropped and made again.
inline void make_deterministic(const Context& ctx)
{
    auto& s = ctx.state();
    if (s.options.deterministic) return;
    ctx.synchronize();
    s.options.deterministic = true;
    s.drop_plans();
}

} // namespace replica::backend::cuda
