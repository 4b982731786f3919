// Fit y = sin(x) with a small MLP on 2 CPU workers (or every GPU), as a program outside tinyddp's tree.
#include <tinyddp/core/run_main.h>
#include <tinyddp/core/version.h>
#include <tinyddp/nn/activations.h>
#include <tinyddp/nn/data/data_loader.h>
#include <tinyddp/nn/linear.h>
#include <tinyddp/nn/loss.h>
#include <tinyddp/nn/optim/adam.h>
#include <tinyddp/nn/optim/schedulers.h>
#include <tinyddp/nn/sequential.h>
#include <tinyddp/nn/train/addons/multi_device.h>
#include <tinyddp/nn/train/trainer.h>

#include <cmath>
#include <cstdio>
#include <memory>

using namespace tinyddp;

// What one step computes: the loss, and d(loss)/d(output) for the backward pass to start from.
class SineTrainer : public nn::Trainer {
 public:
  using nn::Trainer::Trainer;
  nn::StepOutput train_step(const nn::Batch& b) override {
    float loss = loss_fn_.forward(forward(b.inputs), b.targets);
    return {.loss = loss, .output_grad = loss_fn_.backward()};
  }
  nn::StepOutput test_step(const nn::Batch& b) override {
    return {.loss = loss_fn_.evaluate(forward(b.inputs), b.targets)};
  }

 private:
  nn::MSELoss loss_fn_;
};

int main(int argc, char** argv) {
  if (auto code = answer_without_flags(argc, argv, "sine_fit: y = sin(x) by an MLP on 2 CPU workers")) return *code;
  // Every failure is a tinyddp::Error that says what failed and what to do: run_main prints it once
  // and returns 1. Cleaning up (workers, temporary files) never depends on it.
  return run_main([&] {
    Tensor x = Tensor::empty({1024, 1}), y = Tensor::empty({1024, 1});  // 1024 points on [-3, 3]
    for (int64_t i = 0; i < 1024; ++i) {
      x.data<float>()[i] = -3.f + 6.f * float(i) / 1023.f;
      y.data<float>()[i] = std::sin(x.data<float>()[i]);
    }
    nn::DataLoader loader(std::make_shared<nn::TensorDataset>(x, y), {.batch_size = 32, .shuffle = true});

    Generator init(0);
    nn::Sequential model;
    model.emplace<nn::Linear>(1, 64, init);
    model.emplace<nn::GELU>();
    model.emplace<nn::Linear>(64, 1, init);
    nn::Adam optimizer(model.named_parameters(), 1e-2);
    nn::CosineAnnealing schedule(optimizer, nn::length_of_run);  // as long as run(): epochs x batches per worker

    // The seed's Trainer.add_on(MultiGPUAddon): every GPU, or 2 CPU workers on a machine without one.
    nn::WithAddOns<SineTrainer, nn::MultiDevice> trainer(model, nn::all_devices(2), optimizer, &schedule,
                                                         {.log_bar = false, .scheduler_step_on_batch = true});
    trainer.run(60, loader);
    if (!trainer.is_main_process()) return;  // the workers run main() too: only the spawner reports

    Tensor guess = trainer.predict(Tensor::from_vector<float>({0.5f}, {1, 1}));
    std::printf("%d workers, final loss %.5f; sin(0.5) = %.4f, the model says %.4f\n", trainer.world_size(),
                trainer.history().back().train.at("loss"), std::sin(0.5), guess.item<float>());
  });
}
