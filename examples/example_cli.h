// The command line every multi-device example shares (issue 5: --world-size --epochs --batch-size --lr
// --seed --load --save --shuffle --checkpoint-dir, and --device --init-method), and how the devices
// are chosen from it. Each example sets its own defaults in ExampleOptions before adding the options,
// then adds its own.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "tinyddp/core/command_line.h"
#include "tinyddp/core/cuda_runtime.h"
#include "tinyddp/core/device.h"
#include "tinyddp/core/error.h"
#include "tinyddp/core/log.h"
#include "tinyddp/core/output_path.h"
#include "tinyddp/core/trace.h"
#include "tinyddp/nn/precision/precision.h"

namespace tinyddp::examples {

struct ExampleOptions {
  int world_size = 0;  // 0: every GPU, or 2 CPU workers without one
  int epochs = 10;
  int batch_size = 32;
  double lr = 1e-3;
  uint64_t seed = 0;
  std::string device_kind = "auto", load_path, save_path, shuffle = "on", checkpoint_dir;
  std::string init_method = "tcp://localhost:12355";  // the seed's
  std::string precision = "fp32";                     // --precision: fp32, bf16 or fp16 (nn/precision/precision.h)
};

// --precision's check: one of the words nn::parse_precision reads, refused with its message
// ("--precision 'bf17' is not a precision; hint: use fp32 ..."), before anything runs.
inline CLI::Validator precision_choice() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        try {
          nn::parse_precision(text, "--precision");
          return std::string();
        } catch (const Error& e) {
          return e.message();
        }
      },
      "fp32|bf16|fp16");
}

// Adds the shared options to `app`, with the values in `options` as their defaults.
inline void add_example_options(CLI::App& app, ExampleOptions& options) {
  using command_line::at_least;
  app.add_option("--world-size", options.world_size, "workers [default: every GPU, or 2 CPU workers without one]")
      ->check(command_line::between(1, 4096));
  app.add_option("--device", options.device_kind, "auto (GPUs when there are any), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  app.add_option("--epochs", options.epochs,
                 "passes over the training data (0: none, e.g. to evaluate a --load'ed model)")
      ->check(at_least(0))
      ->capture_default_str();
  app.add_option("--batch-size", options.batch_size, "samples per step on each worker")
      ->check(at_least(1))
      ->capture_default_str();
  app.add_option("--lr", options.lr, "Adam learning rate")
      ->check(command_line::positive<double>())
      ->capture_default_str();
  app.add_option("--seed", options.seed, "seed of the initial weights and the shuffle")->capture_default_str();
  app.add_option("--load", options.load_path, "start from the weights in this safetensors file")
      ->check(CLI::ExistingFile);
  app.add_option("--save", options.save_path, "write the final weights here (empty: do not save)")
      ->capture_default_str();
  app.add_option("--shuffle", options.shuffle, "shuffle the samples every epoch")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--precision", options.precision,
                 "the GEMMs' precision: fp32, bf16 (mixed: bf16 products, f32 sums "
                 "and master weights) or fp16 (the same in IEEE half, with dynamic loss scaling)")
      ->check(precision_choice())
      ->capture_default_str();
  app.add_option("--checkpoint-dir", options.checkpoint_dir, "checkpoint every epoch here, and resume from it");
  app.add_option("--init-method", options.init_method,
                 "where the workers meet: the store's tcp://host:port (under a launcher: env:// unless given)")
      ->capture_default_str();
  // Every wait of the job (rendezvous, each collective) is bounded by TINYDDP_TIMEOUT (comm/timeout.h);
  // --timeout sets it here, and the workers this program spawns inherit it.
  app.add_option_function<double>(
         "--timeout", [](double seconds) { setenv("TINYDDP_TIMEOUT", std::to_string(seconds).c_str(), 1); },
         "seconds any wait may last (rendezvous, each collective) before the job fails naming the rank it waited "
         "for (default: $TINYDDP_TIMEOUT, else 300)")
      ->check(CLI::PositiveNumber);
}

// Before any work (and before any worker is spawned): --save names a file that can be written, and
// so does TINYDDP_TRACE; TINYDDP_LOG_LEVEL and TINYDDP_DEBUG hold values they allow. Throws an Error
// naming the flag or variable. (The transports' variables are read when the workers meet, still
// before the first step.)
inline void check_inputs(const ExampleOptions& options) {
  if (!options.save_path.empty()) check_output_path("--save", options.save_path);
  (void)trace::enabled();  // reads TINYDDP_TRACE, and refuses a path that cannot be written
  (void)log_threshold();
  (void)debug_level();
}

// Writes the final weights to --save, or to a fallback path when that fails after all (the disk
// filled up during training); says where they went. Returns the exit code: 0, or 1 when only the
// fallback could be written.
template <class WriteModel>
int save_final_weights(const std::string& path, WriteModel write_model) {
  std::string written = write_with_fallback(path, write_model);
  std::printf("saved %s\n", written.c_str());
  return written == path ? 0 : command_line::kFailed;
}

// Where the workers meet. Spawning, the store listens on --init-method (the seed's
// tcp://localhost:12355 by default; only the default moves to a free port when it is taken). Under a launcher
// (tinyddp-run, torchrun, srun, mpirun) they join by env://, unless --init-method was given: then rank 0 hosts the
// store there, as all_reduce_perf does with its --init-method.
template <class MultiDeviceTrainer>
void use_init_method(const CLI::App& app, const ExampleOptions& options, MultiDeviceTrainer& trainer) {
  trainer.set_init_method(options.init_method);
  if (app.count("--init-method") == 0) return;
  // Asked for by name: it is an error when the port is taken, and the launched workers meet there too.
  trainer.multi_device_options().port_may_move = false;
  trainer.multi_device_options().launched_init_method = options.init_method;
}

// Every GPU (or the first `world_size` of them); without GPUs, or with --device cpu, `world_size` CPU
// workers (2 when it is 0).
inline std::vector<Device> choose_devices(const std::string& kind, int world_size) {
  int gpus = kind == "cpu" ? 0 : cuda_device_count();
  TINYDDP_CHECK(kind != "cuda" || gpus > 0, "--device cuda: no CUDA device is usable (", cuda_unavailable_reason(), ")",
                hint("use --device cpu"));
  if (gpus == 0) return std::vector<Device>(size_t(world_size > 0 ? world_size : 2), Device::cpu());
  TINYDDP_CHECK(world_size <= gpus, "--world-size ", world_size, " but only ", gpus, " GPUs are visible",
                hint("ask for at most ", gpus, ", or use --device cpu"));
  std::vector<Device> devices;
  for (int i = 0; i < (world_size > 0 ? world_size : gpus); ++i) devices.push_back(Device::cuda(i));
  return devices;
}

}  // namespace tinyddp::examples
