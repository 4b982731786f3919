// Where a training step's time goes, fp32 beside a mixed precision: each layer's forward and
// backward timed on its own, in rounds that alternate the two precisions (so a neighbour's load on a
// shared host falls on both alike), medians over the rounds. Also the bytes each layer keeps for
// backward, and (bf16) the rounding passes alone beside the forms they replaced.
//
//   build/bin/precision_passes                         # 784-1024-1024-10, batch 256, fp32 vs bf16
//   build/bin/precision_passes --precision fp16 --rounds 50
//
// The MLP is train_bench's (Linear, ReLU, Linear, ReLU, Linear) with its cross-entropy loss; the
// optimizer step is left out (it is the same in every precision: the master weights are f32).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "tinyddp/core/command_line.h"
#include "tinyddp/core/half_convert.h"
#include "tinyddp/kernels/cpu_gemm.h"
#include "tinyddp/kernels/ops.h"
#include "tinyddp/nn/activations.h"
#include "tinyddp/nn/linear.h"
#include "tinyddp/nn/loss.h"
#include "tinyddp/nn/precision/precision.h"
#include "tinyddp/nn/sequential.h"
#include "examples/example_cli.h"

using namespace tinyddp;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// One step, each pass timed: "<index> <layer> fwd|bwd" -> seconds, plus "loss" and "step".
std::map<std::string, double> timed_step(nn::Sequential& model, nn::CrossEntropyLoss& loss_fn, const Tensor& x,
                                         const Tensor& labels, nn::Precision precision) {
  std::map<std::string, double> t;
  const auto step0 = Clock::now();
  std::vector<Tensor> activations{x};
  {
    nn::PrecisionScope scope(precision);
    for (size_t i = 0; i < model.size(); ++i) {
      const auto t0 = Clock::now();
      activations.push_back(model[i].forward(activations.back()));
      t[std::to_string(i) + " " + model[i].describe().substr(0, model[i].describe().find('(')) + " fwd"] =
          seconds_since(t0);
    }
    const auto t0 = Clock::now();
    loss_fn.forward(activations.back(), labels);
    t["loss"] = seconds_since(t0);
  }
  Tensor grad = loss_fn.backward();
  for (size_t i = model.size(); i-- > 0;) {
    const auto t0 = Clock::now();
    grad = model[i].backward(grad, i > 0);
    t[std::to_string(i) + " " + model[i].describe().substr(0, model[i].describe().find('(')) + " bwd"] = seconds_since(
        t0);
  }
  t["step"] = seconds_since(step0);
  return t;
}

// The rounding passes alone, on one hidden layer's shapes (weight [hidden, hidden], activations and dy
// [batch, hidden]), each beside what it replaced, alternating, medians: bf16 only.
void time_rounding_passes(int64_t batch, int64_t hidden, int64_t rounds) {
  Generator gen(2);
  Tensor w = Tensor::empty({hidden, hidden}), x = Tensor::empty({batch, hidden}), dy = Tensor::empty({batch, hidden});
  fill_uniform(w, -1.f, 1.f, gen);
  fill_uniform(x, 0.f, 1.f, gen);
  fill_uniform(dy, -1e-3f, 1e-3f, gen);
  Tensor w_rounded = Tensor::empty(w.shape()), x_rounded = Tensor::empty(x.shape()),
         dy_rounded = Tensor::empty(dy.shape());
  Tensor x_narrow = Tensor::empty(x.shape(), DType::bf16), db = Tensor::empty({hidden});
  std::vector<bfloat16> block(1024);
  // round_to as it was: through core/half_convert.h's array conversions, a bf16 block between them.
  auto through_half_convert = [&](const Tensor& src, Tensor& dst) {
    const float* in = src.data<float>();
    float* out = dst.data<float>();
    for (size_t begin = 0, n = size_t(src.numel()); begin < n; begin += block.size()) {
      const size_t count = std::min(block.size(), n - begin);
      round_from_f32(in + begin, block.data(), count);
      widen_to_f32(block.data(), out + begin, count);
    }
  };
  struct Pass {
    const char* name;
    std::function<void()> run;
    std::vector<double> seconds{};
  };
  std::vector<Pass> passes = {
      {"W: two conversions through a bf16 block", [&] { through_half_convert(w, w_rounded); }},
      {"W: round_to, f32 to f32", [&] { kernels::round_to(w, DType::bf16, w_rounded); }},
      {"x: round_to, kept f32", [&] { kernels::round_to(x, DType::bf16, x_rounded); }},
      {"x: round_to_both, kept bf16", [&] { kernels::round_to_both(x, DType::bf16, x_narrow, x_rounded); }},
      {"x: widen the kept bf16 (backward)", [&] { kernels::convert(x_narrow, x_rounded); }},
      {"dy: bias_grad, then round_to",
       [&] {
         kernels::bias_grad(dy, db, 0.f);
         kernels::round_to(dy, DType::bf16, dy_rounded);
       }},
      {"dy: bias_grad_and_round", [&] { kernels::bias_grad_and_round(dy, db, 0.f, DType::bf16, dy_rounded); }},
  };
  for (int64_t r = 0; r < rounds + 2; ++r)
    for (Pass& pass : passes) {
      const auto t0 = Clock::now();
      pass.run();
      if (r >= 2) pass.seconds.push_back(seconds_since(t0));
    }
  std::printf("  rounding passes, bf16, W [%lld, %lld], x and dy [%lld, %lld]: median us\n", (long long)hidden,
              (long long)hidden, (long long)batch, (long long)hidden);
  for (Pass& pass : passes) std::printf("    %-36s %10.1f\n", pass.name, median(pass.seconds) * 1e6);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tinyddp precision_passes: each layer's forward and backward, fp32 beside a mixed precision",
               "precision_passes"};
  int64_t in = 784, hidden = 1024, out = 10, batch = 256, rounds = 30;
  std::string precision_text = "bf16";
  app.add_option("--in", in, "input features")->check(command_line::at_least<int64_t>(1))->capture_default_str();
  app.add_option("--hidden", hidden, "width of both hidden layers")
      ->check(command_line::at_least<int64_t>(1))
      ->capture_default_str();
  app.add_option("--out", out, "classes")->check(command_line::at_least<int64_t>(2))->capture_default_str();
  app.add_option("--batch-size", batch, "samples per step")
      ->check(command_line::at_least<int64_t>(1))
      ->capture_default_str();
  app.add_option("--rounds", rounds, "steps timed per precision (alternating)")
      ->check(command_line::at_least<int64_t>(1))
      ->capture_default_str();
  app.add_option("--precision", precision_text, "the mixed precision set beside fp32: bf16 or fp16")
      ->check(examples::precision_choice())
      ->capture_default_str();
  if (auto code = command_line::parse(app, argc, argv)) return *code;
  try {
    kernels::set_cpu_threads(1);
    const nn::Precision mixed = nn::parse_precision(precision_text, "--precision");
    Generator gen(1);
    nn::Sequential model;
    model.emplace<nn::Linear>(in, hidden, gen);
    model.emplace<nn::ReLU>();
    model.emplace<nn::Linear>(hidden, hidden, gen);
    model.emplace<nn::ReLU>();
    model.emplace<nn::Linear>(hidden, out, gen);
    nn::CrossEntropyLoss loss_fn;
    Tensor x = Tensor::empty({batch, in}), labels = Tensor::empty({batch}, DType::i64);
    fill_uniform(x, 0.f, 1.f, gen);
    for (int64_t i = 0; i < batch; ++i) labels.data<int64_t>()[i] = i % out;

    const std::vector<nn::Precision> precisions{nn::Precision::fp32, mixed};
    std::map<std::string, std::vector<double>> samples[2];
    size_t saved_bytes[2] = {0, 0};
    for (int64_t r = 0; r < rounds + 2; ++r)
      for (size_t p = 0; p < 2; ++p) {
        auto t = timed_step(model, loss_fn, x, labels, precisions[p]);
        if (r < 2) continue;  // warm-up: first touches of the buffers, the GEMM libraries' set-up
        for (auto& [name, seconds] : t) samples[p][name].push_back(seconds);
        saved_bytes[p] = model.saved_activation_bytes();
      }
    std::printf("tinyddp precision_passes model=%lld-%lld-%lld-%lld batch=%lld rounds=%lld\n", (long long)in,
                (long long)hidden, (long long)hidden, (long long)out, (long long)batch, (long long)rounds);
    std::printf("  CPU GEMM  : %s\n", kernels::cpu_gemm_description().c_str());
    std::printf("  precision : %s\n", nn::precision_units(mixed, Device::cpu()).c_str());
    std::printf("  %-16s %12s %12s %10s\n", "median ms", "fp32", nn::precision_name(mixed), "ratio");
    for (auto& [name, values] : samples[0]) {
      const double a = median(values) * 1e3, b = median(samples[1][name]) * 1e3;
      std::printf("  %-16s %12.3f %12.3f %9.2fx\n", name.c_str(), a, b, b / a);
    }
    std::printf("  %-16s %12zu %12zu %9.2fx\n", "saved bytes", saved_bytes[0], saved_bytes[1],
                double(saved_bytes[1]) / double(saved_bytes[0]));
    if (mixed == nn::Precision::bf16) time_rounding_passes(batch, hidden, rounds);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "precision_passes: %s\n", e.what());
    return 1;
  }
}
