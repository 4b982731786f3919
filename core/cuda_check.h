// CUDA_CHECK / CUBLAS_CHECK: turn a failed CUDA or cuBLAS call into a tinyddp::Error that names the
// call, its file:line and the library's own description of the failure.
// Only sources compiled with CUDA include this header.
#pragma once

#include <cuda_runtime_api.h>

#include "tinyddp/core/error.h"

#define CUDA_CHECK(call)                                                                                             \
  do {                                                                                                               \
    cudaError_t tinyddp_cuda_status = (call);                                                                        \
    if (tinyddp_cuda_status != cudaSuccess)                                                                          \
      ::tinyddp::detail::fail(#call, __FILE__, __LINE__,                                                             \
                              ::tinyddp::detail::concat("CUDA call failed: ", cudaGetErrorName(tinyddp_cuda_status), \
                                                        " (", cudaGetErrorString(tinyddp_cuda_status), ")"));        \
  } while (0)

// Checks the launch of the kernel just issued (bad configuration, no device code for this GPU).
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
