// The kernel table of the fake CUDA devices (kernels/cuda/cuda_kernels.h's Kernels): each entry queues
// the CPU arithmetic on the fake device's default stream (test/support/fake_stream.h) and returns, as a
// kernel launch does, with the memory it writes poisoned until it runs. So tensors on fake devices take
// the GPU's code path in kernels/*.cpp, and a host read or a second stream that skips a wait reads the
// poison. Entries that return a host value (losses, reductions) wait for the default stream and compute
// on the calling thread, as the CUDA half's do.
//
// The arithmetic is the CPU's, bit for bit: element-wise entries run kernels/elementwise.h's functions
// (built, as the CPU loops are, without floating-point contraction), the others call kernels/ops.h on
// host copies of their operands.
#include <cstring>

#include "tinyddp/kernels/cuda/cuda_kernels.h"
#include "tinyddp/kernels/cuda_dispatch.h"
#include "tinyddp/kernels/ops.h"
#include "test/support/fake_cuda.h"

namespace tinyddp::kernels::fake {

namespace {

FakeCuda& devices() {
  FakeCuda* fake = active_fake_cuda();
  TINYDDP_CHECK(fake != nullptr, "fake kernels: no fake CUDA devices are installed");
  return *fake;
}

void launch(int device, const char* what, std::vector<WrittenRange> writes, std::function<void()> work) {
  devices().launch_on_device(device, what, std::move(writes), std::move(work));
}

// A host tensor holding a copy of `rows` x `cols` values at `src`.
Tensor host_copy(const void* src, int64_t rows, int64_t cols, DType dtype = DType::f32) {
  Tensor t = Tensor::empty({rows, cols}, dtype);
  if (t.numel() > 0) std::memcpy(t.raw_data(), src, size_t(t.numel()) * dtype_size(dtype));
  return t;
}
void copy_back(void* dst, const Tensor& t) {
  if (t.numel() > 0) std::memcpy(dst, t.raw_data(), size_t(t.numel()) * dtype_size(t.dtype()));
}
size_t floats(int64_t n) { return size_t(n) * sizeof(float); }

// NCCL-style label validation on the device: the smallest row whose label is outside [0, cols), or -1.
int64_t first_bad_label(const int64_t* labels, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    if (labels[r] < 0 || labels[r] >= cols) return r;
  return -1;
}

void gemm(int device, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  launch(device, "gemm", {{c, floats(m * ldc)}}, [=] {
    Tensor ha = host_copy(a, ta ? k : m, lda), hb = host_copy(b, tb ? n : k, ldb), hc = host_copy(c, m, ldc);
    kernels::gemm(ha, ta, hb, tb, hc, alpha, beta);
    copy_back(c, hc);
  });
}

// bf16 or f16 operands: the CPU's mixed GEMM widens them exactly and sums in f32, as the tensor cores do.
void gemm_mixed(int device, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void* a, int64_t lda,
                const void* b, int64_t ldb, DType operands, float beta, float* c, int64_t ldc) {
  launch(device, "gemm_mixed", {{c, floats(m * ldc)}}, [=] {
    Tensor ha = host_copy(a, ta ? k : m, lda, operands), hb = host_copy(b, tb ? n : k, ldb, operands);
    Tensor hc = host_copy(c, m, ldc);
    kernels::gemm(ha, ta, hb, tb, hc, alpha, beta);
    copy_back(c, hc);
  });
}

void bias_add(int device, float* y, const float* bias, int64_t rows, int64_t cols) {
  launch(device, "bias_add", {{y, floats(rows * cols)}}, [=] {
    Tensor hy = host_copy(y, rows, cols), hb = host_copy(bias, 1, cols).reshape({cols});
    kernels::bias_add(hy, hb);
    copy_back(y, hy);
  });
}

void bias_grad(int device, const float* dy, float* dbias, int64_t rows, int64_t cols, float beta) {
  launch(device, "bias_grad", {{dbias, floats(cols)}}, [=] {
    Tensor hdy = host_copy(dy, rows, cols), hdb = host_copy(dbias, 1, cols).reshape({cols});
    kernels::bias_grad(hdy, hdb, beta);
    copy_back(dbias, hdb);
  });
}

void relu_forward(int device, const float* x, float* y, int64_t n) {
  launch(device, "relu_forward", {{y, floats(n)}}, [=] {
    for (int64_t i = 0; i < n; ++i) y[i] = relu(x[i]);
  });
}
void relu_backward(int device, const float* x, const float* dy, float* dx, int64_t n) {
  launch(device, "relu_backward", {{dx, floats(n)}}, [=] {
    for (int64_t i = 0; i < n; ++i) dx[i] = relu_grad(x[i], dy[i]);
  });
}
void gelu_forward(int device, const float* x, float* y, int64_t n) {
  launch(device, "gelu_forward", {{y, floats(n)}}, [=] {
    for (int64_t i = 0; i < n; ++i) y[i] = gelu(x[i]);
  });
}
void gelu_backward(int device, const float* x, const float* dy, float* dx, int64_t n) {
  launch(device, "gelu_backward", {{dx, floats(n)}}, [=] {
    for (int64_t i = 0; i < n; ++i) dx[i] = gelu_grad(x[i], dy[i]);
  });
}

double softmax_cross_entropy(int device, const float* logits, const int64_t* labels, float* dlogits, int64_t rows,
                             int64_t cols, int64_t* first_bad_row) {
  devices().synchronize_default_stream(device);
  *first_bad_row = first_bad_label(labels, rows, cols);
  if (*first_bad_row >= 0) return 0.0;
  Tensor hl = host_copy(logits, rows, cols), hy = host_copy(labels, rows, 1, DType::i64).reshape({rows});
  Tensor hd = Tensor::empty({rows, cols});
  const float loss = kernels::softmax_cross_entropy(hl, hy, dlogits ? &hd : nullptr);
  if (dlogits) copy_back(dlogits, hd);
  return loss;
}

double mse(int device, const float* pred, const float* target, float* dpred, int64_t n) {
  devices().synchronize_default_stream(device);
  Tensor hp = host_copy(pred, 1, n).reshape({n}), ht = host_copy(target, 1, n).reshape({n}), hd = Tensor::empty({n});
  const float loss = kernels::mse(hp, ht, dpred ? &hd : nullptr);
  if (dpred) copy_back(dpred, hd);
  return loss;
}

int64_t count_correct(int device, const float* logits, const int64_t* labels, int64_t rows, int64_t cols,
                      int64_t* first_bad_row) {
  devices().synchronize_default_stream(device);
  *first_bad_row = first_bad_label(labels, rows, cols);
  if (*first_bad_row >= 0) return 0;
  return kernels::count_correct(host_copy(logits, rows, cols), host_copy(labels, rows, 1, DType::i64).reshape({rows}));
}

void sgd_step(int device, float* param, const float* grad, float* momentum_buffer, int64_t n, const SgdScalars& s) {
  std::vector<WrittenRange> writes{{param, floats(n)}};
  if (momentum_buffer) writes.push_back({momentum_buffer, floats(n)});
  launch(device, "sgd_step", std::move(writes), [=] {
    float unused = 0.f;
    for (int64_t i = 0; i < n; ++i) sgd_update(param[i], grad[i], momentum_buffer ? momentum_buffer[i] : unused, s);
  });
}

void adam_step(int device, float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
               const AdamScalars& s) {
  launch(device, "adam_step", {{param, floats(n)}, {exp_avg, floats(n)}, {exp_avg_sq, floats(n)}}, [=] {
    for (int64_t i = 0; i < n; ++i) adam_update(param[i], grad[i], exp_avg[i], exp_avg_sq[i], s);
  });
}

double sum_of_squares(int device, const float* x, int64_t n) {
  devices().synchronize_default_stream(device);
  return kernels::sum_of_squares(host_copy(x, 1, n).reshape({n}));
}

void fill(int device, float* x, int64_t n, float value) {
  launch(device, "fill", {{x, floats(n)}}, [=] {
    for (int64_t i = 0; i < n; ++i) x[i] = value;
  });
}
void scale(int device, float* x, int64_t n, float alpha) {
  launch(device, "scale", {{x, floats(n)}}, [=] {
    for (int64_t i = 0; i < n; ++i) x[i] = scale_element(alpha, x[i]);
  });
}
void axpy(int device, float alpha, const float* x, float* y, int64_t n) {
  launch(device, "axpy", {{y, floats(n)}}, [=] {
    for (int64_t i = 0; i < n; ++i) y[i] = axpy_element(alpha, x[i], y[i]);
  });
}

void convert(int device, const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n) {
  launch(device, "convert", {{dst, size_t(n) * dtype_size(dst_dtype)}}, [=] {
    Tensor hs = host_copy(src, 1, n, src_dtype).reshape({n}), hd = Tensor::empty({n}, dst_dtype);
    kernels::convert(hs, hd);
    copy_back(dst, hd);
  });
}

const cuda::Kernels kTable{gemm,         gemm_mixed,     bias_add,
                           bias_grad,    relu_forward,   relu_backward,
                           gelu_forward, gelu_backward,  softmax_cross_entropy,
                           mse,          count_correct,  sgd_step,
                           adam_step,    sum_of_squares, fill,
                           scale,        axpy,           convert};

// A program linked with the test-support library runs fake-device tensors through this table.
[[maybe_unused]] const bool g_registered = (set_stand_in_kernels(&kTable), true);

}  // namespace
}  // namespace tinyddp::kernels::fake
