// The nccl backend's factory. Built only when NCCL was found (TINYDDP_WITH_NCCL); the class
// itself stays inside nccl_backend.cpp so nothing outside comm/nccl/ sees nccl.h or CUDA headers.
#pragma once

#include <memory>

#include "comm/process_group.h"

namespace tinyddp::comm {

// The rank's device is options.device, else LOCAL_RANK, else rank modulo the device count.
std::shared_ptr<ProcessGroup> create_nccl_process_group(std::shared_ptr<Store> store, int rank, int size,
                                                        const ProcessGroupOptions& options);

}  // namespace tinyddp::comm
