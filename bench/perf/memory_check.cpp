#include "bench/perf/memory_check.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "tinyddp/comm/transport/shm_budget.h"
#include "tinyddp/core/cuda_runtime.h"
#include "bench/perf/perf_collective.h"
#include "bench/perf/perf_options.h"

namespace tinyddp::bench {
namespace {

size_t available_host_bytes() { return comm::read_host_capacity().mem_available_bytes; }

size_t available_device_bytes(Device device) { return cuda_free_memory(device.index); }

// The largest power of two at most `bytes`, as a size flag ("2G", "512M", ...).
std::string size_flag(double bytes) {
  if (bytes < 1) return "0";
  size_t p = 1;
  while (double(p) * 2 <= bytes) p *= 2;
  const char* units[] = {"", "K", "M", "G", "T"};
  int u = 0;
  while (p >= 1024 && u < 4) p /= 1024, ++u;
  return std::to_string(p) + units[u];
}

}  // namespace

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) bytes /= 1024, ++u;
  char text[32];
  std::snprintf(text, sizeof text, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return text;
}

MemoryNeed memory_need(const PerfOptions& options, const PerfCollective& collective, int world, Device device) {
  MemoryNeed need;
  for (DType type : options.types) {
    const size_t elem = dtype_size(type);
    CollectiveCounts c = collective.counts(options.max_bytes / elem, elem, world);
    size_t send = collective.needs_send_buffer() ? (c.send + size_t(options.unalign)) * elem : 0;
    size_t recv = (c.recv + size_t(options.unalign)) * elem;
    size_t host = 0;
    if (device.is_cuda()) {
      host = std::max(send, recv);                         // the checks' host copy
      if (options.backend == "host") host += send + recv;  // the host backend's staging
    }
    need.device_bytes = std::max(need.device_bytes, send + recv);
    need.host_bytes = std::max(need.host_bytes, host);
  }
  return need;
}

std::string memory_refusal(const PerfOptions& options, const PerfCollective& collective, int world, Device device,
                           int ranks_here) {
  MemoryNeed need = memory_need(options, collective, world, device);
  const size_t host_need = (device.is_cpu() ? need.device_bytes : need.host_bytes) * size_t(ranks_here);
  const size_t host_free = available_host_bytes();
  const size_t gpu_need = device.is_cuda() ? need.device_bytes : 0;
  const size_t gpu_free = device.is_cuda() ? available_device_bytes(device) : size_t(-1);
  std::ostringstream why;
  double fit = 0;
  if (host_need > host_free) {
    why << "each rank needs " << format_bytes(double(host_need) / ranks_here) << " of host memory for its buffers, "
        << ranks_here << " rank(s) on this host " << format_bytes(double(host_need)) << ", but "
        << format_bytes(double(host_free)) << " is available (MemAvailable)";
    fit = double(options.max_bytes) * double(host_free) / double(host_need);
  } else if (gpu_need > gpu_free) {
    why << "each rank needs " << format_bytes(double(gpu_need)) << " on " << device.str() << " for its buffers, but "
        << format_bytes(double(gpu_free)) << " is free there";
    fit = double(options.max_bytes) * double(gpu_free) / double(gpu_need);
  } else {
    return "";
  }
  return "-e " + format_bytes(double(options.max_bytes)) + ": " + why.str() + "; lower -e to " + size_flag(fit) +
         " or less";
}

}  // namespace tinyddp::bench
