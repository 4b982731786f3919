// Scratch device memory for the kernels that need some (per-row losses, flags, partial sums): one
// buffer per slot, per device and per host thread, grown as needed and kept. The CUDA half has no
// tensor allocator of its own (it sees only pointers), and a cudaMalloc per loss would synchronise
// the device every step. Per host thread, because two threads may compute losses on one device at
// once; one thread launches on one stream (the legacy default), so its next kernel using a slot runs
// after the last one that did (the losses also end with a blocking copy to the host; bias_grad's
// partial sums need not). Growing a buffer frees the old one with cudaFree, which waits for the device.
#pragma once

#include <cstddef>

namespace tinyddp::kernels::cuda::detail {

enum class Scratch { row_values, counters, partial_sums, bias_partials, count };

// At least `bytes` of device memory on `device`, for this thread's use of `slot`.
void* scratch(int device, Scratch slot, size_t bytes);

}  // namespace tinyddp::kernels::cuda::detail
