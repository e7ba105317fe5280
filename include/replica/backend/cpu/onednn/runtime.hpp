#pragma once
// oneDNN on the CPU (REPLICA_ONEDNN builds): the engine, the stream and the primitives a CPU context
// has made, kept for the context's life so that a step creates nothing and allocates nothing once
// every shape has run. A cpu::Context owns one Runtime (shared by its copies, which run on one
// thread); a Runtime is not safe to use from two threads at once.
//
// Threads: a primitive runs on as many OpenMP threads as the BLAS calls may use at that moment
// (cpu::blas_threads(), which backend::SerialHostKernels sets to 1 for a scope). The count is part of
// every plan's key: oneDNN fixes how a primitive splits its work, sums included, when it is created,
// so a plan made for one thread count is never run with another, and a plan's results depend only
// on its key (shape, pass, thread count) and the CPU's instruction set.
//
// Layouts: the library's tensors stay in their plain layouts (NCHW activations, PyTorch's weights);
// an Operand stands for one of them as a primitive wants it, reordered into memory of its own where
// the primitive prefers another layout or type (a bf16 tensor the primitive reads or writes as float).

#if !defined(REPLICA_ONEDNN)
#error "replica/backend/cpu/onednn/ needs oneDNN: build with -DREPLICA_ONEDNN=1 and link -ldnnl (Meson: -Donednn=enabled)"
#endif

#include <oneapi/dnnl/dnnl.hpp>

#include <cstddef>
#include <map>
#include <memory>
#include <unordered_map>
#include <utility>

#include "replica/backend/cpu/threads.hpp"
#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::backend::cpu::onednn {

// Makes the calling thread's OpenMP parallel regions, and so the primitives it runs, use n threads.
inline void use_threads(int n)
{
    if (omp_get_max_threads() != n) omp_set_num_threads(n);
}

// A tensor of the library's in its plain layout (`user`) and as a primitive reads or writes it
// (`inner`): the same memory where the layouts agree, else memory of its own and a reorder each way
// needed. Pointers are bound per call; the memory objects and reorders are made once.
class Operand {
public:
    Operand() = default;
    // `to_inner`: the primitive reads it (a reorder plain -> inner); `to_user`: it writes it (inner ->
    // plain, and with `adds`, a second reorder that adds to the plain values instead of assigning).
    Operand(const dnnl::engine& engine, const dnnl::memory::desc& plain, const dnnl::memory::desc& inner,
            bool to_inner, bool to_user, bool adds = false)
        : user_(plain, engine, DNNL_MEMORY_NONE), reordered_(plain != inner)
    {
        if (reordered_ || adds) own_ = dnnl::memory(inner, engine);
        inner_ = reordered_ ? own_ : dnnl::memory(inner, engine, DNNL_MEMORY_NONE);
        if (reordered_ && to_inner) load_ = dnnl::reorder(dnnl::reorder::primitive_desc(user_, own_));
        if (reordered_ && to_user) store_ = dnnl::reorder(dnnl::reorder::primitive_desc(own_, user_));
        if (adds) {
            dnnl::post_ops sum;
            sum.append_sum(1.0f);
            dnnl::primitive_attr attr;
            attr.set_post_ops(sum);
            add_ = dnnl::reorder(dnnl::reorder::primitive_desc(own_, user_, attr));
        }
        to_inner_args_ = {{DNNL_ARG_FROM, user_}, {DNNL_ARG_TO, own_}};
        to_user_args_ = {{DNNL_ARG_FROM, reordered_ || adds ? own_ : inner_}, {DNNL_ARG_TO, user_}};
    }

    // The memory the primitive takes: bound to it once, in the plan's arguments.
    const dnnl::memory& inner() const { return inner_; }

    // Binds the plain tensor at p for the next call; `adding`: the primitive's result is to be added
    // to it (the Operand was made with `adds`), so the primitive writes memory of its own.
    void bind(const void* p, bool adding = false)
    {
        user_.set_data_handle(const_cast<void*>(p));
        if (!reordered_) inner_.set_data_handle(adding ? own_.get_data_handle() : const_cast<void*>(p));
        adding_ = adding;
    }
    // The plain tensor into the inner memory (before the primitive reads it).
    void load(const dnnl::stream& s) const
    {
        if (reordered_) load_.execute(s, to_inner_args_);
    }
    // The inner memory into the plain tensor, assigned or added (after the primitive wrote it).
    void store(const dnnl::stream& s) const
    {
        if (adding_) add_.execute(s, to_user_args_);
        else if (reordered_) store_.execute(s, to_user_args_);
    }

private:
    dnnl::memory user_, inner_, own_;
    dnnl::reorder load_, store_, add_;
    std::unordered_map<int, dnnl::memory> to_inner_args_, to_user_args_;
    bool reordered_ = false, adding_ = false;
};

// The plain layout of a tensor of `type` (float unless said): rows of the last dimension, as the
// library stores them.
inline dnnl::memory::desc plain(const dnnl::memory::dims& dims, dnnl::memory::data_type type = dnnl::memory::data_type::f32)
{
    using tag = dnnl::memory::format_tag;
    const tag t = dims.size() == 1 ? tag::a : dims.size() == 2 ? tag::ab : dims.size() == 3 ? tag::abc
                  : tag::abcd;
    return {dims, type, t};
}
// Whatever layout the primitive prefers.
inline dnnl::memory::desc any(const dnnl::memory::dims& dims, dnnl::memory::data_type type = dnnl::memory::data_type::f32)
{
    return {dims, type, dnnl::memory::format_tag::any};
}

// Whether the CPU computes bf16 products natively (AVX-512 BF16 or AMX, as oneDNN sees it): where it
// does not, oneDNN's bf16 primitives emulate them and the library's own bf16 path is kept.
inline bool native_bf16()
{
    static const bool yes = [] {
        const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
        const auto bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
        return (isa & bf16) == bf16;
    }();
    return yes;
}

// The engine, the stream and the plans made so far, by key: each Plan type has its own map (Key must
// be ordered by <).
class Runtime {
public:
    Runtime() : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {}
    Runtime(const Runtime&) = delete;
    Runtime& operator=(const Runtime&) = delete;

    const dnnl::engine& engine() const { return engine_; }
    dnnl::stream& stream() { return stream_; }

    // The plan for `key`, made by `make(engine)` the first time (a null pointer from `make`: no plan
    // for this key, remembered too).
    template <class Plan, class Key, class Make>
    Plan* plan(const Key& key, Make&& make)
    {
        auto& plans = store<Plan, Key>();
        auto it = plans.find(key);
        if (it == plans.end()) {
            it = plans.emplace(key, make(engine_)).first;
            if (it->second) ++made_;
        }
        return it->second.get();
    }
    // How many plans with primitives this runtime has made.
    std::size_t plans_made() const { return made_; }

private:
    struct Erased {
        virtual ~Erased() = default;
    };
    template <class Plan, class Key>
    struct Plans : Erased {
        std::map<Key, std::unique_ptr<Plan>> plans;
    };
    template <class Plan, class Key>
    std::map<Key, std::unique_ptr<Plan>>& store()
    {
        auto& slot = stores_[&type_tag<Plan, Key>];
        if (!slot) slot = std::make_unique<Plans<Plan, Key>>();
        return static_cast<Plans<Plan, Key>&>(*slot).plans;
    }
    template <class Plan, class Key>
    static inline const char type_tag = 0;

    dnnl::engine engine_;
    dnnl::stream stream_;
    std::unordered_map<const void*, std::unique_ptr<Erased>> stores_;
    std::size_t made_ = 0;
};

} // namespace replica::backend::cpu::onednn
