// expect: this context lacks an op of the pooling family
#include <cstddef>

#include "replica/backend/kernels/kernels.hpp"
using namespace replica;

// A backend's context whose ops take any arguments, every family's but pooling's avg_pool_backward.
namespace partial {
struct Context {};
#define PARTIAL_OP(name) template <class... A> void name(const Context&, A&&...);
#define PARTIAL_WINDOW_OP(name) template <core::Window g, class... A> void name(const Context&, A&&...);
PARTIAL_OP(relu_forward) PARTIAL_OP(relu_backward) PARTIAL_OP(sigmoid_forward) PARTIAL_OP(sigmoid_backward)
PARTIAL_OP(tanh_forward) PARTIAL_OP(tanh_backward) PARTIAL_OP(gelu_forward) PARTIAL_OP(gelu_backward)
PARTIAL_OP(gelu_tanh_forward) PARTIAL_OP(gelu_tanh_backward) PARTIAL_OP(dropout_apply) PARTIAL_OP(copy)
PARTIAL_OP(add) PARTIAL_OP(add_into) PARTIAL_OP(fill)
PARTIAL_OP(convert) PARTIAL_OP(to_activation_layout) PARTIAL_OP(from_activation_layout)
PARTIAL_OP(copy_channels_in) PARTIAL_OP(copy_channels_out)
PARTIAL_OP(linear_forward) PARTIAL_OP(linear_backward) PARTIAL_OP(linear_backward_relu)
template <core::Window g, class T> std::size_t conv_scratch_size(const Context&, int, std::size_t);
template <core::Window g, class T> std::size_t conv_transpose_scratch_size(const Context&, int, std::size_t);
PARTIAL_WINDOW_OP(conv_forward) PARTIAL_WINDOW_OP(conv_backward) PARTIAL_WINDOW_OP(conv_backward_relu)
PARTIAL_WINDOW_OP(conv_transpose_forward) PARTIAL_WINDOW_OP(conv_transpose_backward)
PARTIAL_WINDOW_OP(max_pool_forward) PARTIAL_WINDOW_OP(max_pool_backward) PARTIAL_WINDOW_OP(avg_pool_forward)
template <class T> std::size_t batch_norm_scratch(const Context&, std::size_t);
PARTIAL_OP(batch_norm_sums) PARTIAL_OP(batch_norm_statistics) PARTIAL_OP(batch_norm_shard_sums)
PARTIAL_OP(batch_norm_step_statistics) PARTIAL_OP(batch_norm_running) PARTIAL_OP(batch_norm_apply)
PARTIAL_OP(batch_norm_backward_sums) PARTIAL_OP(batch_norm_backward_input)
PARTIAL_OP(layer_norm_forward) PARTIAL_OP(layer_norm_backward)
template <class T, class... A> std::size_t attention_scratch(const Context&, A&&...);
PARTIAL_OP(attention_forward) PARTIAL_OP(attention_backward)
PARTIAL_OP(embedding_forward) PARTIAL_OP(embedding_backward) PARTIAL_OP(position_embedding_forward)
PARTIAL_OP(position_embedding_backward)
PARTIAL_OP(sgd_update) PARTIAL_OP(adam_update) PARTIAL_OP(accumulate_gradient) PARTIAL_OP(sum_of_squares)
PARTIAL_OP(clip_to_norm) PARTIAL_OP(clip_by_norm)
template <class... A> bool unscale_gradient(const Context&, A&&...);
PARTIAL_OP(softmax_cross_entropy)
template <class... A> std::size_t count_correct(const Context&, A&&...);
PARTIAL_OP(make_deterministic) PARTIAL_OP(zero_fixed) PARTIAL_OP(add_fixed) PARTIAL_OP(fixed_to_float)
PARTIAL_OP(check_fixed)
} // namespace partial

static_assert(backend::kernels::implements_kernels<partial::Context>());
