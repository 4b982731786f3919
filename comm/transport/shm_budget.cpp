#include "tinyddp/comm/transport/shm_budget.h"

#include <sched.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <thread>

#include "tinyddp/comm/tuning.h"
#include "tinyddp/core/env.h"

namespace tinyddp::comm {

namespace {

size_t mem_available_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  size_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib << 10;
  return SIZE_MAX;  // unknown: nothing to refuse on
}

std::string mib(size_t bytes) {
  char text[32];
  if (bytes >= (size_t(10) << 30))
    std::snprintf(text, sizeof text, "%.1f GiB", double(bytes) / double(size_t(1) << 30));
  else
    std::snprintf(text, sizeof text, "%.0f MiB", double(bytes) / double(1 << 20));
  return text;
}

}  // namespace

HostCapacity read_host_capacity() {
  HostCapacity host;
  struct statvfs shm {};
  // No /dev/shm: nothing to refuse on here (a job that needs it fails at shm_open, saying so).
  host.shm_free_bytes = ::statvfs("/dev/shm", &shm) == 0 ? size_t(shm.f_bavail) * size_t(shm.f_frsize) : SIZE_MAX;
  host.mem_available_bytes = mem_available_bytes();
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  const int affinity = ::sched_getaffinity(0, sizeof allowed, &allowed) == 0 ? CPU_COUNT(&allowed) : 0;
  host.cores = unsigned(affinity > 0 ? affinity : int(std::max(1u, std::thread::hardware_concurrency())));
  return host;
}

size_t planned_fifo_bytes(size_t fifo_bytes, bool ring_neighbour) {
  return ring_neighbour ? fifo_bytes : std::min(fifo_bytes, tuning::kShmWindowFifoBytes);
}

size_t shm_bytes_per_rank(int local_ranks, size_t fifo_bytes) {
  if (local_ranks < 2) return 0;
  const size_t neighbours = local_ranks == 2 ? 1 : 2;
  const size_t others = size_t(local_ranks - 1) - neighbours;
  // Each fifo also takes a page of counters.
  return neighbours * (planned_fifo_bytes(fifo_bytes, true) + 4096) +
         others * (planned_fifo_bytes(fifo_bytes, false) + 4096);
}

JobEstimate estimate_job(int workers, size_t fifo_bytes, size_t ram_per_worker) {
  JobEstimate job;
  job.workers = workers;
  if (workers < 1) return job;
  job.shm_bytes = size_t(workers) * shm_bytes_per_rank(workers, fifo_bytes);
  job.ram_bytes = size_t(workers) * ram_per_worker + job.shm_bytes;
  return job;
}

std::string job_does_not_fit(const JobEstimate& job, const HostCapacity& host) {
  const bool shm_short = job.shm_bytes > host.shm_free_bytes;
  const bool ram_short = job.ram_bytes > host.mem_available_bytes;
  if (!shm_short && !ram_short) return "";
  std::ostringstream why;
  why << job.workers << " workers on " << host.cores << " core(s) do not fit this host: they need about "
      << mib(job.shm_bytes) << " of /dev/shm for their shared-memory fifos (" << mib(host.shm_free_bytes)
      << " free there) and " << mib(job.ram_bytes)
      << " of RAM with them (MemAvailable: " << mib(host.mem_available_bytes)
      << "); hint: start fewer workers per host (";
  if (job.workers > int(host.cores)) why << "more than one per core only adds waiting; ";
  why << "spread them over more hosts), or lower TINYDDP_SHM_FIFO_BYTES";
  if (shm_short) why << ", or enlarge /dev/shm (Docker: --shm-size)";
  return why.str();
}

size_t configured_fifo_bytes() {
  return env::unsigned_integer("TINYDDP_SHM_FIFO_BYTES", 0, size_t(1) << 40).value_or(tuning::kShmFifoBytes);
}

}  // namespace tinyddp::comm
