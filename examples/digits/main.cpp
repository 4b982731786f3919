// A real data set on many workers: the UCI handwritten digits (8x8 images, 1797 of them), an MLP,
// data-parallel training with the Trainer and its MultiDevice add-on, and the accuracy on rows it
// never trained on.
//
//   make data                                          # extracts data/digits.csv.gz from Debian's python3-sklearn
//   build/bin/digits --data data/digits.csv.gz         # every GPU, or 2 CPU workers
//   build/bin/digits --hidden 256,128 --epochs 40      # two hidden layers
//   build/bin/digits --world-size 1 --save digits.safetensors
//   build/bin/digits --zero 1                          # ZeRO-1: each worker keeps 1/N of Adam's state
//   build/bin/digits --comm-hook bf16_compress         # gradients on the wire in bf16 (half the bytes)
//   build/bin/digits --precision bf16                  # bf16 GEMMs, f32 master weights (docs/mixed-precision.md)
//
// Each line of the file is 64 pixel counts (0..16) and then the label (0..9). The pixels are divided
// by 16 so the inputs lie in [0, 1]; the last --test-fraction of the rows is held out and only ever
// used for the final test accuracy. The model is Linear(64, h1), ReLU, ..., Linear(hk, 10): a PyTorch
// nn.Sequential of the same layers has the same parameter names (0.weight, 0.bias, 2.weight, ...), so
// `model.load_state_dict(safetensors.torch.load_file(...))` reads what --save wrote.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <sstream>

#include "tinyddp/core/run_main.h"
#include "tinyddp/kernels/ops.h"
#include "tinyddp/nn/activations.h"
#include "tinyddp/nn/data/csv.h"
#include "tinyddp/nn/data/data_loader.h"
#include "tinyddp/nn/linear.h"
#include "tinyddp/nn/loss.h"
#include "tinyddp/nn/optim/adam.h"
#include "tinyddp/nn/optim/schedulers.h"
#include "tinyddp/nn/sequential.h"
#include "tinyddp/nn/train/addons/multi_device.h"
#include "tinyddp/nn/train/addons/state_manager.h"
#include "tinyddp/nn/train/addons/trace.h"
#include "tinyddp/nn/train/checkpoint.h"
#include "tinyddp/nn/train/trainer.h"
#include "examples/example_cli.h"

using namespace tinyddp;

// The ready-made classifier step (logits, cross-entropy, accuracy), with noise on the training inputs.
class DigitsTrainer : public nn::ClassifierTrainer {
 public:
  using nn::ClassifierTrainer::ClassifierTrainer;

  // Training inputs get uniform noise of this standard deviation, drawn afresh for every batch from
  // `seed` (and the rank, so that ranks draw different noise): a pixel that is 0.2 brighter or darker
  // does not change the digit, and learning that keeps the network from leaning on single pixels.
  void set_input_noise(double stddev, uint64_t seed) {
    noise_stddev_ = stddev;
    noise_seed_ = seed;
  }

  nn::StepOutput train_step(const nn::Batch& batch) override {
    if (noise_stddev_ == 0) return nn::ClassifierTrainer::train_step(batch);
    if (!noise_) noise_.emplace(noise_seed_ + uint64_t(rank()) * 1000003u);
    Tensor noise = Tensor::empty(batch.inputs.shape(), DType::f32, batch.inputs.device());
    float half_width = float(noise_stddev_ * std::sqrt(3.0));  // U(-a, a) has standard deviation a / sqrt(3)
    fill_uniform(noise, -half_width, half_width, *noise_);
    nn::Batch noisy{batch.inputs.clone(), batch.targets};
    kernels::axpy(1.f, noise, noisy.inputs);
    return nn::ClassifierTrainer::train_step(noisy);
  }

 private:
  double noise_stddev_ = 0;
  uint64_t noise_seed_ = 0;
  std::optional<Generator> noise_;
};

using DigitsJob = nn::WithAddOns<DigitsTrainer, nn::MultiDevice, nn::StateManager, nn::Trace>;

std::vector<int64_t> parse_widths(const std::string& text) {
  std::vector<int64_t> widths;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, ',');) {
    char* end = nullptr;
    long long width = std::strtoll(part.c_str(), &end, 10);
    TINYDDP_CHECK(!part.empty() && *end == '\0' && width > 0, "--hidden ", text, ": \"", part,
                  "\" is not a positive layer width", hint("write the widths separated by commas, e.g. 256,128"));
    widths.push_back(width);
  }
  TINYDDP_CHECK(!widths.empty(), "--hidden is empty", hint("give at least one width, e.g. 128"));
  return widths;
}

// Linear(64, h1), ReLU, Linear(h1, h2), ReLU, ..., Linear(hk, 10), one layer per statement (so the
// weights are drawn in a fixed order: see nn/sequential.h).
std::unique_ptr<nn::Sequential> make_mlp(int64_t inputs, const std::vector<int64_t>& hidden, int64_t classes,
                                         Generator& gen) {
  auto model = std::make_unique<nn::Sequential>();
  int64_t width = inputs;
  for (int64_t h : hidden) {
    model->emplace<nn::Linear>(width, h, gen);
    model->emplace<nn::ReLU>();
    width = h;
  }
  model->emplace<nn::Linear>(width, classes, gen);
  return model;
}

// Rows [begin, end) of a data set, as a data set of its own (copied: each part owns its rows).
std::shared_ptr<nn::TensorDataset> rows(const nn::TensorDataset& data, int64_t begin, int64_t end) {
  return std::make_shared<nn::TensorDataset>(data.features().slice_rows(begin, end).clone(),
                                             data.targets().slice_rows(begin, end).clone());
}

// The training images and, after them, each image moved by one pixel in each of the 8 directions
// (the pixels moved in at the border are 0): 9 times the rows. A digit written a pixel further left is
// the same digit, and a network that has seen it both ways relies less on exactly where one writer
// put the strokes -- which is what differs between the writers of the training rows and of the test
// rows. It is worth about 3 points of test accuracy here.
std::shared_ptr<nn::TensorDataset> with_shifted_copies(const nn::TensorDataset& data) {
  const int64_t n = data.size(), side = 8;
  Tensor features = Tensor::zeros({9 * n, side * side});
  Tensor targets = Tensor::empty({9 * n}, DType::i64);
  const float* in = data.features().data<float>();
  const int64_t* labels = data.targets().data<int64_t>();
  float* out = features.data<float>();
  int64_t copy = 0;
  for (int64_t dy = -1; dy <= 1; ++dy)
    for (int64_t dx = -1; dx <= 1; ++dx, ++copy)
      for (int64_t i = 0; i < n; ++i) {
        float* image = out + (copy * n + i) * side * side;
        for (int64_t y = 0; y < side; ++y)
          for (int64_t x = 0; x < side; ++x) {
            int64_t from_y = y - dy, from_x = x - dx;
            if (from_y >= 0 && from_y < side && from_x >= 0 && from_x < side)
              image[y * side + x] = in[i * side * side + from_y * side + from_x];
          }
        targets.data<int64_t>()[copy * n + i] = labels[i];
      }
  return std::make_shared<nn::TensorDataset>(features, targets);
}

int main(int argc, char** argv) {
  CLI::App app{"tinyddp digits: an MLP on the UCI handwritten digits, data-parallel", "digits"};
  examples::ExampleOptions options;
  options.epochs = 50;
  options.lr = 1e-2;  // cosine-annealed to 0 over the epochs
  double test_fraction = 0.2, noise = 0.2;
  std::string data_path = "data/digits.csv.gz", hidden = "128", augment = "on";
  int zero_stage = 0;
  std::string comm_hook = "allreduce";
  examples::add_example_options(app, options);
  app.add_option("--data", data_path,
                 "the digits CSV (64 pixel counts, then the label; .gz or plain; `make data` writes it)")
      ->capture_default_str();
  app.add_option("--test-fraction", test_fraction, "the last fraction of the rows, held out for testing")
      ->check(CLI::Range(0.0, 0.9))
      ->capture_default_str();
  app.add_option("--augment", augment, "also train on every image moved by one pixel in each direction")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--noise", noise, "standard deviation of the noise added to training inputs (0: none)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--zero", zero_stage,
                 "ZeRO stage: 0 (every worker holds Adam's whole state), 1 (each holds 1/N of it; "
                 "the same weights as 0 when the all-reduce runs the ring)")
      ->check(CLI::Range(0, 1))
      ->capture_default_str();
  app.add_option("--comm-hook", comm_hook,
                 "how gradient buckets travel: allreduce (f32), bf16_compress, fp16_compress "
                 "(half the bytes, rounded each step) or bf16_single_rounding (half the bytes, rounded once)")
      ->check(CLI::IsMember(nn::comm_hooks::names()))
      ->capture_default_str();
  app.add_option("--hidden", hidden, "hidden layer widths, comma-separated (ReLU between layers)")
      ->capture_default_str();
  if (auto code = command_line::parse(app, argc, argv)) return *code;

  std::vector<int64_t> widths;
  try {
    widths = parse_widths(hidden);
  } catch (const Error& e) {
    return command_line::usage_error(app, e.message());
  }
  // Every failure prints its message once and exits 1 (core/run_main.h).
  return run_main([&] {
    examples::check_inputs(options);  // before the data and the training: a typo should not wait for them
    TINYDDP_CHECK(std::filesystem::exists(data_path), "--data ", data_path, " does not exist",
                  hint(data_path == "data/digits.csv.gz"
                           ? "run `make data` in the source tree (it writes data/digits.csv.gz)"
                           : "check the path, or run `make data` for data/digits.csv.gz"));
    nn::TensorDataset all = nn::read_csv(data_path, {.feature_scale = 1.f / 16, .num_classes = 10});
    const int64_t n = all.size(), n_test = int64_t(double(n) * test_fraction), n_train = n - n_test;
    TINYDDP_CHECK(n_train > 0 && all.features().size(1) == 64, data_path, ": ", n, " rows of ", all.features().size(1),
                  " features leave ", n_train, " for training",
                  hint("the file should hold the 8x8 digits (64 features)"));
    auto train_set = rows(all, 0, n_train), test_set = rows(all, n_train, n);
    if (augment == "on") train_set = with_shifted_copies(*train_set);
    nn::DataLoader loader(train_set,
                          {.batch_size = options.batch_size, .shuffle = options.shuffle == "on", .seed = options.seed});

    Generator init(options.seed + 1);
    auto model = make_mlp(64, widths, 10, init);
    if (!options.load_path.empty()) nn::load_model(options.load_path, *model);
    nn::Adam optimizer(model->named_parameters(), options.lr);
    // Stepped per epoch: from lr down to 0 at the end (with --epochs 0 it never steps).
    nn::CosineAnnealing scheduler(optimizer, std::max(1, options.epochs));

    std::vector<Device> devices = examples::choose_devices(options.device_kind, options.world_size);
    DigitsJob trainer(*model, devices, optimizer, &scheduler, {.precision = nn::parse_precision(options.precision)});
    examples::use_init_method(app, options, trainer);
    trainer.multi_device_options().zero_stage = zero_stage;
    trainer.multi_device_options().comm_hook = comm_hook;
    trainer.set_input_noise(noise, options.seed + 2);
    if (!options.checkpoint_dir.empty()) trainer.set_checkpoint_dir(options.checkpoint_dir);

    trainer.run(options.epochs, loader);

    if (!trainer.is_main_process()) return 0;  // the workers are done; the spawner reports
    // Under a launcher the job has as many workers as it started, whatever this host's devices.
    const int workers = trainer.world_size() > 1 ? trainer.world_size() : int(devices.size());
    std::string layers = "64";
    for (int64_t width : widths) layers += "-" + std::to_string(width);
    std::printf(
        "digits: %lld training rows (%lld with the shifted copies), %lld test rows, MLP %s-10, %d %s worker%s, %d "
        "epoch%s\n",
        (long long)n_train, (long long)train_set->size(), (long long)n_test, layers.c_str(), workers,
        devices[0].is_cpu() ? "CPU" : "GPU", workers == 1 ? "" : "s", options.epochs, options.epochs == 1 ? "" : "s");
    if (n_test > 0) {
      nn::DataLoader test_loader(test_set, {.batch_size = 256});
      nn::InferenceResult test = trainer.inference(test_loader);
      std::printf("test loss %.4f  test accuracy %.4f\n", test.metrics.at("loss"), test.metrics.at("accuracy"));
    }
    if (!options.save_path.empty())
      return examples::save_final_weights(options.save_path,
                                          [&](const std::string& path) { nn::save_model(path, trainer.model()); });
    return 0;
  });
}
