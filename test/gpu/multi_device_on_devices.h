// MultiDevice on CUDA devices against the same job on 2 CPU workers: one test case runs both jobs, each
// spawning its workers by re-executing this test binary on that test case (as MultiDevice does for a
// user's program). The spawner tells its workers which of the two jobs they belong to through the
// environment they inherit. Shared by the fake-device suite (test/nn/train/test_trainer_fake_gpus.cpp)
// and the GPU suite (test/gpu/test_gpu_ddp.cpp).
#pragma once

#include <doctest/doctest.h>
#include <stdlib.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "tinyddp/kernels/ops.h"
#include "tinyddp/nn/train/addons/multi_device.h"
#include "test/nn/train/test_trainer_support.h"
#include "test/test_support.h"

namespace tinyddp::testing {

// Set by the spawner for the job whose workers it starts next: "cpu" or "devices".
inline constexpr const char* kMultiDeviceJobVariable = "TINYDDP_TEST_MULTI_DEVICE_JOB";

// Two epochs of the Trainer under MultiDevice on `devices`; returns what the process holds afterwards
// (in the spawner: rank 0's final weights).
inline std::vector<float> multi_device_job(const std::vector<Device>& devices, const std::string& test_case,
                                           const std::string& backend) {
  Setup s(7, 1e-2);
  nn::DataLoader loader(three_class_data(40, 4), {.batch_size = 10, .shuffle = true, .seed = 5});
  nn::WithAddOns<MlpTrainer, nn::MultiDevice> trainer(*s.model, devices, *s.optimizer, s.scheduler.get(),
                                                      {.log_bar = false});
  nn::MultiDeviceOptions& options = trainer.multi_device_options();
  options.worker_command = {nn::this_program_command()[0], "--test-case=" + test_case, "--no-intro=true"};
  options.timeout = std::chrono::seconds(120);
  options.grace = std::chrono::seconds(2);
  options.backend = backend;
  trainer.run(2, loader);
  if (trainer.role() != nn::ProcessRole::spawned_worker) CHECK(trainer.epochs_done() == 2);
  return flat_weights(*s.model);
}

// Runs the job on 2 CPU workers (host backend), then on `devices` over `backend` ("": MultiDevice's
// own choice, nccl for CUDA devices); the spawner compares rank 0's final weights -- bitwise where `exact` (fake
// devices run the CPU kernels), else within 1e-5 + 1e-4 |w| (a GPU's GEMM sums in another order).
// `test_case` is the calling test case's name, which the workers run. Returns true in a worker.
inline bool check_multi_device_against_cpu(const std::vector<Device>& devices, const std::string& test_case, bool exact,
                                           const std::string& backend = "") {
  // doctest splits --test-case filters at commas: a name with one would select no test case in the workers.
  REQUIRE_MESSAGE(test_case.find(',') == std::string::npos, "a MultiDevice test case's name has no comma");
  kernels::set_cpu_threads(1);  // every process's products on one GEMM thread: one summation order
  if (const char* job = std::getenv(kMultiDeviceJobVariable);
      job && nn::detect_process_role(devices.size()) == nn::ProcessRole::spawned_worker) {
    const bool on_cpu = std::strcmp(job, "cpu") == 0;
    multi_device_job(on_cpu ? std::vector<Device>(devices.size(), Device::cpu()) : devices, test_case,
                     on_cpu ? "host" : backend);
    return true;
  }
  ::setenv(kMultiDeviceJobVariable, "cpu", 1);
  const std::vector<float> on_cpu = multi_device_job(std::vector<Device>(devices.size(), Device::cpu()), test_case,
                                                     "host");
  ::setenv(kMultiDeviceJobVariable, "devices", 1);
  const std::vector<float> on_devices = multi_device_job(devices, test_case, backend);
  ::unsetenv(kMultiDeviceJobVariable);
  CHECK(on_cpu != flat_weights(*Setup(7, 1e-2).model));  // the job did train
  if (exact)
    check_identical(on_devices, on_cpu, "MultiDevice on devices against 2 CPU workers: rank 0's final weights");
  else
    check_close(on_devices, on_cpu, 1e-5, 1e-4, "MultiDevice on devices against 2 CPU workers: rank 0's final weights");
  return false;
}

}  // namespace tinyddp::testing
