#pragma once
// Activation kernels on the GPU: Sigmoid, Tanh and GELU, forward and backward, with the CPU
// backend's formulas (backend/cpu/elementwise.hpp). Each element is computed on its own, so the
// results do not depend on the launch or on thread timing. Like ReLU's, these passes are bound by
// memory: they move four floats at a time where every pointer is 16-byte aligned.

#include <cstddef>

#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/elementwise.hpp"
#include "replica/backend/cuda/launch.hpp"

namespace replica::backend::cuda {

namespace kernels {
struct SigmoidForward {
    __device__ float operator()(float x) const { return 1.0f / (1.0f + expf(-x)); }
};
struct SigmoidBackward {   // from the output
    __device__ float operator()(float y, float dy) const { return dy * y * (1.0f - y); }
};
struct TanhForward {
    __device__ float operator()(float x) const { return tanhf(x); }
};
struct TanhBackward {   // from the output
    __device__ float operator()(float y, float dy) const { return dy * (1.0f - y * y); }
};
struct GeluForward {
    __device__ float operator()(float x) const { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
};
struct GeluBackward {   // from the input
    __device__ float operator()(float x, float dy) const
    {
        const float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
        return dy * (cdf + x * 0.39894228040143268f * expf(-0.5f * x * x));
    }
};

// y = f(x)
template <class F>
__global__ void map1(F f, const float* x, float* y, std::size_t count)
{
    REPLICA_GRID_LOOP(i, count) y[i] = f(x[i]);
}
template <class F>
__global__ void map1_4(F f, const float4* x, float4* y, std::size_t quads)
{
    REPLICA_GRID_LOOP(i, quads)
    {
        const float4 v = x[i];
        y[i] = make_float4(f(v.x), f(v.y), f(v.z), f(v.w));
    }
}
// dx = f(a, dy), a being the forward's input or output
template <class F>
__global__ void map2(F f, const float* a, const float* dy, float* dx, std::size_t count)
{
    REPLICA_GRID_LOOP(i, count) dx[i] = f(a[i], dy[i]);
}
template <class F>
__global__ void map2_4(F f, const float4* a, const float4* dy, float4* dx, std::size_t quads)
{
    REPLICA_GRID_LOOP(i, quads)
    {
        const float4 v = a[i], d = dy[i];
        dx[i] = make_float4(f(v.x, d.x), f(v.y, d.y), f(v.z, d.z), f(v.w, d.w));
    }
}
} // namespace kernels

namespace detail {
// The float4 kernel over the whole quads when every pointer is aligned, the scalar one over the rest.
template <class F>
void map1(const Context& ctx, const float* x, float* y, std::size_t count, const char* what)
{
    std::size_t done = 0;
    if (quad_aligned(x, y) && count >= 4) {
        done = count / 4 * 4;
        kernels::map1_4<<<blocks_for(count / 4), kThreads, 0, ctx.stream()>>>(
            F{}, reinterpret_cast<const float4*>(x), reinterpret_cast<float4*>(y), count / 4);
    }
    if (done < count)
        kernels::map1<<<blocks_for(count - done), kThreads, 0, ctx.stream()>>>(F{}, x + done, y + done, count - done);
    check_launch(what);
}
template <class F>
void map2(const Context& ctx, const float* a, const float* dy, float* dx, std::size_t count, const char* what)
{
    std::size_t done = 0;
    if (quad_aligned(a, dy, dx) && count >= 4) {
        done = count / 4 * 4;
        kernels::map2_4<<<blocks_for(count / 4), kThreads, 0, ctx.stream()>>>(
            F{}, reinterpret_cast<const float4*>(a), reinterpret_cast<const float4*>(dy), reinterpret_cast<float4*>(dx),
            count / 4);
    }
    if (done < count)
        kernels::map2<<<blocks_for(count - done), kThreads, 0, ctx.stream()>>>(F{}, a + done, dy + done, dx + done,
                                                                             count - done);
    check_launch(what);
}
} // namespace detail

inline void sigmoid_forward(const Context& ctx, const float* x, float* y, std::size_t count)
{
    detail::map1<kernels::SigmoidForward>(ctx, x, y, count, "sigmoid_forward");
}
inline void sigmoid_backward(const Context& ctx, const float* y, const float* dy, float* dx, std::size_t count)
{
    detail::map2<kernels::SigmoidBackward>(ctx, y, dy, dx, count, "sigmoid_backward");
}
inline void tanh_forward(const Context& ctx, const float* x, float* y, std::size_t count)
{
    detail::map1<kernels::TanhForward>(ctx, x, y, count, "tanh_forward");
}
inline void tanh_backward(const Context& ctx, const float* y, const float* dy, float* dx, std::size_t count)
{
    detail::map2<kernels::TanhBackward>(ctx, y, dy, dx, count, "tanh_backward");
}
inline void gelu_forward(const Context& ctx, const float* x, float* y, std::size_t count)
{
    detail::map1<kernels::GeluForward>(ctx, x, y, count, "gelu_forward");
}
inline void gelu_backward(const Context& ctx, const float* x, const float* dy, float* dx, std::size_t count)
{
    detail::map2<kernels::GeluBackward>(ctx, x, dy, dx, count, "gelu_backward");
}

} // namespace replica::backend::cuda
