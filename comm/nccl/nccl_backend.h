// The nccl backend: NVIDIA's collectives on CUDA tensors, behind the ProcessGroup interface. The
// class stays inside nccl_backend.cpp; it calls NCCL through NcclApi (nccl_api.h), so this code is
// built everywhere and runs on fake devices in tests (test/support/fake_nccl.h), and the real NCCL is loaded only
// when a group is made on a GPU machine.
#pragma once

#include <memory>

#include "tinyddp/comm/process_group.h"

namespace tinyddp::comm {

// The rank's device is options.device; when that is -1, default_cuda_device(LOCAL_RANK, rank, ...)
// (core/device.h) picks it.
std::shared_ptr<ProcessGroup> create_nccl_process_group(std::shared_ptr<Store> store, int rank, int size,
                                                        const ProcessGroupOptions& options);

}  // namespace tinyddp::comm
