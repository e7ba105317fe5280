#pragma once
// Activation kernels on the GPU: Sigmoid, Tanh and GELU (both forms), forward and backward, with the CPU
// backend's formulas (backend/cpu/elementwise.hpp). Each element is computed on its own, so the
// results do not depend on the launch or on thread timing. Like ReLU's, these passes are bound by
// memory: they move 16 bytes at a time where every pointer is 16-byte aligned (backend/cuda/packed.hpp).
// x, y, dy, dx are activations of one type T (float, bf16, fp16), computed in float.

#include <cstddef>

#include "replica/backend/cuda/context.hpp"
#include "replica/backend/cuda/elementwise.hpp"
#include "replica/backend/cuda/launch.hpp"
#include "replica/backend/cuda/packed.hpp"
#include "replica/core/config.hpp"

namespace REPLICA_NAMESPACE::backend::cuda {

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
struct GeluTanhForward {
    __device__ float operator()(float x) const
    {
        return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
    }
};
struct GeluTanhBackward {   // from the input
    __device__ float operator()(float x, float dy) const
    {
        const float t = tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x));
        return dy * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * 0.79788456080286536f * (1.0f + 0.134145f * x * x));
    }
};
} // namespace kernels

template <core::Storage T>
void sigmoid_forward(const Context& ctx, const T* x, T* y, std::size_t count)
{
    detail::map1<kernels::SigmoidForward>(ctx, x, y, count, "sigmoid_forward");
}
template <core::Storage T>
void sigmoid_backward(const Context& ctx, const T* y, const T* dy, T* dx, std::size_t count)
{
    detail::map2<kernels::SigmoidBackward>(ctx, y, dy, dx, count, "sigmoid_backward");
}
template <core::Storage T>
void tanh_forward(const Context& ctx, const T* x, T* y, std::size_t count)
{
    detail::map1<kernels::TanhForward>(ctx, x, y, count, "tanh_forward");
}
template <core::Storage T>
void tanh_backward(const Context& ctx, const T* y, const T* dy, T* dx, std::size_t count)
{
    detail::map2<kernels::TanhBackward>(ctx, y, dy, dx, count, "tanh_backward");
}
template <core::Storage T>
void gelu_forward(const Context& ctx, const T* x, T* y, std::size_t count)
{
    detail::map1<kernels::GeluForward>(ctx, x, y, count, "gelu_forward");
}
template <core::Storage T>
void gelu_backward(const Context& ctx, const T* x, const T* dy, T* dx, std::size_t count)
{
    detail::map2<kernels::GeluBackward>(ctx, x, dy, dx, count, "gelu_backward");
}
template <core::Storage T>
void gelu_tanh_forward(const Context& ctx, const T* x, T* y, std::size_t count)
{
    detail::map1<kernels::GeluTanhForward>(ctx, x, y, count, "gelu_tanh_forward");
}
template <core::Storage T>
void gelu_tanh_backward(const Context& ctx, const T* x, const T* dy, T* dx, std::size_t count)
{
    detail::map2<kernels::GeluTanhBackward>(ctx, x, dy, dx, count, "gelu_tanh_backward");
}

} // namespace replica::backend::cuda
