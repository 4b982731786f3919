// A user's program as the README teaches it, less the one thing a user may forget: it catches nothing.
// A 3-class classifier on 2 CPU workers with a checkpoint directory. The tests kill its workers,
// interrupt it and give it bad input (test_user_program.cpp), and check that the library alone ends
// each failure with one message and exit code 1, and leaves nothing behind.
//
//   test_user_program <checkpoint dir, or "" for none> <epochs> <label dtype: i64 or f32>
#include <tinyddp/nn/activations.h>
#include <tinyddp/nn/data/data_loader.h>
#include <tinyddp/nn/linear.h>
#include <tinyddp/nn/optim/adam.h>
#include <tinyddp/nn/sequential.h>
#include <tinyddp/nn/train/addons/multi_device.h>
#include <tinyddp/nn/train/addons/state_manager.h>
#include <tinyddp/nn/train/trainer.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

using namespace tinyddp;

int main(int argc, char** argv) {
  const std::string checkpoint_dir = argc > 1 ? argv[1] : "";
  const int epochs = argc > 2 ? std::atoi(argv[2]) : 1;
  const bool float_labels = argc > 3 && std::string(argv[3]) == "f32";

  // Points on a circle; the class is the third of the circle a point lies in.
  const int64_t n = 256;
  Tensor x = Tensor::empty({n, 2});
  Tensor y = Tensor::empty({n}, float_labels ? DType::f32 : DType::i64);
  for (int64_t i = 0; i < n; ++i) {
    const double angle = 2 * M_PI * double(i) / double(n);
    x.data<float>()[2 * i] = float(std::cos(angle));
    x.data<float>()[2 * i + 1] = float(std::sin(angle));
    const int64_t label = 3 * i / n;
    if (float_labels)
      y.data<float>()[i] = float(label);
    else
      y.data<int64_t>()[i] = label;
  }
  nn::DataLoader loader(std::make_shared<nn::TensorDataset>(x, y), {.batch_size = 32, .shuffle = true});

  Generator init(0);
  nn::Sequential model;
  model.emplace<nn::Linear>(2, 16, init);
  model.emplace<nn::GELU>();
  model.emplace<nn::Linear>(16, 3, init);
  nn::Adam optimizer(model.named_parameters(), 1e-2);

  nn::WithAddOns<nn::ClassifierTrainer, nn::MultiDevice, nn::StateManager> trainer(model, nn::all_devices(2), optimizer,
                                                                                   nullptr, {.log_bar = false});
  if (!checkpoint_dir.empty()) trainer.set_checkpoint_dir(checkpoint_dir);
  trainer.run(epochs, loader);
  if (!trainer.is_main_process()) return 0;
  std::printf("%d workers, final loss %.4f\n", trainer.world_size(), trainer.history().back().train.at("loss"));
  return 0;
}
