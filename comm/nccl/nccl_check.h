// NCCL_CHECK: turns a failed NCCL call into a tinyddp::Error that names the call, its file:line,
// NCCL's name for the result and NCCL's own description of the last error.
// Only sources compiled with NCCL include this header.
#pragma once

#include <nccl.h>

#include "tinyddp/core/error.h"

#define NCCL_CHECK(call)                                                                                               \
  do {                                                                                                                 \
    ncclResult_t tinyddp_nccl_status = (call);                                                                         \
    if (tinyddp_nccl_status != ncclSuccess && tinyddp_nccl_status != ncclInProgress)                                   \
      ::tinyddp::detail::fail(#call, __FILE__, __LINE__,                                                               \
                              ::tinyddp::detail::concat("NCCL call failed: ", ncclGetErrorString(tinyddp_nccl_status), \
                                                        " (", ncclGetLastError(nullptr),                               \
                                                        "); hint: run with NCCL_DEBUG=WARN for NCCL's own log"));      \
  } while (0)
