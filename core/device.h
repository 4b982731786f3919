// Device: where a tensor's memory lives, "cpu" or "cuda:N".
#pragma once

#include <string>
#include <vector>

namespace tinyddp {

struct Device {
  enum class Kind { cpu, cuda };
  Kind kind = Kind::cpu;
  int index = 0;  // the CUDA ordinal; always 0 for the CPU

  static Device cpu() { return {Kind::cpu, 0}; }
  static Device cuda(int index = 0) { return {Kind::cuda, index}; }
  // Parses "cpu", "cuda" (= cuda:0) or "cuda:N". Throws on anything else. Does not check that the
  // device exists: that happens when memory is first allocated on it (see require_cuda_device).
  static Device parse(const std::string& text);

  bool is_cpu() const { return kind == Kind::cpu; }
  bool is_cuda() const { return kind == Kind::cuda; }
  std::string str() const;

  friend bool operator==(const Device& a, const Device& b) { return a.kind == b.kind && a.index == b.index; }
  friend bool operator!=(const Device& a, const Device& b) { return !(a == b); }
};

// ---- which device a rank uses ----
//
// Pure functions of what a process knows (no CUDA call), so that every rule is tested on machines
// without GPUs. A data-parallel job runs one process per device; `local_rank` is the process's
// index among the `local_world_size` processes of its host.

// The device of local rank `local_rank` from the list a job was given (MultiDevice's devices: one per
// local rank, in order). `visible_cuda_devices` is how many this process sees; `one_gpu_per_rank` is
// the nccl backend's rule (NCCL refuses two ranks on one GPU). `visible_devices_restricted`:
// CUDA_VISIBLE_DEVICES is set in this process (cuda_visible_devices_restricted()).
//   - the list names a device for this local rank: that one (cuda:1, cuda:0 is a valid list);
//   - CPU lists are shared round-robin (CPU workers have nothing to share);
//   - a CUDA list shorter than the local ranks is valid when the launcher gave each process its own
//     GPUs (CUDA_VISIBLE_DEVICES set, and fewer visible devices than local ranks), and then every
//     process's cuda:N is its own; otherwise two ranks would share a GPU -- `-n 2` on a host with one
//     GPU -- refused under one_gpu_per_rank (before NCCL's own "Duplicate GPU"), shared round-robin
//     without it.
// Throws naming the list, the local rank and what to change.
Device device_for_local_rank(const std::vector<Device>& devices, int local_rank, int local_world_size,
                             int visible_cuda_devices, bool one_gpu_per_rank, bool visible_devices_restricted);

// The CUDA device of a process group that was not told one: the local rank's when it is known (-1:
// unknown), else the rank's, when that device is visible; cuda:0 when the process sees exactly one
// device and CUDA_VISIBLE_DEVICES is set (`visible_devices_restricted`: a per-rank choice). Throws
// otherwise, rather than guess a device another rank may be using: a second rank on a host with one
// GPU is refused here, naming the count, instead of failing inside NCCL ("Duplicate GPU").
int default_cuda_device(int local_rank, int rank, int visible_cuda_devices, bool visible_devices_restricted);

// Whether CUDA_VISIBLE_DEVICES is set (non-empty) in this process: its launcher chose its GPUs.
bool cuda_visible_devices_restricted();

}  // namespace tinyddp
