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

#include "tinyddp/core/run_main.h"
#include "tinyddp/kernels/ops.h"
#include "tinyddp/nn/data/data_loader.h"
#include "tinyddp/nn/linear.h"
#include "tinyddp/nn/loss.h"
#include "tinyddp/nn/optim/adam.h"
#include "tinyddp/nn/optim/schedulers.h"
#include "tinyddp/nn/train/addons/multi_device.h"
#include "tinyddp/nn/train/addons/state_manager.h"
#include "tinyddp/nn/train/addons/trace.h"
#include "tinyddp/nn/train/checkpoint.h"
#include "tinyddp/nn/train/trainer.h"
#include "examples/dummy_dataset.h"
#include "examples/example_cli.h"

using namespace tinyddp;

// The user's part, as in the seed: what one training step and one test step compute. (The test step
// also hands back the logits, from which main() computes the accuracy; nn::ClassifierTrainer is the
// ready-made version of all this.)
class DummyTrainer : public nn::Trainer {
 public:
  using nn::Trainer::Trainer;

  nn::StepOutput train_step(const nn::Batch& batch) override {
    float loss = loss_fn_.forward(forward(batch.inputs), batch.targets);  // F.cross_entropy(self.model(x), y)
    return {.loss = loss, .output_grad = loss_fn_.backward()};            // {'loss': loss}
  }
  nn::StepOutput test_step(const nn::Batch& batch) override {
    Tensor logits = forward(batch.inputs);
    return {.loss = loss_fn_.evaluate(logits, batch.targets), .output = logits};
  }

 private:
  nn::CrossEntropyLoss loss_fn_;
};

// Trainer.add_on(MultiGPUAddon), plus checkpoints and the timeline.
using MultiDeviceTrainer = nn::WithAddOns<DummyTrainer, nn::MultiDevice, nn::StateManager, nn::Trace>;

int main(int argc, char** argv) {
  CLI::App app{"tinyddp dummy_mgpu: the seed's multi-device job (Linear(10, 2) on the dummy data set)", "dummy_mgpu"};
  examples::ExampleOptions options;  // the seed's: 10 epochs, batch 32, Adam 1e-3, all devices
  options.save_path = "dummy_model.safetensors";
  int samples = 1000, total_iters = 100;
  examples::add_example_options(app, options);
  app.add_option("--samples", samples, "size of the dummy data set")
      ->check(command_line::at_least(1))
      ->capture_default_str();
  app.add_option("--total-iters", total_iters,
                 "cosine schedule length T (in epochs: it steps per epoch, as in the seed)")
      ->check(command_line::at_least(1))
      ->capture_default_str();
  if (auto code = command_line::parse(app, argc, argv)) return *code;

  // Every failure prints its message once and exits 1 (core/run_main.h).
  return run_main([&] {
    examples::check_inputs(options);
    // DummyDataset(1000) and DataLoader(dataset, batch_size=32). Every worker builds the same data from
    // the seed; MultiDevice gives each its own share of it.
    auto dataset = examples::make_dummy_dataset(samples, 10, options.seed);
    nn::DataLoader loader(dataset,
                          {.batch_size = options.batch_size, .shuffle = options.shuffle == "on", .seed = options.seed});

    // nn.Linear(10, 2), Adam, cosine.
    Generator init(options.seed + 1);
    nn::Linear model(10, 2, init);
    if (!options.load_path.empty()) nn::load_model(options.load_path, model);
    nn::Adam optimizer(model.named_parameters(), options.lr);
    nn::CosineAnnealing scheduler(optimizer, total_iters);

    std::vector<Device> devices = examples::choose_devices(options.device_kind, options.world_size);
    MultiDeviceTrainer trainer(model, devices, optimizer, &scheduler,
                               {.precision = nn::parse_precision(options.precision)});
    examples::use_init_method(app, options, trainer);
    if (!options.checkpoint_dir.empty()) trainer.set_checkpoint_dir(options.checkpoint_dir);

    trainer.run(options.epochs, loader);

    // Every worker runs this program too; only one process reports and saves (`if __name__ == "__main__"`).
    if (!trainer.is_main_process()) return 0;
    // Evaluate the final weights on the whole set in one batch (what the PyTorch anchor reports).
    nn::DataLoader everything(dataset, {.batch_size = samples});
    nn::InferenceResult result = trainer.inference(everything);
    const double accuracy = double(kernels::count_correct(result.outputs, dataset->targets())) / double(samples);
    const int workers = trainer.world_size() > 1 ? trainer.world_size() : int(devices.size());
    std::printf("%d %s worker%s, %d epoch%s: final loss %.4f  accuracy %.4f  (%d samples)\n", workers,
                devices[0].is_cpu() ? "CPU" : "GPU", workers == 1 ? "" : "s", options.epochs,
                options.epochs == 1 ? "" : "s", result.metrics.at("loss"), accuracy, samples);
    if (!options.save_path.empty())  // torch.save(trainer.model.state_dict(), ...)
      return examples::save_final_weights(options.save_path,
                                          [&](const std::string& path) { nn::save_model(path, trainer.model()); });
    return 0;
  });
}
