// The seed job in one process: DummyDataset(1000) -> Linear(10, 2), Adam 1e-3, cosine schedule with
// total_iters 100, batch 32, 10 epochs; prints loss and accuracy per epoch and saves the model.
//
//   build/bin/dummy                       # CPU
//   build/bin/dummy --device cuda:0       # the same job on a GPU
//   build/bin/dummy --load dummy_model.safetensors --epochs 0   # evaluate a saved model
#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "tinyddp/core/command_line.h"
#include "tinyddp/core/cuda_runtime.h"
#include "tinyddp/core/output_path.h"
#include "tinyddp/core/run_main.h"
#include "tinyddp/kernels/ops.h"
#include "tinyddp/nn/data/data_loader.h"
#include "tinyddp/nn/linear.h"
#include "tinyddp/nn/loss.h"
#include "tinyddp/nn/optim/adam.h"
#include "tinyddp/nn/optim/schedulers.h"
#include "tinyddp/nn/train/checkpoint.h"
#include "examples/dummy_dataset.h"

using namespace tinyddp;

int main(int argc, char** argv) {
  CLI::App app{"tinyddp seed job: Linear(10, 2) on the dummy data set, one process", "dummy"};
  using command_line::at_least;
  int epochs = 10, batch_size = 32, samples = 1000, total_iters = 100;
  double lr = 1e-3;
  uint64_t seed = 0;
  std::string device_name = "cpu", load_path, save_path = "dummy_model.safetensors", shuffle = "on", step_on = "batch";
  app.add_option("--epochs", epochs, "passes over the data (0: only evaluate, e.g. a --load'ed model)")
      ->check(at_least(0))
      ->capture_default_str();
  app.add_option("--batch-size", batch_size, "samples per step")->check(at_least(1))->capture_default_str();
  app.add_option("--lr", lr, "Adam learning rate")->check(command_line::positive<double>())->capture_default_str();
  app.add_option("--seed", seed, "seed of the data, the initial weights and the shuffle")->capture_default_str();
  app.add_option("--device", device_name, "cpu or cuda:N")->capture_default_str();
  app.add_option("--load", load_path, "start from the weights in this safetensors file")->check(CLI::ExistingFile);
  app.add_option("--save", save_path, "write the final weights here (empty: do not save)")->capture_default_str();
  app.add_option("--shuffle", shuffle, "shuffle the samples every epoch")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--samples", samples, "size of the dummy data set")->check(at_least(1))->capture_default_str();
  app.add_option("--total-iters", total_iters, "cosine schedule length T")->check(at_least(1))->capture_default_str();
  app.add_option("--scheduler-step", step_on, "advance the schedule every batch or every epoch")
      ->check(CLI::IsMember({"batch", "epoch"}))
      ->capture_default_str();
  if (auto code = command_line::parse(app, argc, argv)) return *code;
  Device device = Device::cpu();
  try {
    device = Device::parse(device_name);
  } catch (const Error& e) {
    return command_line::usage_error(app, "--device " + device_name + ": " + e.message());
  }

  // Every failure prints its message once and exits 1 (core/run_main.h).
  return run_main([&] {
    auto start = std::chrono::steady_clock::now();
    if (!save_path.empty()) check_output_path("--save", save_path);  // before the work, not after it
    kernels::set_cpu_threads(1);
    require_device(device);

    auto dataset = examples::make_dummy_dataset(samples, 10, seed);
    nn::DataLoader loader(dataset, {.batch_size = batch_size, .shuffle = shuffle == "on", .seed = seed});
    Generator init(seed + 1);
    nn::Linear model(10, 2, init);
    if (!load_path.empty()) nn::load_model(load_path, model);
    model.to(device);
    nn::Adam optimizer(model.named_parameters(), lr);
    nn::CosineAnnealing scheduler(optimizer, total_iters);
    nn::CrossEntropyLoss loss_fn;

    for (int epoch = 0; epoch < epochs; ++epoch) {
      loader.set_epoch(epoch);
      double loss_sum = 0;
      int64_t correct = 0, seen = 0;
      int64_t batch_number = 0;
      for (const nn::Batch& batch : loader) {
        Tensor x = batch.inputs.to(device), y = batch.targets.to(device);
        optimizer.zero_grad();
        Tensor logits = model.forward(x);
        float loss = loss_fn.forward(logits, y);
        ++batch_number;
        // What the Trainer does (NonFiniteLoss::stop): a NaN stepped into the weights is a NaN model.
        TINYDDP_CHECK(std::isfinite(loss), "the loss is ", loss, " at epoch ", epoch + 1, ", batch ", batch_number,
                      "; stopped before the optimizer step",
                      hint("look for NaN or huge values in --load'ed weights,", " or lower --lr"));
        model.backward(loss_fn.backward(), /*want_input_grad=*/false);
        optimizer.step();
        if (step_on == "batch") scheduler.step();
        loss_sum += double(loss) * double(x.size(0));
        correct += kernels::count_correct(logits, y);
        seen += x.size(0);
      }
      if (step_on == "epoch") scheduler.step();
      std::printf("epoch %2d/%d  loss %.4f  accuracy %.4f  lr %.3e\n", epoch + 1, epochs, loss_sum / double(seen),
                  double(correct) / double(seen), optimizer.lr());
    }

    // Evaluate on the whole set in one batch (what the PyTorch anchor reports).
    Tensor all_x = dataset->features().to(device), all_y = dataset->targets().to(device);
    Tensor logits = model.forward(all_x);
    std::printf("final: loss %.4f  accuracy %.4f  (%lld samples, %s)\n", loss_fn.evaluate(logits, all_y),
                double(kernels::count_correct(logits, all_y)) / double(all_x.size(0)), (long long)all_x.size(0),
                device.str().c_str());
    int code = 0;
    if (!save_path.empty()) {
      std::string written = write_with_fallback(save_path,
                                                [&](const std::string& path) { nn::save_model(path, model); });
      std::printf("saved %s\n", written.c_str());
      if (written != save_path) code = command_line::kFailed;
    }
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("wall %.3f s\n", seconds);
    return code;
  });
}
