// ShmBudget: what a job's workers and their shared-memory fifos take on one host, and whether the
// host has it, so that a job too large for the host is refused with a reason before it starts
// instead of meeting the OOM killer half-way through.
//
// The fifos (shm_transport.h): a rank sends to its two ring neighbours on this host through fifos
// of the full size (TINYDDP_SHM_FIFO_BYTES), and to any other local peer through a small window
// (tuning::kShmWindowFifoBytes). Each fifo is created on the first send, so the estimate below is
// the most a rank can map: every peer reached, as the small-message direct exchange does.
//
//   /dev/shm:  workers x (2 x fifo + (workers - 3) x window)     tmpfs: these bytes are RAM too
//   RAM:       workers x (tuning::kWorkerRamBytes) + the /dev/shm above
#pragma once

#include <cstddef>
#include <string>

namespace tinyddp::comm {

// What the host offers right now; SIZE_MAX where it cannot be told.
struct HostCapacity {
  size_t shm_free_bytes = 0;       // statvfs("/dev/shm"): bytes available to an unprivileged user
  size_t mem_available_bytes = 0;  // /proc/meminfo MemAvailable
  unsigned cores = 1;              // hardware threads this process may run on
};
HostCapacity read_host_capacity();

// The fifo size a sender whose TINYDDP_SHM_FIFO_BYTES is `fifo_bytes` gives its fifo to a peer:
// the full size to a ring neighbour, the window to any other.
size_t planned_fifo_bytes(size_t fifo_bytes, bool ring_neighbour);

// The most /dev/shm bytes one of `local_ranks` ranks on a host maps in fifos of its own.
size_t shm_bytes_per_rank(int local_ranks, size_t fifo_bytes);

struct JobEstimate {
  int workers = 0;
  size_t shm_bytes = 0;  // the host's /dev/shm
  size_t ram_bytes = 0;  // the host's RAM, /dev/shm included
};
// `ram_per_worker`: a worker's own memory besides its fifos (0 when the workers already run).
JobEstimate estimate_job(int workers, size_t fifo_bytes, size_t ram_per_worker);

// Empty when `job` fits `host`; else why not, with the numbers and what to do, for an error message.
std::string job_does_not_fit(const JobEstimate& job, const HostCapacity& host);

// The configured size of each full fifo: TINYDDP_SHM_FIFO_BYTES, else tuning::kShmFifoBytes.
size_t configured_fifo_bytes();

}  // namespace tinyddp::comm
