// MultiDevice and the Trainer on two fake GPUs (test/support/fake_cuda.h), through the nccl backend on fake
// NCCL: the spawner and its two workers are separate processes, as on a GPU machine, and the fake
// devices enforce one device per process -- a context on a second device is an error at the call
// that creates it. The device list is given in reverse (cuda:1 for rank 0, cuda:0 for rank 1), so a
// rank that touches devices[0] before it knows its own device, a group built for another device
// than its tensors, or a collective handed CPU tensors all fail here, with no GPU in the machine.
#include <doctest/doctest.h>

#include "tinyddp/comm/nccl/nccl_api.h"
#include "tinyddp/nn/train/addons/multi_device.h"
#include "test/gpu/multi_device_on_devices.h"
#include "test/nn/train/test_trainer_support.h"
#include "test/support/fake_cuda.h"

using namespace tinyddp;
using namespace tinyddp::testing;
using namespace std::chrono_literals;

TEST_CASE("MultiDevice on two fake GPUs listed in reverse: each process touches its own device only") {
  const char* name = "MultiDevice on two fake GPUs listed in reverse: each process touches its own device only";
  FakeCudaDevices devices({.devices = 2});  // workers see the same devices, through the environment
  Setup s(3, 1e-2);
  nn::DataLoader loader(three_class_data(80, 4), {.batch_size = 10, .shuffle = true, .seed = 5});
  nn::WithAddOns<MlpTrainer, nn::MultiDevice> trainer(*s.model, {Device::cuda(1), Device::cuda(0)}, *s.optimizer,
                                                      s.scheduler.get(), {.log_bar = false});
  nn::MultiDeviceOptions& options = trainer.multi_device_options();
  options.worker_command = {nn::this_program_command()[0], "--test-case=" + std::string(name), "--no-intro=true"};
  options.timeout = 120s;
  options.grace = 2s;
  const std::vector<float> initial = flat_weights(*s.model);
  trainer.run(2, loader);

  if (trainer.role() == nn::ProcessRole::spawned_worker) {
    CHECK(comm::nccl_available());  // so MultiDevice chose the nccl backend for CUDA devices
    CHECK(trainer.device() == Device::cuda(trainer.rank() == 0 ? 1 : 0));
    CHECK(devices.fake().devices_with_context() == std::vector<int>{trainer.device().index});
    return;
  }
  CHECK(trainer.role() == nn::ProcessRole::spawner);
  // The spawner never trains: it holds no context on any device (no N+1st process on a GPU).
  CHECK(devices.fake().devices_with_context().empty());
  CHECK(trainer.epochs_done() == 2);
  CHECK(flat_weights(*s.model) != initial);
  REQUIRE(trainer.history().size() == 2);
  CHECK(trainer.history()[1].train.at("loss") < trainer.history()[0].train.at("loss"));
}

TEST_CASE("MultiDevice on two fake GPUs over nccl ends with the weights of the same job on 2 CPU workers") {
  FakeCudaDevices devices({.devices = 2});  // workers see the same devices, through the environment
  check_multi_device_against_cpu(
      {Device::cuda(0), Device::cuda(1)},
      "MultiDevice on two fake GPUs over nccl ends with the weights of the same job on 2 CPU "
      "workers",
      /*exact=*/true);
}

TEST_CASE("MultiDevice with 2 workers on one fake GPU over the host backend ends with the CPU job's weights") {
  // What the GPU suite runs where there is one GPU: NCCL takes one GPU per rank, the host backend
  // stages both workers' CUDA tensors through pinned host memory.
  FakeCudaDevices devices({.devices = 1});
  check_multi_device_against_cpu(
      {Device::cuda(0), Device::cuda(0)},
      "MultiDevice with 2 workers on one fake GPU over the host backend ends with the CPU job's weights",
      /*exact=*/true, "host");
}
