#pragma once
// The CUDA context of one replica: its device, streams, library handles, caching allocator, plan
// cache, CUDA graph cache and reduction memory (state.hpp, one part each). Satisfies the backend
// contract (backend/contract.hpp) and adds what only CUDA has: CUDA graphs, the copy stream, the
// library handles and the scratch that layers' kernels use. Only under nvcc.

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "replica/backend/contract.hpp"
#include "replica/backend/cuda/allocator.hpp"
#include "replica/backend/cuda/check.hpp"
#include "replica/backend/cuda/handles.hpp"
#include "replica/backend/cuda/options.hpp"
#include "replica/backend/cuda/state.hpp"
#include "replica/core/backoff.hpp"
#include "replica/core/config.hpp"
#include "replica/core/device.hpp"
#include "replica/core/event.hpp"
#include "replica/core/number.hpp"
#include "replica/core/tensor.hpp"

namespace REPLICA_NAMESPACE::backend::cuda {

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

class Context;
inline void make_deterministic(const Context& ctx);

// A Context is a handle: copies share one detail::State, and a Buffer from allocate() must not
// outlive the last copy. Its members are const because they never change which state a handle
// refers to; many of them change that shared state (plans, scratch, CUDA graphs), as a const
// shared_ptr lets its pointee change. Layers receive a const Context& for that reason.
class Context {
public:
    static constexpr bool host_visible = false;
    using GraphKey = cuda::GraphKey;
    using Segment = cuda::Segment;

    explicit Context(Device device) : state_(make(device)) {}

    const Device& device() const { return state_->device; }
    const Options& options() const { return state_->options; }
    // Whether 16-bit activations are channels-last here (layout.hpp): Options::channels_last, unless
    // this handle is channels_first()'s.
    bool keeps_channels_last() const { return state_->options.channels_last && !channels_first_; }
    // A handle to the same state whose 16-bit activations are channels-first: for a layer that runs so
    // between channels-last neighbours (conv.hpp, detail::detours).
    Context channels_first() const
    {
        Context c = *this;
        c.channels_first_ = true;
        return c;
    }
    cudaStream_t stream() const { return state_->streams.compute(); }
    cudaStream_t comm_stream() const { return state_->streams.comm(); }
    cudnnHandle_t cudnn() const { return state_->libraries.cudnn(); }
    cublasHandle_t cublas() const { return state_->libraries.cublas(); }
    cublasLtHandle_t cublaslt() const { return state_->libraries.cublaslt(); }
    // cuBLAS's and cuBLASLt's workspace (ours, so that nothing is allocated inside a capture).
    void* blas_workspace() const { return state_->libraries.blas_workspace(); }
    static constexpr std::size_t blas_workspace_bytes = Libraries::blas_workspace_bytes;

    // The backend's parts that kernels keep things in (state.hpp): plans and scratch, reductions'
    // memory. Only the backend's own kernels use them.
    detail::PlanCache& plan_cache() const { return state_->plans; }
    detail::Reductions& reductions() const { return state_->reductions; }
    // The CUDA graphs held, and the device memory the allocator holds (for tests and diagnostics).
    const detail::GraphCache& graph_cache() const { return state_->graphs; }
    std::size_t reserved_bytes() const { return state_->allocator.reserved_bytes(); }
    // True while a step is being captured (nothing may be allocated or timed then).
    bool capturing() const { return state_->graphs.capturing(); }

    // What makes two GPUs time the same (algorithm choices are kept per kind): model, compute
    // capability, multiprocessors (a MIG slice has fewer).
    const std::string& device_kind() const
    {
        std::string& kind = state_->kind;
        if (kind.empty()) {
            cudaDeviceProp prop{};
            REPLICA_CHECK(cudaGetDeviceProperties(&prop, device().index()));
            kind = std::string(prop.name) + " sm" + std::to_string(prop.major * 10 + prop.minor) + " " +
                   std::to_string(prop.multiProcessorCount);
        }
        return kind;
    }

    // The device's multiprocessors (SMs), read once: for grids sized to fill the device where the
    // result does not depend on the grid (elementwise passes; never a reduction's order).
    unsigned multiprocessors() const
    {
        unsigned& m = state_->multiprocessors;
        if (m == 0) {
            int count = 0;
            REPLICA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device().index()));
            m = unsigned(count);
        }
        return m;
    }

    // While the host waits for this context's device (synchronize(), synchronize(Event)), it polls
    // and calls `watchdog` with the seconds waited so far; the watchdog throws to stop waiting (a
    // communicator across processes: a peer died or hangs). Empty: the host blocks. Set it while no
    // other thread waits on this context; it is shared by every copy.
    void set_watchdog(std::function<void(double)> watchdog) { state_->watchdog = std::move(watchdog); }

    // Makes this context's device current for the calling thread.
    void activate() const { REPLICA_CHECK(cudaSetDevice(state_->device.index())); }

    // Zero-filled device memory from the caching allocator.
    template <class T>
    core::Buffer<T> allocate(std::size_t n) const
    {
        if (n == 0) return {};
        activate();
        synchronize();   // a cached block may still be in use by work queued before it was released
        return state_->allocator.buffer<T>(n);
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
        auto& graphs = state_->graphs;
        if (!graphs.has_step_device()) graphs.keep_step_device(allocate<StepParams>(2));
        const StepParams* host = graphs.set_step(slot, {seed, first_sample});
        REPLICA_CHECK(cudaMemcpyAsync(graphs.step_device(slot), host, sizeof(StepParams), cudaMemcpyHostToDevice, stream()));
    }
    // While a step is captured: its slot's StepParams in device memory (set_step); otherwise null.
    const StepParams* step_params() const { return state_->graphs.step_params(); }
    const std::vector<Segment>* graph(const GraphKey& key) const { return state_->graphs.find(key); }
    bool in_capture(const GraphKey& key) const { return state_->graphs.in_capture(key); }
    // True the first time a key is seen: that step runs eagerly.
    bool first_time(const GraphKey& key) const { return state_->graphs.first_time(key); }
    void begin_capture() const
    {
        activate();
        REPLICA_CHECK(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal));
        state_->graphs.set_capturing(true);
    }
    // Ends the capture begun last, keeps it as the key's next segment (none if it captured nothing)
    // and launches it.
    void end_segment(const GraphKey& key, std::size_t cut, Segment::SyncPoint sync = {}) const
    {
        state_->graphs.set_capturing(false);
        cudaGraph_t raw = nullptr;
        REPLICA_CHECK(cudaStreamEndCapture(stream(), &raw));
        Graph captured(raw);
        std::size_t nodes = 0;
        cudaError_t e = cudaGraphGetNodes(captured.get(), nullptr, &nodes);
        cudaGraphExec_t exec = nullptr;
        if (e == cudaSuccess && nodes > 0) e = cudaGraphInstantiate(&exec, captured.get(), 0);
        GraphExec owned(exec);
        captured.reset();
        REPLICA_CHECK(e);
        launch(state_->graphs.add(key, std::move(owned), cut, sync));
    }
    // The capture of `key` is complete: graph(key) replays it from now on.
    void end_capture(const GraphKey& key) const
    {
        end_segment(key, Segment::no_cut);
        state_->graphs.complete();
    }
    void abandon_capture(const GraphKey& key) const
    {
        if (state_->graphs.capturing()) {
            cudaGraph_t g = nullptr;
            if (cudaStreamEndCapture(stream(), &g) == cudaSuccess && g) cudaGraphDestroy(g);
            cudaGetLastError();
        }
        state_->graphs.abandon(key);
    }
    void launch(cudaGraphExec_t exec) const
    {
        if (exec) REPLICA_CHECK(cudaGraphLaunch(exec, stream()));
    }
    // A buffer captured steps use (the model's activations) moved.
    void drop_graphs() const { state_->graphs.drop(); }

    // Copies that overlap compute (the next step's input while this one runs): copy_async() queues
    // on the copy stream, which waits for nothing on the compute stream (the caller knows that nothing
    // queued still reads the destination); end_copies() returns the event that compute work must wait
    // for (wait()) before reading what was copied. One set of copies at a time.
    void begin_copies() const { activate(); }
    template <class T>
    void copy_async(T* dst, const T* host, std::size_t n) const
    {
        if (n) REPLICA_CHECK(cudaMemcpyAsync(dst, host, n * sizeof(T), cudaMemcpyDefault, state_->streams.copy()));
    }
    core::Event end_copies() const
    {
        const Streams& s = state_->streams;
        REPLICA_CHECK(cudaEventRecord(s.copied(), s.copy()));
        return {s.copied()};
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
        const cudaEvent_t e = state_->streams.host_mark(k);
        REPLICA_CHECK(cudaEventRecord(e, stream()));
        return {e};
    }

    // The work queued so far on the compute stream, for another stream (of any device) to wait for.
    // One event per context, re-recorded: wait for it before the next mark().
    core::Event mark() const
    {
        activate();
        const cudaEvent_t e = state_->streams.marker();
        REPLICA_CHECK(cudaEventRecord(e, stream()));
        return {e};
    }
    // Work queued from now on waits for `e`.
    void wait(core::Event e) const
    {
        if (e.handle) REPLICA_CHECK(cudaStreamWaitEvent(stream(), static_cast<cudaEvent_t>(e.handle), 0));
    }

    // Scratch for cuDNN and the product path (conv/), grown to the largest request and kept; the
    // caller may overwrite it (which forgets the rows a convolution's forward left there).
    void* workspace(std::size_t bytes) const
    {
        auto& plans = state_->plans;
        plans.workspace_rows = {};
        if (plans.workspace.size() < bytes) {
            drop_graphs();
            plans.workspace = allocate<unsigned char>(bytes);
        }
        return plans.workspace.data();
    }
    // n ones of type T (bias gradients as a GEMV).
    template <core::Storage T = float>
    const T* ones(std::size_t n) const
    {
        auto& o = [this]() -> core::Buffer<T>& {
            if constexpr (std::same_as<T, float>) return state_->plans.ones;
            else if constexpr (std::same_as<T, core::bf16>) return state_->plans.ones_bf16;
            else return state_->plans.ones_fp16;
        }();
        if (o.size() < n) {
            drop_graphs();
            o = allocate<T>(n);
            std::vector<T> host(n, core::from_float<T>(1.0f));
            upload(o.data(), host.data(), n);
        }
        return o.data();
    }

private:
    friend void make_deterministic(const Context& ctx);

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
    bool channels_first_ = false;
};
static_assert(backend::Context<Context>);

// An ordering event (no timing) of ctx's device, made current first: for code beside the context
// (communicators) that orders its work with the context's streams.
inline Event make_event(const Context& ctx)
{
    ctx.activate();
    return make_event();
}

// The reproducible mode: from now on only deterministic algorithms, chosen by heuristics (a measured
// choice can differ from one run to the next). Plans made before (convolutions' and fully connected
// layers') are dropped and made again, and with them the CUDA graphs that ran them.
inline void make_deterministic(const Context& ctx)
{
    auto& s = *ctx.state_;
    if (s.options.deterministic) return;
    ctx.synchronize();
    s.options.deterministic = true;
    s.graphs.drop();
    s.plans.drop_plans();
}

} // namespace replica::backend::cuda
