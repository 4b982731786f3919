// Whether the buffers of a run fit in memory, checked before any is allocated: a benchmark asked
// for -e 64G on a 24 GiB host must say so at once, not be killed by the kernel minutes later.
//
// Each rank needs its send and receive buffers at -e (for the largest of the -d types), on its
// device; ranks on one host share that host's memory (MemAvailable in /proc/meminfo), ranks on one
// GPU that GPU's free memory. CUDA buffers also need a host copy for the checks, and, with the
// host backend, the host staging copies the backend makes.
#pragma once

#include <cstddef>
#include <string>

#include "tinyddp/core/device.h"

namespace tinyddp::bench {

struct PerfOptions;
class PerfCollective;

struct MemoryNeed {
  size_t device_bytes = 0;  // the buffers, on the rank's device (the host for CPU runs)
  size_t host_bytes = 0;    // host copies a CUDA run needs besides
};

// What one rank needs for the largest row of `options`, over all its types.
MemoryNeed memory_need(const PerfOptions& options, const PerfCollective& collective, int world, Device device);

// "" when `ranks_here` ranks of this need fit in this host's (and GPU's) free memory; else the
// reason, naming -e and the largest -e that would fit.
std::string memory_refusal(const PerfOptions& options, const PerfCollective& collective, int world, Device device,
                           int ranks_here);

// Bytes as "1.5 GiB".
std::string format_bytes(double bytes);

}  // namespace tinyddp::bench
