// The data loader's pin_memory on fake CUDA devices: batches in pinned memory when asked, ordinary
// memory otherwise (core/allocator.h: only what asks for it is pinned).
#include <doctest/doctest.h>

#include "tinyddp/core/cuda_runtime.h"
#include "tinyddp/nn/data/data_loader.h"
#include "test/support/fake_cuda.h"

using namespace tinyddp;

TEST_CASE("the data loader pins its batches when asked, and only then") {
  FakeCudaDevices devices({.devices = 1});
  cuda_set_device(0);
  Tensor on_gpu = Tensor::zeros({4}, DType::f32, Device::cuda(0));
  auto data = std::make_shared<nn::TensorDataset>(Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2}),
                                                  Tensor::from_vector<int64_t>({0, 1, 0}, {3}));
  for (bool pin : {false, true}) {
    nn::DataLoader loader(data, {.batch_size = 2, .pin_memory = pin});
    int64_t rows = 0;
    for (const nn::Batch& batch : loader) {
      CHECK(batch.inputs.storage()->pinned() == pin);
      CHECK(batch.targets.storage()->pinned() == pin);
      rows += batch.inputs.size(0);
    }
    CHECK(rows == 3);
  }
}
