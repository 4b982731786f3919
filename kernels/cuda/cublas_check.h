// CUBLAS_CHECK: turns a failed cuBLAS call into a tinyddp::Error naming the call, its file:line and
// cuBLAS's own name and description of the status (the companion of CUDA_CHECK in core/cuda_check.h).
// Only sources compiled with CUDA include this header.
#pragma once

#include <cublas_v2.h>

#include "tinyddp/core/error.h"

#define CUBLAS_CHECK(call)                                                                                 \
  do {                                                                                                     \
    cublasStatus_t tinyddp_cublas_status = (call);                                                         \
    if (tinyddp_cublas_status != CUBLAS_STATUS_SUCCESS)                                                    \
      ::tinyddp::detail::fail(#call, __FILE__, __LINE__,                                                   \
                              ::tinyddp::detail::concat("cuBLAS call failed: ",                            \
                                                        cublasGetStatusName(tinyddp_cublas_status), " (",  \
                                                        cublasGetStatusString(tinyddp_cublas_status), ")", \
                                                        "; hint: check the matrix sizes and that the GPU " \
                                                        "has free memory (nvidia-smi)"));                  \
  } while (0)
