// train_bench: samples per second of one MLP training step (Linear-ReLU-Linear-ReLU-Linear, cross-entropy,
// Adam, cosine schedule), and in the same run the GEMM-only bound: the same layers' forward and backward
// GEMMs alone through the same GEMM library (kernels::gemm, which picks oneDNN or OpenBLAS for this
// CPU: kernels/cpu_gemm.h; --cpu-gemm overrides the choice for both), with nothing else. The ratio says
// how much the rest of the step (bias, activations, loss, optimizer, data loading) costs on top of the
// unavoidable matrix products.
// It is given three ways: from the two phases' total times, from their median steps, and from
// --interleaved steps taken in turns with GEMM-only steps (the one that a shared machine's load
// disturbs least: both sides of each pair see the same neighbours).
//
// With --world-size W > 1 it then trains the same model data-parallel on W CPU workers (the Trainer with
// its MultiDevice add-on: W processes, DistributedDataParallel, batch --batch-size per rank), and prints the
// global samples/s and the scaling efficiency: W-rank samples/s / (W x one rank's samples/s), one rank
// being the same Trainer without DDP taking as many steps as each of the W ranks. The two parts run in
// turns --scaling-rounds times (3), and the pair with the median efficiency is reported.
// --torch-anchor runs PyTorch on the same job in the same run, in one process right after ours and
// with DDP after our data-parallel part, and prints the ratios.
//
//   build/bin/train_bench                           # 784-1024-1024-10, batch 256, 16384 samples, 2 epochs
//   build/bin/train_bench --in 10 --hidden 0 --out 2 --samples 1000 --batch-size 32 --epochs 10   # the seed job
//   build/bin/train_bench --world-size 2 --torch-anchor bench/peers/torch_train.py
//   build/bin/train_bench --cpu-gemm openblas       # the fallback library, on any CPU
//   build/bin/train_bench --precision bf16          # mixed precision (nn/precision); bench/compare_precision.py
//                                                   # runs it beside PyTorch's autocast
//   build/bin/tinyddp-run -n 2 build/bin/train_bench --world-size 2   # the data-parallel part, launched
//   build/bin/tinyddp-run -n 2 build/bin/train_bench --world-size 2 --zero 1   # ... with ZeRO-1
//   (bench/compare_zero.sh)
//
// The PyTorch figure for the same job: bench/peers/torch_train.py (its defaults are this job)
// (bench/run_all.sh runs both in one command).
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "tinyddp/core/command_line.h"
#include "tinyddp/kernels/cpu_gemm.h"
#include "tinyddp/kernels/ops.h"
#include "tinyddp/nn/activations.h"
#include "tinyddp/nn/data/data_loader.h"
#include "tinyddp/nn/linear.h"
#include "tinyddp/nn/loss.h"
#include "tinyddp/nn/optim/adam.h"
#include "tinyddp/nn/optim/schedulers.h"
#include "tinyddp/nn/optim/zero_redundancy_optimizer.h"
#include "tinyddp/nn/precision/loss_scaler.h"
#include "tinyddp/nn/precision/precision.h"
#include "tinyddp/nn/sequential.h"
#include "tinyddp/nn/train/addons/multi_device.h"
#include "tinyddp/nn/train/addons/trace.h"
#include "tinyddp/nn/train/trainer.h"
#include "examples/dummy_dataset.h"
#include "examples/example_cli.h"

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

// The median of per-step times: on a shared machine a neighbour's burst slows some steps of one
// phase and not the other's; the median step ignores those, the wall-clock total does not.
double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// The CPU time a hypervisor took from this machine's CPUs, in seconds, all CPUs together: /proc/stat's
// steal column (0 where there is none to read). On a virtual machine whose host is busy, that time
// is when a rank could not run at all, and a data-parallel step waits for its slowest rank: the
// scaling figure means little beside a large one, so it is printed with it.
double stolen_cpu_seconds() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  unsigned long long user, nice, system, idle, iowait, irq, softirq, steal;
  if (!(in >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal) || cpu != "cpu") return 0;
  return double(steal) / double(sysconf(_SC_CLK_TCK));
}

// What share of the machine's CPU time was stolen between two readings `seconds` apart.
double stolen_share(double stolen_before, double seconds) {
  const double cpus = double(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
  return seconds > 0 ? (stolen_cpu_seconds() - stolen_before) / (seconds * cpus) : 0;
}

// Only the GEMMs of one training step: for each layer the forward y = x W^T, the weight gradient
// dW = dy^T x, and the input gradient dx = dy W for every layer but the first (nobody needs the
// gradient of the data; the training step skips it too). dW is accumulated (beta = 1): BLAS skips the
// pass over dW that beta = 0 costs it (it zero-fills dW first), so the bound stays the strictest one,
// as it was before zero_grad set gradients to none.
class GemmOnlyStep {
 public:
  GemmOnlyStep(int64_t batch, const std::vector<int64_t>& widths) {
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
      layers_.push_back(L);
    }
  }
  // Runs one step; returns its seconds.
  double run() {
    auto t0 = Clock::now();
    for (auto& L : layers_) kernels::gemm(L.x, false, L.w, true, L.y);
    for (size_t l = layers_.size(); l-- > 0;) {
      auto& L = layers_[l];
      kernels::gemm(L.dy, true, L.x, false, L.dw, 1.f, 1.f);
      if (l > 0) kernels::gemm(L.dy, false, L.w, false, L.dx);
    }
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }

 private:
  struct Layer {
    Tensor w, dw, x, y, dy, dx;
  };
  std::vector<Layer> layers_;
};

// The data-parallel job: the plain training step, as a Trainer, so that MultiDevice runs it on W ranks.
class BenchTrainer : public nn::Trainer {
 public:
  using nn::Trainer::Trainer;
  nn::StepOutput train_step(const nn::Batch& batch) override {
    // The first step pays what a fresh process pays once (oneDNN making its kernels, the pages of
    // every buffer touched): the rate is timed from the second step on, as nccl-tests times after its
    // warm-up iterations. Spawned workers are fresh processes; a one-rank run in this one is not.
    if (steps_ == 1) timed_from_ = Clock::now();
    if (steps_ >= 1) timed_samples_ += double(batch.inputs.size(0));
    ++steps_;
    float loss = loss_fn_.forward(forward(batch.inputs), batch.targets);
    return {.loss = loss, .output_grad = loss_fn_.backward()};
  }
  nn::StepOutput test_step(const nn::Batch& batch) override {
    return {.loss = loss_fn_.evaluate(forward(batch.inputs), batch.targets)};
  }
  // The bytes of this rank's optimizer state as of the last epoch end: the whole Adam state under
  // plain DDP, this rank's shards under ZeRO-1 (the stepping optimizer exists only while run() runs).
  size_t optimizer_state_bytes() const { return optimizer_state_bytes_; }
  // This rank's samples from its second step to the end of its last epoch, and their seconds (0, 0
  // after a single step). A spawner gets rank 0's through the final state's extra state.
  double timed_samples() const { return timed_samples_; }
  double timed_seconds() const { return timed_seconds_; }

  Metadata get_extra_state() const override {
    return {{"timed_samples", std::to_string(timed_samples_)}, {"timed_seconds", std::to_string(timed_seconds_)}};
  }
  void set_extra_state(const Metadata& state) override {
    timed_samples_ = std::stod(state.at("timed_samples"));
    timed_seconds_ = std::stod(state.at("timed_seconds"));
  }

 protected:
  void on_epoch_end(const nn::EpochRecord& record) override {
    if (steps_ > 1) timed_seconds_ = std::chrono::duration<double>(Clock::now() - timed_from_).count();
    if (auto* zero = dynamic_cast<nn::ZeroRedundancyOptimizer*>(&optimizer())) {
      optimizer_state_bytes_ = zero->state_bytes();
    } else {
      optimizer_state_bytes_ = 0;
      for (auto& [name, tensor] : optimizer().state_tensors()) optimizer_state_bytes_ += tensor.nbytes();
    }
    nn::Trainer::on_epoch_end(record);
  }

 private:
  nn::CrossEntropyLoss loss_fn_;
  size_t optimizer_state_bytes_ = 0;
  int64_t steps_ = 0;
  Clock::time_point timed_from_;
  double timed_samples_ = 0, timed_seconds_ = 0;
};

struct DataParallelResult {
  bool main_process = false;
  double seconds = 0, samples_per_second = 0, last_loss = 0;
  size_t optimizer_state_bytes = 0;  // this rank's
};

// Trains on `world` CPU ranks; the time is rank 0's, from its second step to the end of the last epoch
// (the first is a warm-up, see BenchTrainer): process start-up and joining are not in it. All of the
// epochs' time when there was only one step.
DataParallelResult data_parallel(int world, int64_t in, int64_t hidden, int64_t out, int64_t samples, int64_t batch,
                                 int64_t epochs, int zero_stage, nn::Precision precision) {
  auto dataset = examples::make_dummy_dataset(samples, in, 0);
  nn::DataLoader loader(dataset, {.batch_size = batch, .shuffle = true, .seed = 0});
  Generator init(1);
  auto model = make_mlp(in, hidden, out, init);
  nn::Adam optimizer(model->named_parameters(), 1e-3);
  nn::CosineAnnealing scheduler(optimizer, nn::length_of_run);  // each rank's batches, as the anchor's T_max
  nn::WithAddOns<BenchTrainer, nn::MultiDevice, nn::Trace> trainer(
      *model, std::vector<Device>(size_t(world), Device::cpu()), optimizer, &scheduler,
      {.log_bar = false, .scheduler_step_on_batch = true, .precision = precision});
  trainer.multi_device_options().zero_stage = zero_stage;
  trainer.run(epochs, loader);
  DataParallelResult result;
  result.main_process = trainer.is_main_process();
  if (trainer.timed_seconds() > 0) {
    result.seconds = trainer.timed_seconds();
    result.samples_per_second = trainer.timed_samples() * world / result.seconds;  // every rank takes as many steps
  } else {
    for (const nn::EpochRecord& r : trainer.history()) result.seconds += r.seconds;
    result.samples_per_second = double(samples * epochs) / result.seconds;
  }
  if (!trainer.history().empty()) result.last_loss = trainer.history().back().train.at("loss");
  result.optimizer_state_bytes = trainer.optimizer_state_bytes();
  return result;
}

// Runs the PyTorch anchor (DDP when world > 1) on the same job and returns its global samples/s (0 when
// it did not run).
double torch_anchor(const std::string& script, int world, int64_t in, int64_t hidden, int64_t out, int64_t samples,
                    int64_t batch, int64_t epochs) {
  if (!std::filesystem::exists(script) || !std::filesystem::exists("/usr/bin/python3")) {
    std::printf("  PyTorch anchor: %s or /usr/bin/python3 not found, skipped\n", script.c_str());
    return 0;
  }
  std::string command = "/usr/bin/python3 " + script + " " + std::to_string(world) + " " + std::to_string(in) + " " +
                        std::to_string(hidden) + " " + std::to_string(out) + " " + std::to_string(samples) + " " +
                        std::to_string(batch) + " " + std::to_string(epochs) + " 2>&1";
  std::FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return 0;
  std::string text;
  char buffer[512];
  while (std::fgets(buffer, sizeof buffer, pipe)) text += buffer;
  pclose(pipe);
  // "... train 4.740s 6913 samples/s, ..."
  size_t at = text.find(" samples/s");
  size_t begin = at == std::string::npos ? at : text.rfind(' ', at - 1);
  double rate = begin == std::string::npos ? 0 : std::atof(text.c_str() + begin + 1);
  std::printf("  PyTorch anchor: %s", text.c_str());
  return rate;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tinyddp train_bench: MLP training samples/s against the GEMM-only bound", "train_bench"};
  using command_line::at_least;
  int64_t in = 784, hidden = 1024, out = 10, samples = 16384, batch = 256, epochs = 2;
  int threads = 1, world_size = 1, zero_stage = 0, scaling_rounds = 3;
  int64_t interleaved = 64;
  std::string anchor, cpu_gemm = "auto", precision_text = "fp32";
  app.add_option("--in", in, "input features")->check(at_least<int64_t>(1))->capture_default_str();
  app.add_option("--hidden", hidden,
                 "width of both hidden layers (in-hidden-hidden-out); 0 for a single Linear(in, out)")
      ->check(at_least<int64_t>(0))
      ->capture_default_str();
  app.add_option("--out", out, "classes")->check(at_least<int64_t>(2))->capture_default_str();
  app.add_option("--samples", samples, "size of the dummy data set")
      ->check(at_least<int64_t>(1))
      ->capture_default_str();
  app.add_option("--batch-size", batch, "samples per step (per rank in the data-parallel part)")
      ->check(at_least<int64_t>(1))
      ->capture_default_str();
  app.add_option("--epochs", epochs, "passes over the data")->check(at_least<int64_t>(1))->capture_default_str();
  app.add_option("--threads", threads, "BLAS threads")->check(command_line::between(1, 1024))->capture_default_str();
  app.add_option("--world-size", world_size, "also train data-parallel on this many CPU workers (batch per rank)")
      ->check(command_line::between(1, 4096))
      ->capture_default_str();
  app.add_option("--scaling-rounds", scaling_rounds,
                 "with --world-size: the one-rank and the data-parallel parts in turns this many times; the "
                 "scaling efficiency is the median pair's")
      ->check(command_line::between(1, 100))
      ->capture_default_str();
  app.add_option("--zero", zero_stage, "the data-parallel part's ZeRO stage: 0 (plain DDP) or 1 (sharded Adam state)")
      ->check(CLI::Range(0, 1))
      ->capture_default_str();
  app.add_option("--interleaved", interleaved, "then this many training steps, each beside a GEMM-only step (0: none)")
      ->check(at_least<int64_t>(0))
      ->capture_default_str();
  app.add_option("--torch-anchor", anchor, "bench/peers/torch_train.py: run PyTorch on the same job and compare");
  app.add_option("--cpu-gemm", cpu_gemm, "the CPU GEMM library: auto (this machine's choice), openblas or onednn")
      ->check(CLI::IsMember({"auto", "openblas", "onednn"}))
      ->capture_default_str();
  app.add_option("--precision", precision_text,
                 "the training steps' precision: fp32, bf16 or fp16 (mixed, f32 master "
                 "weights; fp16 with dynamic loss scaling); the GEMM-only bound stays f32")
      ->check(examples::precision_choice())
      ->capture_default_str();
  if (auto code = command_line::parse(app, argc, argv)) return *code;

  try {
    // Before anything computes, in the spawned workers too (they run with the same arguments).
    if (cpu_gemm != "auto")
      kernels::set_cpu_gemm(cpu_gemm == "onednn" ? kernels::CpuGemm::onednn : kernels::CpuGemm::openblas);
    const nn::Precision precision = nn::parse_precision(precision_text, "--precision");
    // A worker of the data-parallel run (spawned by it, or started by tinyddp-run) does only that part.
    nn::ProcessRole role = nn::detect_process_role(size_t(world_size));
    if (role == nn::ProcessRole::spawned_worker || role == nn::ProcessRole::launched_worker) {
      DataParallelResult dp = data_parallel(world_size, in, hidden, out, samples, batch, epochs, zero_stage, precision);
      if (role == nn::ProcessRole::launched_worker && dp.main_process)
        std::printf(
            "  data-parallel : %.3f s  %8.0f samples/s  (launched ranks, last epoch loss %.4f, optimizer state "
            "%zu bytes on rank 0)\n",
            dp.seconds, dp.samples_per_second, dp.last_loss, dp.optimizer_state_bytes);
      return 0;
    }
    kernels::set_cpu_threads(threads);
    auto dataset = examples::make_dummy_dataset(samples, in, 0);
    nn::DataLoader loader(dataset, {.batch_size = batch, .shuffle = true, .seed = 0});
    Generator init(1);
    auto model = make_mlp(in, hidden, out, init);
    nn::Adam optimizer(model->named_parameters(), 1e-3);
    nn::CosineAnnealing scheduler(optimizer, epochs * loader.size());
    nn::CrossEntropyLoss loss_fn;
    // One training step in --precision, written as a hand-written loop writes it: the forward pass
    // under a PrecisionScope (torch.autocast), and under fp16 a LossScaler (GradScaler).
    std::optional<nn::LossScaler> scaler;
    if (nn::needs_loss_scaling(precision)) scaler.emplace();
    const std::vector<nn::Parameter*> params = model->parameters();
    auto mixed_step = [&](const nn::Batch& b) {
      optimizer.zero_grad();
      float loss;
      {
        nn::PrecisionScope scope(precision);
        loss = loss_fn.forward(model->forward(b.inputs), b.targets);
      }
      Tensor output_grad = loss_fn.backward();
      if (scaler) scaler->scale_loss_gradient(output_grad);
      model->backward(output_grad, false);
      const bool finite = !scaler || nn::gradients_finite(params);
      if (scaler) scaler->unscale(params, finite);
      if (finite) optimizer.step();
      if (scaler) scaler->update(finite);
      scheduler.step();
      return loss;
    };

    auto t0 = Clock::now();
    int64_t steps = 0, seen = 0;
    float last_loss = 0;
    std::vector<double> step_seconds;  // each from the end of the previous step: waiting for data counts
    auto step_end = t0;
    for (int64_t e = 0; e < epochs; ++e) {
      loader.set_epoch(e);
      for (const nn::Batch& b : loader) {
        last_loss = mixed_step(b);
        ++steps;
        seen += b.inputs.size(0);
        auto now = Clock::now();
        if (b.inputs.size(0) == batch) step_seconds.push_back(std::chrono::duration<double>(now - step_end).count());
        step_end = now;
      }
    }
    double train_s = std::chrono::duration<double>(Clock::now() - t0).count();

    std::vector<int64_t> widths = hidden ? std::vector<int64_t>{in, hidden, hidden, out}
                                         : std::vector<int64_t>{in, out};
    GemmOnlyStep gemm_only(batch, widths);
    std::vector<double> gemm_step_seconds;
    for (int64_t s = 0; s < steps; ++s) gemm_step_seconds.push_back(gemm_only.run());
    double gemm_s = std::accumulate(gemm_step_seconds.begin(), gemm_step_seconds.end(), 0.0);
    double train_rate = double(seen) / train_s, bound_rate = double(steps * batch) / gemm_s;
    double train_median = median(step_seconds), gemm_median = median(gemm_step_seconds);
    const std::string layers = hidden == 0 ? std::to_string(in) + "-" + std::to_string(out)
                                           : std::to_string(in) + "-" + std::to_string(hidden) + "-" +
                                                 std::to_string(hidden) + "-" + std::to_string(out);
    std::printf("tinyddp train_bench model=%s n=%lld batch=%lld epochs=%lld threads=%d\n", layers.c_str(),
                (long long)samples, (long long)batch, (long long)epochs, threads);
    std::printf("  CPU GEMM      : %s\n", kernels::cpu_gemm_description().c_str());
    std::printf("  precision     : %s\n", nn::precision_units(precision, Device::cpu()).c_str());
    std::printf("  training      : %.3f s  %8.0f samples/s  (%lld steps, last loss %.4f)\n", train_s, train_rate,
                (long long)steps, last_loss);
    std::printf("  GEMM-only     : %.3f s  %8.0f samples/s\n", gemm_s, bound_rate);
    std::printf("  training / GEMM-only bound = %.1f%%  (total times; median step %.2f ms / %.2f ms = %.1f%%)\n",
                100.0 * train_rate / bound_rate, 1e3 * train_median, 1e3 * gemm_median,
                100.0 * gemm_median / train_median);
    // The same ratio with both kinds of step taken in turns, each training step right beside a
    // GEMM-only step: a neighbour's load (these machines are shared) then slows both alike, which it
    // does not when the two phases run seconds apart. The median over the pairs.
    if (interleaved > 0 && hidden > 0) {
      std::vector<double> ratios;
      int64_t pairs = 0;
      for (int64_t e = 0; pairs < interleaved; ++e) {
        loader.set_epoch(epochs + e);
        for (const nn::Batch& b : loader) {
          if (pairs == interleaved) break;
          if (b.inputs.size(0) != batch) continue;
          auto t = Clock::now();
          mixed_step(b);
          double train_step = std::chrono::duration<double>(Clock::now() - t).count();
          ratios.push_back(gemm_only.run() / train_step);
          ++pairs;
        }
      }
      std::printf("  interleaved   : training / GEMM-only bound = %.1f%%  (median of %lld step pairs)\n",
                  100.0 * median(ratios), (long long)pairs);
    }
    if (!anchor.empty()) {
      double torch_rate = torch_anchor(anchor, 1, in, hidden, out, samples, batch, epochs);
      if (torch_rate > 0) std::printf("  tinyddp / PyTorch, 1 process = %.2fx\n", train_rate / torch_rate);
    }

    if (world_size > 1) {
      // What the scaling efficiency is held against: the same Trainer on one rank (no DDP), taking as
      // many steps as each rank of the data-parallel run takes (its share of the data set), right
      // before it. What a run pays once (the first step's allocations, each epoch's start) then weighs
      // the same on both sides; against the hand-written loop above, which takes world-size times the
      // steps, it weighs world-size times as much on the data-parallel side.
      const int64_t share = samples / world_size;
      // The two parts in turns, --scaling-rounds times: a shared host's speed drifts from one part to
      // the next (a neighbour's load comes and goes), and the two parts of a pair see nearly the same
      // host. Each pair gives an efficiency; the median pair is reported, and every pair is listed.
      struct Pair {
        DataParallelResult one, dp;
        double one_stolen = 0, dp_stolen = 0, efficiency = 0;
      };
      std::vector<Pair> pairs;
      for (int round = 0; round < scaling_rounds; ++round) {
        Pair pair;
        double stolen = stolen_cpu_seconds();
        auto started = Clock::now();
        pair.one = data_parallel(1, in, hidden, out, share, batch, epochs, 0, precision);
        pair.one_stolen = stolen_share(stolen, std::chrono::duration<double>(Clock::now() - started).count());
        stolen = stolen_cpu_seconds();
        started = Clock::now();
        pair.dp = data_parallel(world_size, in, hidden, out, samples, batch, epochs, zero_stage, precision);
        pair.dp_stolen = stolen_share(stolen, std::chrono::duration<double>(Clock::now() - started).count());
        pair.efficiency = pair.dp.samples_per_second / (world_size * pair.one.samples_per_second);
        pairs.push_back(pair);
      }
      std::vector<Pair> sorted = pairs;
      std::sort(sorted.begin(), sorted.end(), [](const Pair& a, const Pair& b) { return a.efficiency < b.efficiency; });
      const Pair& mid = sorted[sorted.size() / 2];
      const DataParallelResult& one = mid.one;
      const DataParallelResult& dp = mid.dp;
      std::printf(
          "  one rank      : %.3f s  %8.0f samples/s  (the same Trainer without DDP on %lld samples: each "
          "data-parallel "
          "rank's steps; from the second step on; CPU time stolen by the hypervisor %.1f%%)\n",
          one.seconds, one.samples_per_second, (long long)share, 100 * mid.one_stolen);
      std::printf(
          "  data-parallel : %.3f s  %8.0f samples/s  (%d CPU ranks, batch %lld per rank, from the second step on, "
          "last "
          "epoch loss %.4f; stolen %.1f%%)\n",
          dp.seconds, dp.samples_per_second, world_size, (long long)batch, dp.last_loss, 100 * mid.dp_stolen);
      std::printf(
          "  scaling efficiency = %.1f%%  (%d-rank samples/s / (%d x one-rank samples/s); speed-up %.2fx; against the "
          "hand-written loop's samples/s: %.1f%%)\n",
          100.0 * mid.efficiency, world_size, world_size, dp.samples_per_second / one.samples_per_second,
          100.0 * dp.samples_per_second / (world_size * train_rate));
      if (pairs.size() > 1) {
        std::printf("  scaling efficiency of each pair, in turns (one rank, then %d ranks; the median is above):",
                    world_size);
        for (const Pair& pair : pairs)
          std::printf(" %.1f%% (%.0f / %.0f)", 100.0 * pair.efficiency, pair.one.samples_per_second,
                      pair.dp.samples_per_second);
        std::printf("\n");
      }
      if (!anchor.empty()) {
        double torch_rate = torch_anchor(anchor, world_size, in, hidden, out, samples, batch, epochs);
        if (torch_rate > 0)
          std::printf("  tinyddp / PyTorch DDP, %d ranks = %.2fx\n", world_size, dp.samples_per_second / torch_rate);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return command_line::kFailed;
  }
  return 0;
}
