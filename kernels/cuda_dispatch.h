// Which implementation a kernel call takes: the CUDA kernels for tensors on a real GPU, the CPU loop
// for CPU tensors. Fake CUDA devices (test/support/fake_cuda.h) register a kernel table of their own
// (test/support/fake_kernels.cpp) whose entries queue the CPU loops on the fake device's default stream,
// so their tensors take the same path as a GPU's -- asynchronous, in stream order -- and compute exactly
// the arithmetic the CPU tests check.
#pragma once

#include "tinyddp/core/tensor.h"
#include "tinyddp/kernels/cuda/cuda_kernels.h"

namespace tinyddp::kernels {

// The CUDA half's kernel table when `t` lives on a real GPU (loading the CUDA half if need be);
// nullptr for CPU tensors and tensors on fake devices.
const cuda::Kernels* cuda_kernels_for(const Tensor& t);

// The fake devices' kernel table (the test-support library registers it); fake-device tensors run the
// CPU loops inline while none is registered.
void set_stand_in_kernels(const cuda::Kernels* kernels);

}  // namespace tinyddp::kernels
