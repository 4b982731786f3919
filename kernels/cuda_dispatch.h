// Which implementation a kernel call takes: the CUDA kernels for tensors on a real GPU, the CPU loop
// for everything else. Fake CUDA devices (core/fake_cuda.h) keep their memory on the host, so their
// tensors run the CPU loops, exactly the arithmetic the CPU tests check.
#pragma once

#include "tinyddp/core/tensor.h"
#include "tinyddp/kernels/cuda/cuda_kernels.h"

namespace tinyddp::kernels {

// The CUDA half's kernel table when `t` lives on a real GPU (loading the CUDA half if need be);
// nullptr for CPU tensors and tensors on fake devices.
const cuda::Kernels* cuda_kernels_for(const Tensor& t);

}  // namespace tinyddp::kernels
