// ReLU and GELU, forward and backward: one element-wise loop each around kernels/elementwise.h.
// Backward takes the layer's *input* x (what the layer saved in forward) and the gradient dy of its
// output, and writes dx = dy * f'(x).
#include "tinyddp/core/half_precision.h"
#include "tinyddp/kernels/argument_checks.h"
#include "tinyddp/kernels/cpu_vector_clones.h"
#include "tinyddp/kernels/elementwise.h"
#include "tinyddp/kernels/ops.h"

#include "tinyddp/kernels/cuda_dispatch.h"

namespace tinyddp::kernels {

namespace {

void check_forward(const char* op, const Tensor& x, const Tensor& y) {
  detail::check_tensor(op, "x", x);
  detail::check_tensor(op, "y", y);
  detail::check_like(op, "x", x, "y", y);
}

void check_backward(const char* op, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  detail::check_tensor(op, "x", x);
  detail::check_tensor(op, "dy", dy);
  detail::check_tensor(op, "dx", dx);
  detail::check_like(op, "x", x, "dy", dy);
  detail::check_like(op, "x", x, "dx", dx);
}

// The CPU loops. y may alias x, and dx may alias dy: each element is read before it is written and
// no other element is involved, so no restrict here.
template <typename Fn>
void map_cpu(const float* x, float* y, int64_t n, Fn fn) {
  for (int64_t i = 0; i < n; ++i) y[i] = fn(x[i]);
}
template <typename Fn>
void map2_cpu(const float* x, const float* dy, float* dx, int64_t n, Fn fn) {
  for (int64_t i = 0; i < n; ++i) dx[i] = fn(x[i], dy[i]);
}

// out = m ? g : +0, as a bitwise and of g with all ones or all zeros: the same bits as relu_grad's
// select, in a form the compiler vectorises (a select between a byte and a float it does not). g and
// out may alias.
TINYDDP_CPU_VECTOR_CLONES void masked_copy_cpu(const uint8_t* __restrict m, const float* g, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = f32_from_bits(f32_bits(g[i]) & (0u - uint32_t(m[i])));
}

}  // namespace

void relu_forward(const Tensor& x, Tensor& y) {
  check_forward("relu_forward", x, y);
  if (const cuda::Kernels* gpu = cuda_kernels_for(x)) {
    gpu->relu_forward(x.device().index, x.data<float>(), y.data<float>(), x.numel());
    return;
  }
  map_cpu(x.data<float>(), y.data<float>(), x.numel(), [](float v) { return relu(v); });
}

void relu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  check_backward("relu_backward", x, dy, dx);
  if (const cuda::Kernels* gpu = cuda_kernels_for(x)) {
    gpu->relu_backward(x.device().index, x.data<float>(), dy.data<float>(), dx.data<float>(), x.numel());
    return;
  }
  map2_cpu(x.data<float>(), dy.data<float>(), dx.data<float>(), x.numel(),
           [](float v, float g) { return relu_grad(v, g); });
}

void relu_forward_masked(const Tensor& x, Tensor& y, Tensor& mask) {
  check_forward("relu_forward_masked", x, y);
  detail::check_tensor("relu_forward_masked", "mask", mask, DType::u8);
  TINYDDP_CHECK(mask.shape() == x.shape() && x.device().is_cpu() && mask.device().is_cpu(),
                "relu_forward_masked: `mask` is ", mask.describe(), " but `x` is ", x.describe(),
                hint("a u8 mask of x's shape, both on the CPU"));
  const float* in = x.data<float>();
  float* out = y.data<float>();
  uint8_t* __restrict m = mask.data<uint8_t>();
  for (int64_t i = 0, n = x.numel(); i < n; ++i) {
    const float v = in[i];
    m[i] = uint8_t(v > 0.f);  // read before y is written: y may alias x
    out[i] = relu(v);
  }
}

void relu_backward_masked(const Tensor& mask, const Tensor& dy, Tensor& dx) {
  detail::check_tensor("relu_backward_masked", "mask", mask, DType::u8);
  detail::check_tensor("relu_backward_masked", "dy", dy);
  detail::check_tensor("relu_backward_masked", "dx", dx);
  detail::check_like("relu_backward_masked", "dy", dy, "dx", dx);
  TINYDDP_CHECK(mask.shape() == dy.shape() && dy.device().is_cpu() && mask.device().is_cpu(),
                "relu_backward_masked: `mask` is ", mask.describe(), " but `dy` is ", dy.describe(),
                hint("the mask relu_forward_masked wrote for this layer's input, on the CPU"));
  masked_copy_cpu(mask.data<uint8_t>(), dy.data<float>(), dx.data<float>(), dy.numel());
}

void gelu_forward(const Tensor& x, Tensor& y) {
  check_forward("gelu_forward", x, y);
  if (const cuda::Kernels* gpu = cuda_kernels_for(x)) {
    gpu->gelu_forward(x.device().index, x.data<float>(), y.data<float>(), x.numel());
    return;
  }
  map_cpu(x.data<float>(), y.data<float>(), x.numel(), [](float v) { return gelu(v); });
}

void gelu_backward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  check_backward("gelu_backward", x, dy, dx);
  if (const cuda::Kernels* gpu = cuda_kernels_for(x)) {
    gpu->gelu_backward(x.device().index, x.data<float>(), dy.data<float>(), dx.data<float>(), x.numel());
    return;
  }
  map2_cpu(x.data<float>(), dy.data<float>(), dx.data<float>(), x.numel(),
           [](float v, float g) { return gelu_grad(v, g); });
}

}  // namespace tinyddp::kernels
