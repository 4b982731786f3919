// train_bench: samples per second of one MLP training step (Linear-ReLU-Linear-ReLU-Linear, cross-entropy,
// Adam, cosine schedule), and in the same run the GEMM-only bound: the same layers' forward and backward
// GEMMs alone through the same BLAS, with nothing else. The ratio says how much the rest of the step
// (bias, activations, loss, optimizer, data loading) costs on top of the unavoidable matrix products.
//
//   build/bin/train_bench                           # 784-1024-1024-10, batch 256, 16384 samples, 2 epochs
//   build/bin/train_bench --in 10 --hidden 0 --out 2 --samples 1000 --batch 32 --epochs 10   # the seed job
//
// The PyTorch figure for the same job: ../shared/anchors/torch_ddp_train.py 1 784 1024 10 16384 256 2
// (bench/run_all.sh runs both in one command).
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>

#include "examples/dummy_dataset.h"
#include "kernels/ops.h"
#include "nn/activations.h"
#include "nn/adam.h"
#include "nn/data_loader.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/schedulers.h"
#include "nn/sequential.h"

using namespace tinyddp;
using Clock = std::chrono::steady_clock;

namespace {

// The same architecture as the anchor's model_for(): Linear(in, out) when hidden == 0.
std::unique_ptr<nn::Sequential> make_mlp(int64_t in, int64_t hidden, int64_t out, Generator& gen) {
  auto model = std::make_unique<nn::Sequential>();
  if (hidden == 0) {
    model->emplace<nn::Linear>(in, out, gen);
    return model;
  }
  model->emplace<nn::Linear>(in, hidden, gen);
  model->emplace<nn::ReLU>();
  model->emplace<nn::Linear>(hidden, hidden, gen);
  model->emplace<nn::ReLU>();
  model->emplace<nn::Linear>(hidden, out, gen);
  return model;
}

// Seconds for `steps` iterations of only the GEMMs of one training step: for each layer the forward
// y = x W^T, the weight gradient dW = dy^T x, and the input gradient dx = dy W for every layer but the
// first (nobody needs the gradient of the data; the training step skips it too).
double gemm_only_seconds(int64_t batch, const std::vector<int64_t>& widths, int64_t steps) {
  struct Layer {
    Tensor w, dw, x, y, dy, dx;
  };
  std::vector<Layer> layers;
  for (size_t l = 0; l + 1 < widths.size(); ++l) {
    Layer L;
    L.w = Tensor::zeros({widths[l + 1], widths[l]});
    L.dw = Tensor::zeros({widths[l + 1], widths[l]});
    L.x = Tensor::zeros({batch, widths[l]});
    L.y = Tensor::zeros({batch, widths[l + 1]});
    L.dy = Tensor::zeros({batch, widths[l + 1]});
    L.dx = Tensor::zeros({batch, widths[l]});
    Generator g(l);
    fill_uniform(L.w, -0.03f, 0.03f, g);
    fill_uniform(L.x, 0.f, 1.f, g);
    fill_uniform(L.dy, -1e-3f, 1e-3f, g);
    layers.push_back(L);
  }
  auto t0 = Clock::now();
  for (int64_t s = 0; s < steps; ++s) {
    for (auto& L : layers) kernels::gemm(L.x, false, L.w, true, L.y);
    for (size_t l = layers.size(); l-- > 0;) {
      auto& L = layers[l];
      kernels::gemm(L.dy, true, L.x, false, L.dw, 1.f, 1.f);
      if (l > 0) kernels::gemm(L.dy, false, L.w, false, L.dx);
    }
  }
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tinyddp train_bench: MLP training samples/s against the GEMM-only bound"};
  int64_t in = 784, hidden = 1024, out = 10, samples = 16384, batch = 256, epochs = 2;
  int threads = 1;
  app.add_option("--in", in)->capture_default_str();
  app.add_option("--hidden", hidden, "0 for a single Linear(in, out)")->capture_default_str();
  app.add_option("--out", out)->capture_default_str();
  app.add_option("--samples", samples)->capture_default_str();
  app.add_option("--batch", batch)->capture_default_str();
  app.add_option("--epochs", epochs)->capture_default_str();
  app.add_option("--threads", threads, "BLAS threads")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  try {
    kernels::set_cpu_threads(threads);
    auto dataset = examples::make_dummy_dataset(samples, in, 0);
    nn::DataLoader loader(dataset, {.batch_size = batch, .shuffle = true, .seed = 0});
    Generator init(1);
    auto model = make_mlp(in, hidden, out, init);
    nn::Adam optimizer(model->named_parameters(), 1e-3);
    nn::CosineAnnealing scheduler(optimizer, epochs * loader.size());
    nn::CrossEntropyLoss loss_fn;

    auto t0 = Clock::now();
    int64_t steps = 0, seen = 0;
    float last_loss = 0;
    for (int64_t e = 0; e < epochs; ++e) {
      loader.set_epoch(e);
      for (const nn::Batch& b : loader) {
        optimizer.zero_grad();
        last_loss = loss_fn.forward(model->forward(b.inputs), b.targets);
        model->backward(loss_fn.backward(), false);
        optimizer.step();
        scheduler.step();
        ++steps;
        seen += b.inputs.size(0);
      }
    }
    double train_s = std::chrono::duration<double>(Clock::now() - t0).count();

    std::vector<int64_t> widths = hidden ? std::vector<int64_t>{in, hidden, hidden, out} : std::vector<int64_t>{in, out};
    double gemm_s = gemm_only_seconds(batch, widths, steps);
    double train_rate = double(seen) / train_s, bound_rate = double(steps * batch) / gemm_s;
    std::printf("tinyddp train_bench model=%lld-%lld-%lld n=%lld batch=%lld epochs=%lld threads=%d\n", (long long)in,
                (long long)hidden, (long long)out, (long long)samples, (long long)batch, (long long)epochs, threads);
    std::printf("  training      : %.3f s  %8.0f samples/s  (%lld steps, last loss %.4f)\n", train_s, train_rate,
                (long long)steps, last_loss);
    std::printf("  GEMM-only     : %.3f s  %8.0f samples/s\n", gemm_s, bound_rate);
    std::printf("  training / GEMM-only bound = %.1f%%\n", 100.0 * train_rate / bound_rate);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
