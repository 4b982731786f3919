// The seed's MultiGPUAddon script, in C++, line for line where C++ allows: DummyDataset(1000) ->
// Linear(10, 2), Adam 1e-3, cosine schedule with total_iters 100, batch 32, 10 epochs, on every GPU of
// the machine -- or 2 CPU workers where there is none -- then save the model.
//
//   build/bin/dummy_mgpu                              # all GPUs, or 2 CPU workers
//   build/bin/dummy_mgpu --world-size 4               # 4 workers
//   build/bin/dummy_mgpu --checkpoint-dir runs/dummy  # checkpoints every epoch; run again to resume
//   TINYDDP_TRACE=dummy.json build/bin/dummy_mgpu     # a timeline of every rank for ui.perfetto.dev
//   build/bin/tinyddp-run -n 2 build/bin/dummy_mgpu   # started by the launcher: no spawning, same job
//
// The seed script, for comparison (zae-engine):
//
//   class DummyTrainer(Trainer):
//       def train_step(self, batch):
//           x, y = batch
//           loss = F.cross_entropy(self.model(x), y)
//           return {'loss': loss}
//       def test_step(self, batch): ...same...
//
//   devices = [f'cuda:{i}' for i in range(torch.cuda.device_count())]
//   model = nn.Linear(10, 2)
//   opt = torch.optim.Adam(model.parameters(), lr=1e-3)
//   sched = CosineAnnealingScheduler(opt, total_iters=100)
//   loader = DataLoader(DummyDataset(1000), batch_size=32)
//   trainer = Trainer.add_on(MultiGPUAddon)(model=model, device=devices, mode='train', optimizer=opt,
//                                           scheduler=sched, init_method='tcp://localhost:12355')
//   trainer.run(n_epoch=10, loader=loader, valid_loader=None)
//   torch.save(trainer.model.state_dict(), 'dummy_model.pth')
#include <CLI/CLI.hpp>
#include <cstdio>

#include "core/cuda_runtime.h"
#include "examples/dummy_dataset.h"
#include "kernels/ops.h"
#include "nn/adam.h"
#include "nn/addons/multi_device.h"
#include "nn/addons/state_manager.h"
#include "nn/addons/trace.h"
#include "nn/checkpoint.h"
#include "nn/data_loader.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/schedulers.h"
#include "nn/trainer.h"

using namespace tinyddp;

// The user's part, as in the seed: what one training step and one test step compute.
class DummyTrainer : public nn::Trainer {
 public:
  using nn::Trainer::Trainer;

  nn::StepOutput train_step(const nn::Batch& batch) override {
    Tensor logits = forward(batch.inputs);
    float loss = loss_fn_.forward(logits, batch.targets);
    return {.loss = loss, .output_grad = loss_fn_.backward(), .metrics = {{"accuracy", accuracy(logits, batch)}}};
  }
  nn::StepOutput test_step(const nn::Batch& batch) override {
    Tensor logits = forward(batch.inputs);
    return {.loss = loss_fn_.evaluate(logits, batch.targets),
            .output = logits,
            .metrics = {{"accuracy", accuracy(logits, batch)}}};
  }

 private:
  static double accuracy(const Tensor& logits, const nn::Batch& batch) {
    return double(kernels::count_correct(logits, batch.targets)) / double(batch.inputs.size(0));
  }
  nn::CrossEntropyLoss loss_fn_;
};

// Trainer.add_on(MultiGPUAddon), plus checkpoints and the timeline.
using MultiDeviceTrainer = nn::WithAddOns<DummyTrainer, nn::MultiDevice, nn::StateManager, nn::Trace>;

// Every GPU (or the first `world_size` of them); without GPUs, or with --device cpu, CPU workers.
std::vector<Device> choose_devices(const std::string& kind, int world_size) {
  int gpus = kind == "cpu" ? 0 : cuda_device_count();
  TINYDDP_CHECK(kind != "cuda" || gpus > 0, "--device cuda: no CUDA device is usable (", cuda_unavailable_reason(),
                "); hint: use --device cpu");
  if (gpus == 0) return std::vector<Device>(size_t(world_size > 0 ? world_size : 2), Device::cpu());
  TINYDDP_CHECK(world_size <= gpus, "--world-size ", world_size, " but only ", gpus,
                " GPUs are visible; hint: ask for at most ", gpus, ", or use --device cpu");
  std::vector<Device> devices;
  for (int i = 0; i < (world_size > 0 ? world_size : gpus); ++i) devices.push_back(Device::cuda(i));
  return devices;
}

int main(int argc, char** argv) {
  CLI::App app{"tinyddp dummy_mgpu: the seed's multi-device job (Linear(10, 2) on the dummy data set)"};
  int world_size = 0, epochs = 10, batch_size = 32, samples = 1000, total_iters = 100;
  double lr = 1e-3;
  uint64_t seed = 0;
  std::string device_kind = "auto", load_path, save_path = "dummy_model.safetensors", shuffle = "on", checkpoint_dir;
  std::string init_method = "tcp://localhost:12355";
  app.add_option("--world-size", world_size, "workers: default every GPU, or 2 CPU workers without one");
  app.add_option("--device", device_kind, "auto (GPUs when there are any), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))->capture_default_str();
  app.add_option("--epochs", epochs, "passes over the data")->capture_default_str();
  app.add_option("--batch-size", batch_size, "samples per step on each worker")->capture_default_str();
  app.add_option("--lr", lr, "Adam learning rate")->capture_default_str();
  app.add_option("--seed", seed, "seed of the data, the initial weights and the shuffle")->capture_default_str();
  app.add_option("--load", load_path, "start from the weights in this safetensors file");
  app.add_option("--save", save_path, "write the final weights here (empty: do not save)")->capture_default_str();
  app.add_option("--shuffle", shuffle, "shuffle the samples every epoch")->check(CLI::IsMember({"on", "off"}))->capture_default_str();
  app.add_option("--checkpoint-dir", checkpoint_dir, "checkpoint every epoch here, and resume from it");
  app.add_option("--init-method", init_method, "where the workers meet")->capture_default_str();
  app.add_option("--samples", samples, "size of the dummy data set")->capture_default_str();
  app.add_option("--total-iters", total_iters, "cosine schedule length T (in epochs: it steps per epoch, as in the seed)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  try {
    // DummyDataset(1000) and DataLoader(dataset, batch_size=32). Every worker builds the same data from
    // the seed; MultiDevice gives each its own share of it.
    auto dataset = examples::make_dummy_dataset(samples, 10, seed);
    nn::DataLoader loader(dataset, {.batch_size = batch_size, .shuffle = shuffle == "on", .seed = seed});

    // nn.Linear(10, 2), Adam, cosine.
    Generator init(seed + 1);
    nn::Linear model(10, 2, init);
    if (!load_path.empty()) nn::load_model(load_path, model);
    nn::Adam optimizer(model.named_parameters(), lr);
    nn::CosineAnnealing scheduler(optimizer, total_iters);

    std::vector<Device> devices = choose_devices(device_kind, world_size);
    MultiDeviceTrainer trainer(model, devices, optimizer, &scheduler);
    trainer.set_init_method(init_method);
    if (!checkpoint_dir.empty()) trainer.set_checkpoint_dir(checkpoint_dir);

    trainer.run(epochs, loader);

    // Every worker runs this program too; only one process reports and saves (`if __name__ == "__main__"`).
    if (!trainer.is_main_process()) return 0;
    // Evaluate the final weights on the whole set in one batch (what the PyTorch anchor reports).
    nn::DataLoader everything(dataset, {.batch_size = samples});
    nn::InferenceResult result = trainer.inference(everything);
    std::printf("%d %s worker%s, %d epochs: final loss %.4f  accuracy %.4f  (%d samples)\n", int(devices.size()),
                devices[0].is_cpu() ? "CPU" : "GPU", devices.size() == 1 ? "" : "s", epochs,
                result.metrics.at("loss"), result.metrics.at("accuracy"), samples);
    if (!save_path.empty()) {
      nn::save_model(save_path, trainer.model());  // torch.save(trainer.model.state_dict(), ...)
      std::printf("saved %s\n", save_path.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
