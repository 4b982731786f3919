// SGD and Adam/AdamW over five steps with a different gradient each step, against torch.optim:
// the whole parameter trajectory and the final optimizer state must agree.
#include <doctest/doctest.h>

#include "tinyddp/kernels/ops.h"
#include "kernel_fixtures.h"

using namespace tinyddp;
using namespace tinyddp::testing;

namespace {
constexpr int64_t kSteps = 5;
}

TEST_CASE("sgd_step follows torch.optim.SGD: weight decay, momentum, dampening, nesterov") {
  SafetensorsFile f = kernel_fixture("sgd");
  const Tensor& grads = f.get("grads");  // [steps, 6, 5]
  for (const char* name : {"plain_wd", "momentum", "dampening_wd", "nesterov_wd"}) {
    CAPTURE(name);
    const std::string c = name;
    const Tensor& config = f.get(c + ".config");  // lr, momentum, dampening, weight_decay, nesterov
    kernels::SgdConfig sgd;
    sgd.lr = config.item<float>(0);
    sgd.momentum = config.item<float>(1);
    sgd.dampening = config.item<float>(2);
    sgd.weight_decay = config.item<float>(3);
    sgd.nesterov = config.item<float>(4) != 0.f;
    Tensor param = f.get("param").clone();
    Tensor buffer = sgd.momentum != 0.f ? Tensor::empty(param.shape()) : Tensor();  // the first step fills it
    const Tensor& trajectory = f.get(c + ".params");
    for (int64_t step = 0; step < kSteps; ++step) {
      CAPTURE(step);
      kernels::sgd_step(param, grads.view(step * 30, {6, 5}), buffer, sgd, step == 0);
      check_close(param, trajectory.view(step * 30, {6, 5}), 1e-6, 1e-5, c + " param");
    }
    if (f.has(c + ".momentum_buffer")) check_close(buffer, f.get(c + ".momentum_buffer"), 1e-6, 1e-5, c + " buffer");
  }
}

TEST_CASE("adam_step follows torch.optim.Adam and AdamW, with and without weight decay") {
  SafetensorsFile f = kernel_fixture("adam");
  const Tensor& grads = f.get("grads");
  for (const char* name : {"adam", "adam_wd", "adamw", "adamw_wd", "adamw_betas"}) {
    CAPTURE(name);
    const std::string c = name;
    // lr, beta1, beta2, eps, weight_decay, decoupled: f64, the Python floats PyTorch was given
    const Tensor& config = f.get(c + ".config");
    REQUIRE(config.dtype() == DType::f64);
    kernels::AdamConfig adam;
    adam.lr = config.item<double>(0);
    adam.beta1 = config.item<double>(1);
    adam.beta2 = config.item<double>(2);
    adam.eps = config.item<double>(3);
    adam.weight_decay = config.item<double>(4);
    adam.decoupled_weight_decay = config.item<double>(5) != 0.0;
    Tensor param = f.get("param").clone();
    Tensor exp_avg = Tensor::zeros(param.shape()), exp_avg_sq = Tensor::zeros(param.shape());
    const Tensor& trajectory = f.get(c + ".params");
    for (int64_t step = 0; step < kSteps; ++step) {
      CAPTURE(step);
      kernels::adam_step(param, grads.view(step * 30, {6, 5}), exp_avg, exp_avg_sq, adam, step + 1);
      check_close(param, trajectory.view(step * 30, {6, 5}), 1e-6, 1e-5, c + " param");
    }
    check_close(exp_avg, f.get(c + ".exp_avg"), 1e-7, 1e-5, c + " exp_avg");
    check_close(exp_avg_sq, f.get(c + ".exp_avg_sq"), 1e-7, 1e-5, c + " exp_avg_sq");
  }
}

TEST_CASE("the first Adam step moves every parameter by about lr, whatever the gradient's scale") {
  // Closed form: after one step m = (1-b1) g, v = (1-b2) g^2, so m_hat / sqrt(v_hat) = sign(g) and
  // p moves by lr * |g| / (|g| + eps) ~= lr against the gradient.
  Tensor param = Tensor::zeros({4});
  Tensor grad = Tensor::from_vector<float>({1e-3f, -2.f, 500.f, -7e4f});
  Tensor m = Tensor::zeros({4}), v = Tensor::zeros({4});
  kernels::AdamConfig adam;
  adam.lr = 0.1f;
  kernels::adam_step(param, grad, m, v, adam, 1);
  check_close(param.to_vector<float>(), {-0.1f, 0.1f, -0.1f, 0.1f}, 1e-6, 1e-5, "first Adam step");
}

TEST_CASE("Adam's 1 - beta factors are computed in double and then rounded, as PyTorch hands them to its kernel") {
  // PyTorch: exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1), the alpha a Python float (double) rounded
  // to f32 by the kernel. From zero state, after one step exp_avg = f32(1 - 0.9) * g exactly and
  // exp_avg_sq = f32(1 - 0.999) * g * g. In f32 arithmetic 1.f - 0.9f is 0.100000024f, not f32(0.1).
  const float one_minus_beta1 = float(1.0 - 0.9), one_minus_beta2 = float(1.0 - 0.999);
  REQUIRE(one_minus_beta1 != 1.f - 0.9f);  // otherwise this test could not tell the two apart
  const std::vector<float> g = {0.37f, -1.25f, 3.5f};
  Tensor param = Tensor::zeros({3}), grad = Tensor::from_vector<float>(g);
  Tensor m = Tensor::zeros({3}), v = Tensor::zeros({3});
  kernels::AdamConfig adam;  // PyTorch's defaults: betas (0.9, 0.999)
  kernels::adam_step(param, grad, m, v, adam, 1);
  for (size_t i = 0; i < g.size(); ++i) {
    CHECK(m.item<float>(int64_t(i)) == one_minus_beta1 * g[i]);
    CHECK(v.item<float>(int64_t(i)) == one_minus_beta2 * g[i] * g[i]);
  }
}

TEST_CASE("optimizer steps refuse bad state and bad hyper-parameters") {
  Tensor param = Tensor::zeros({3}), grad = Tensor::zeros({3}), state = Tensor::zeros({3});
  Tensor short_state = Tensor::zeros({2}), undefined;
  kernels::SgdConfig sgd;
  sgd.momentum = 0.9f;
  CHECK_THROWS_WITH_AS(kernels::sgd_step(param, grad, undefined, sgd, true),
                       doctest::Contains("argument `momentum_buffer` is an undefined tensor"), Error);
  sgd.nesterov = true;
  sgd.dampening = 0.1f;
  CHECK_THROWS_WITH_AS(kernels::sgd_step(param, grad, state, sgd, true), doctest::Contains("nesterov momentum needs"),
                       Error);
  kernels::SgdConfig no_momentum;  // momentum 0: no buffer needed
  kernels::sgd_step(param, grad, undefined, no_momentum, true);

  kernels::AdamConfig adam;
  CHECK_THROWS_WITH_AS(kernels::adam_step(param, grad, state, short_state, adam, 1),
                       doctest::Contains("argument `exp_avg_sq` is f32[2]"), Error);
  CHECK_THROWS_WITH_AS(kernels::adam_step(param, grad, state, state, adam, 0), doctest::Contains("steps count from 1"),
                       Error);
  adam.beta2 = 1.f;
  CHECK_THROWS_WITH_AS(kernels::adam_step(param, grad, state, state, adam, 1),
                       doctest::Contains("must both lie in [0, 1)"), Error);
}
