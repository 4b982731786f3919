// Every kernel on cuda:0 against the CPU kernel on the same inputs (make test-gpu).
//
// The CPU kernels are checked against PyTorch in test/kernels; both sides call the same per-element
// functions (kernels/elementwise.h), so what is left to check here is the GPU's share: launch
// configurations and grid-stride loops that cover every element exactly once, warp reductions,
// the row-per-warp loss kernels, the deterministic sums, cuBLAS's row-major call and the error flag.
// Sizes are chosen to be odd and larger than one block or one warp. Differences come only from
// summation order and fused multiply-adds (nvcc contracts a*b+c, g++ for x86-64 does not), hence
// the small tolerances.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tinyddp/core/cuda_runtime.h"
#include "tinyddp/core/random.h"
#include "tinyddp/kernels/ops.h"
#include "test/gpu/gpu_test_support.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::testing;

// Without a device each test is skipped with a message saying why -- or fails, under make test-gpu
// (TINYDDP_REQUIRE_GPU=1): see gpu_available().
#define SKIP_WITHOUT_CUDA_DEVICE() \
  do {                             \
    if (!gpu_available()) return;  \
  } while (0)

namespace {

const Device kGpu = Device::cuda(0);

// A CPU tensor of uniform numbers in [lo, hi), the same for one seed.
Tensor random_cpu(const Shape& shape, float lo, float hi, uint64_t seed) {
  Generator gen(seed);
  Tensor t = Tensor::empty(shape);
  fill_uniform(t, lo, hi, gen);
  return t;
}

Tensor random_labels(int64_t rows, int64_t classes, uint64_t seed) {
  Generator gen(seed);
  std::vector<int64_t> labels(static_cast<size_t>(rows));
  for (auto& label : labels) label = int64_t(gen.next_below(uint64_t(classes)));
  return Tensor::from_vector(labels, {rows});
}

Tensor on_gpu(const Tensor& t) { return t.to(kGpu); }

}  // namespace

TEST_CASE("gpu gemm matches the CPU in all four transpose layouts, with alpha and beta") {
  SKIP_WITHOUT_CUDA_DEVICE();
  struct Size {
    int64_t m, n, k;
  };
  for (Size s : {Size{37, 19, 23}, Size{301, 129, 517}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        CAPTURE(s.m);
        CAPTURE(ta);
        CAPTURE(tb);
        Tensor a = random_cpu(ta ? Shape{s.k, s.m} : Shape{s.m, s.k}, -1, 1, 1);
        Tensor b = random_cpu(tb ? Shape{s.n, s.k} : Shape{s.k, s.n}, -1, 1, 2);
        Tensor c_cpu = random_cpu({s.m, s.n}, -1, 1, 3);
        Tensor c_gpu = on_gpu(c_cpu);
        kernels::gemm(a, ta, b, tb, c_cpu, 0.7f, -0.3f);
        kernels::gemm(on_gpu(a), ta, on_gpu(b), tb, c_gpu, 0.7f, -0.3f);
        check_close(c_gpu.to(Device::cpu()), c_cpu, 1e-4, 1e-4, "gpu gemm");
      }
    }
  }
}

TEST_CASE("gpu gemm writes into a view of a larger buffer and nowhere else") {
  SKIP_WITHOUT_CUDA_DEVICE();
  Tensor a = random_cpu({37, 23}, -1, 1, 4), b = random_cpu({23, 19}, -1, 1, 5);
  Tensor buffer = Tensor::zeros({41, 19}, DType::f32, kGpu);
  kernels::fill(buffer, 7.f);
  Tensor c = buffer.slice_rows(2, 39);
  kernels::gemm(on_gpu(a), false, on_gpu(b), false, c);
  Tensor expected = Tensor::empty({37, 19});
  kernels::gemm(a, false, b, false, expected);
  check_close(c.to(Device::cpu()), expected, 1e-5, 1e-5, "gemm into a view");
  std::vector<float> all = buffer.to_vector<float>();
  CHECK(all[0] == 7.f);
  CHECK(all[2 * 19 - 1] == 7.f);
  CHECK(all[39 * 19] == 7.f);
  CHECK(all.back() == 7.f);
}

TEST_CASE("gpu bias_add and bias_grad (beta 0 and 1) match the CPU") {
  SKIP_WITHOUT_CUDA_DEVICE();
  const int64_t rows = 77, cols = 1003;  // cols is not a multiple of the 32 columns a block owns
  Tensor y = random_cpu({rows, cols}, -2, 2, 6), bias = random_cpu({cols}, -1, 1, 7);
  Tensor y_gpu = on_gpu(y);
  kernels::bias_add(y, bias);
  kernels::bias_add(y_gpu, on_gpu(bias));
  check_close(y_gpu.to(Device::cpu()), y, 0, 0, "bias_add");

  for (float beta : {0.f, 1.f}) {
    CAPTURE(beta);
    Tensor dbias = random_cpu({cols}, -1, 1, 8);
    Tensor dbias_gpu = on_gpu(dbias);
    kernels::bias_grad(y, dbias, beta);
    kernels::bias_grad(y_gpu, dbias_gpu, beta);
    check_close(dbias_gpu.to(Device::cpu()), dbias, 1e-5, 1e-5, "bias_grad");
  }
}

TEST_CASE("gpu activations match the CPU, forward and backward, in place too") {
  SKIP_WITHOUT_CUDA_DEVICE();
  const int64_t n = 100003;  // several blocks and a ragged tail
  Tensor x = random_cpu({n}, -8, 8, 9), dy = random_cpu({n}, -1, 1, 10);
  float* p = x.data<float>();
  p[0] = 0.f;
  p[1] = -0.f;
  p[2] = 1e-7f;
  p[3] = -30.f;
  p[4] = 30.f;
  Tensor x_gpu = on_gpu(x), dy_gpu = on_gpu(dy);
  for (const char* which : {"relu", "gelu"}) {
    CAPTURE(which);
    const bool relu = std::string(which) == "relu";
    Tensor y = Tensor::empty({n}), y_gpu = Tensor::empty({n}, DType::f32, kGpu);
    Tensor dx = Tensor::empty({n}), dx_gpu = Tensor::empty({n}, DType::f32, kGpu);
    if (relu) {
      kernels::relu_forward(x, y);
      kernels::relu_forward(x_gpu, y_gpu);
      kernels::relu_backward(x, dy, dx);
      kernels::relu_backward(x_gpu, dy_gpu, dx_gpu);
    } else {
      kernels::gelu_forward(x, y);
      kernels::gelu_forward(x_gpu, y_gpu);
      kernels::gelu_backward(x, dy, dx);
      kernels::gelu_backward(x_gpu, dy_gpu, dx_gpu);
    }
    // CUDA's expf/erff differ from glibc's in the last bits (a few ulp).
    check_close(y_gpu.to(Device::cpu()), y, 1e-6, 1e-5, std::string(which) + " forward");
    check_close(dx_gpu.to(Device::cpu()), dx, 1e-6, 1e-5, std::string(which) + " backward");
  }
  Tensor in_place = x_gpu.clone();
  kernels::gelu_forward(in_place, in_place);
  Tensor y = Tensor::empty({n});
  kernels::gelu_forward(x, y);
  check_close(in_place.to(Device::cpu()), y, 1e-6, 1e-5, "gelu in place");
}

TEST_CASE("gpu softmax_cross_entropy matches the CPU: narrow and wide rows, large logits") {
  SKIP_WITHOUT_CUDA_DEVICE();
  struct Case {
    int64_t rows, classes;
    float range;
  };
  // 10 classes: most lanes of a warp idle; 1000 classes: 32 columns per lane; +-60: exp would overflow.
  for (Case c : {Case{1001, 10, 5.f}, Case{33, 1000, 3.f}, Case{65, 7, 60.f}}) {
    CAPTURE(c.rows);
    CAPTURE(c.classes);
    Tensor logits = random_cpu({c.rows, c.classes}, -c.range, c.range, 11);
    Tensor labels = random_labels(c.rows, c.classes, 12);
    Tensor d = Tensor::empty(logits.shape()), d_gpu = Tensor::empty(logits.shape(), DType::f32, kGpu);
    const float loss = kernels::softmax_cross_entropy(logits, labels, &d);
    const Tensor logits_gpu = on_gpu(logits), labels_gpu = on_gpu(labels);
    const float loss_gpu = kernels::softmax_cross_entropy(logits_gpu, labels_gpu, &d_gpu);
    check_close({loss_gpu}, {loss}, 1e-6, 1e-5, "loss");
    check_close(d_gpu.to(Device::cpu()), d, 1e-8, 1e-4, "dlogits");
    // No gradient buffer: the same loss, and bit-identical on a second run (deterministic sums).
    const float again = kernels::softmax_cross_entropy(logits_gpu, labels_gpu, nullptr);
    CHECK(again == loss_gpu);
  }
}

TEST_CASE("gpu cross-entropy and count_correct report a bad label like the CPU") {
  SKIP_WITHOUT_CUDA_DEVICE();
  Tensor logits = Tensor::zeros({300, 5}, DType::f32, kGpu);
  std::vector<int64_t> labels(300, 1);
  labels[123] = 5;  // the first bad row
  labels[250] = -2;
  Tensor labels_gpu = on_gpu(Tensor::from_vector(labels));
  CHECK_THROWS_WITH_AS(kernels::softmax_cross_entropy(logits, labels_gpu, nullptr),
                       doctest::Contains("labels[123] = 5 is not a class index in [0, 5)"), Error);
  CHECK_THROWS_WITH_AS(kernels::count_correct(logits, labels_gpu), doctest::Contains("labels[123] = 5"), Error);
  // The device is still usable afterwards: the flag is a value, not a trap.
  std::vector<int64_t> good(300, 0);
  CHECK(kernels::count_correct(logits, on_gpu(Tensor::from_vector(good))) == 300);
}

TEST_CASE("gpu count_correct matches the CPU, ties included") {
  SKIP_WITHOUT_CUDA_DEVICE();
  for (int64_t classes : {int64_t(3), int64_t(70)}) {
    CAPTURE(classes);
    // Logits from {0, 1, 2} only: most rows have several equal maxima, and argmax must pick the first.
    Tensor logits = random_cpu({2001, classes}, 0, 3, 13);
    float* p = logits.data<float>();
    for (int64_t i = 0; i < logits.numel(); ++i) p[i] = std::floor(p[i]);
    Tensor labels = random_labels(2001, classes, 14);
    // Half the labels are set to the CPU's own argmax, so the count is large and ties matter.
    int64_t* l = labels.data<int64_t>();
    for (int64_t r = 0; r < 2001; r += 2) {
      int64_t best = 0;
      for (int64_t j = 1; j < classes; ++j)
        if (p[r * classes + j] > p[r * classes + best]) best = j;
      l[r] = best;
    }
    const int64_t expected = kernels::count_correct(logits, labels);
    CHECK(expected >= 1001);
    CHECK(kernels::count_correct(on_gpu(logits), on_gpu(labels)) == expected);
  }
}

TEST_CASE("gpu mse and sum_of_squares match the CPU") {
  SKIP_WITHOUT_CUDA_DEVICE();
  const int64_t n = (1 << 20) + 7;  // more elements than the 4096 x 256 threads of one grid pass
  Tensor pred = random_cpu({n}, -3, 3, 15), target = random_cpu({n}, -3, 3, 16);
  Tensor d = Tensor::empty({n}), d_gpu = Tensor::empty({n}, DType::f32, kGpu);
  const float loss = kernels::mse(pred, target, &d);
  const float loss_gpu = kernels::mse(on_gpu(pred), on_gpu(target), &d_gpu);
  check_close({loss_gpu}, {loss}, 0, 1e-6, "mse");
  check_close(d_gpu.to(Device::cpu()), d, 0, 1e-6, "dpred");
  CHECK(kernels::mse(on_gpu(pred), on_gpu(target), nullptr) == loss_gpu);

  const double sum = kernels::sum_of_squares(pred);
  const double sum_gpu = kernels::sum_of_squares(on_gpu(pred));
  // Different summation orders in double: ~1e-13 apart; one missing element would be ~1e-6.
  CHECK(std::fabs(sum_gpu - sum) <= 1e-9 * sum);
}

TEST_CASE("gpu fill, scale and axpy match the CPU") {
  SKIP_WITHOUT_CUDA_DEVICE();
  const int64_t n = 70001;
  Tensor x = random_cpu({n}, -2, 2, 17), y = random_cpu({n}, -2, 2, 18);
  Tensor x_gpu = on_gpu(x), y_gpu = on_gpu(y);
  kernels::axpy(-0.37f, x, y);
  kernels::axpy(-0.37f, x_gpu, y_gpu);
  check_close(y_gpu.to(Device::cpu()), y, 1e-6, 1e-6, "axpy");
  kernels::scale(x, 1.7f);
  kernels::scale(x_gpu, 1.7f);
  check_close(x_gpu.to(Device::cpu()), x, 0, 0, "scale");
  kernels::fill(x_gpu, 0.25f);
  check_close(x_gpu.to_vector<float>(), std::vector<float>(size_t(n), 0.25f), 0, 0, "fill");
}

TEST_CASE("gpu SGD and Adam/AdamW steps match the CPU over several steps") {
  SKIP_WITHOUT_CUDA_DEVICE();
  const int64_t n = 50021;
  const Tensor start = random_cpu({n}, -1, 1, 19);
  constexpr int kSteps = 3;
  std::vector<Tensor> grads;
  for (int s = 0; s < kSteps; ++s) grads.push_back(random_cpu({n}, -1, 1, uint64_t(20 + s)));

  struct SgdCase {
    float momentum, dampening, weight_decay;
    bool nesterov;
  };
  for (SgdCase c :
       {SgdCase{0.f, 0.f, 0.01f, false}, SgdCase{0.9f, 0.1f, 0.01f, false}, SgdCase{0.9f, 0.f, 0.f, true}}) {
    CAPTURE(c.momentum);
    CAPTURE(c.nesterov);
    kernels::SgdConfig config;
    config.lr = 0.1f;
    config.momentum = c.momentum;
    config.dampening = c.dampening;
    config.weight_decay = c.weight_decay;
    config.nesterov = c.nesterov;
    Tensor p = start.clone(), p_gpu = on_gpu(start);
    Tensor buf = c.momentum != 0.f ? Tensor::empty({n}) : Tensor();
    Tensor buf_gpu = c.momentum != 0.f ? Tensor::empty({n}, DType::f32, kGpu) : Tensor();
    for (int s = 0; s < kSteps; ++s) {
      kernels::sgd_step(p, grads[size_t(s)], buf, config, s == 0);
      kernels::sgd_step(p_gpu, on_gpu(grads[size_t(s)]), buf_gpu, config, s == 0);
    }
    check_close(p_gpu.to(Device::cpu()), p, 1e-6, 1e-5, "sgd param");
    if (buf.defined()) check_close(buf_gpu.to(Device::cpu()), buf, 1e-6, 1e-5, "sgd momentum buffer");
  }

  for (bool decoupled : {false, true}) {
    for (float weight_decay : {0.f, 0.01f}) {
      CAPTURE(decoupled);
      CAPTURE(weight_decay);
      kernels::AdamConfig config;
      config.lr = 0.01f;
      config.weight_decay = weight_decay;
      config.decoupled_weight_decay = decoupled;
      Tensor p = start.clone(), m = Tensor::zeros({n}), v = Tensor::zeros({n});
      Tensor p_gpu = on_gpu(start), m_gpu = Tensor::zeros({n}, DType::f32, kGpu),
             v_gpu = Tensor::zeros({n}, DType::f32, kGpu);
      for (int s = 0; s < kSteps; ++s) {
        kernels::adam_step(p, grads[size_t(s)], m, v, config, s + 1);
        kernels::adam_step(p_gpu, on_gpu(grads[size_t(s)]), m_gpu, v_gpu, config, s + 1);
      }
      check_close(p_gpu.to(Device::cpu()), p, 1e-6, 1e-5, "adam param");
      check_close(m_gpu.to(Device::cpu()), m, 1e-7, 1e-5, "adam exp_avg");
      check_close(v_gpu.to(Device::cpu()), v, 1e-9, 1e-5, "adam exp_avg_sq");
    }
  }
}

TEST_CASE("gpu kernels refuse arguments on different devices") {
  SKIP_WITHOUT_CUDA_DEVICE();
  Tensor cpu = Tensor::zeros({2, 2}), gpu = Tensor::zeros({2, 2}, DType::f32, kGpu);
  CHECK_THROWS_WITH_AS(kernels::axpy(1.f, cpu, gpu), doctest::Contains("argument `y` is on cuda:0 but `x` is on cpu"),
                       Error);
  CHECK_THROWS_WITH_AS(kernels::gemm(gpu, false, cpu, false, gpu), doctest::Contains("argument `b` is on cpu"), Error);
}

TEST_CASE("gpu kernels run on every visible device") {
  SKIP_WITHOUT_CUDA_DEVICE();
  Tensor a = random_cpu({33, 17}, -1, 1, 30), b = random_cpu({17, 9}, -1, 1, 31);
  Tensor expected = Tensor::empty({33, 9});
  kernels::gemm(a, false, b, false, expected);
  Tensor labels = random_labels(33, 9, 32);
  const float loss = kernels::softmax_cross_entropy(expected, labels, nullptr);
  for (int device = 0; device < cuda_device_count(); ++device) {
    CAPTURE(device);
    const Device dev = Device::cuda(device);
    Tensor c = Tensor::empty({33, 9}, DType::f32, dev);
    kernels::gemm(a.to(dev), false, b.to(dev), false, c);
    check_close(c.to(Device::cpu()), expected, 1e-5, 1e-5, "gemm");
    check_close({kernels::softmax_cross_entropy(c, labels.to(dev), nullptr)}, {loss}, 1e-5, 1e-5, "loss");
  }
}

TEST_CASE("a GPU is there to test on (under make test-gpu, a machine without one fails here, saying why)") {
  if (!gpu_available()) return;
  MESSAGE("testing on " << cuda_device_count() << " CUDA device(s), " << cuda_api().describe());
  CHECK(cuda_device_count() > 0);
}

TEST_CASE("gpu fill_uniform draws the CPU's numbers, on every device") {
  SKIP_WITHOUT_CUDA_DEVICE();
  Tensor expected = Tensor::empty({4099});
  Generator cpu_gen(77);
  fill_uniform(expected, -2.f, 3.f, cpu_gen);
  for (int device = 0; device < cuda_device_count(); ++device) {
    CAPTURE(device);
    // The kernel must run on the tensor's device whatever the thread's current device is.
    cuda_set_device(0);
    Tensor t = Tensor::empty({4099}, DType::f32, Device::cuda(device));
    Generator gen(77);
    fill_uniform(t, -2.f, 3.f, gen);
    CHECK(t.to_vector<float>() == expected.to_vector<float>());  // the same Philox arithmetic, bit for bit
  }
}

TEST_CASE("gpu an out-of-memory allocation does not poison the next kernel launch") {
  SKIP_WITHOUT_CUDA_DEVICE();
  // Far more than any GPU has: cudaMalloc fails, the caching allocator releases and retries, and throws.
  CHECK_THROWS_WITH_AS(Tensor::empty({int64_t(1) << 40}, DType::f32, kGpu),
                       doctest::Contains("out of memory on cuda:0"), Error);
  // cudaMalloc's failure must not be left as the thread's last error, or this launch check reports it.
  Tensor x = Tensor::zeros({1000}, DType::f32, kGpu);
  kernels::fill(x, 2.f);
  CHECK(x.to_vector<float>() == std::vector<float>(1000, 2.f));
}

TEST_CASE("gpu convert f32 <-> bf16 and f32 <-> f16 gives the CPU's bits") {
  if (!gpu_available()) return;
  std::vector<float> values(100'003);
  for (size_t i = 0; i < values.size(); ++i) values[i] = float(std::sin(double(i))) * std::ldexp(1.f, int(i % 40) - 20);
  values[0] = 1e30f;  // past f16's range: infinity
  const Tensor f = Tensor::from_vector(values);
  const Device gpu = Device::cuda(0);
  for (DType half : {DType::bf16, DType::f16}) {
    Tensor narrow = Tensor::empty({100'003}, half, gpu), wide = Tensor::empty({100'003}, DType::f32, gpu);
    kernels::convert(f.to(gpu), narrow);
    CHECK(bitwise_equal(narrow, f.to(half)));
    kernels::convert(narrow, wide);
    CHECK(bitwise_equal(wide, f.to(half).to(DType::f32)));
  }
}
