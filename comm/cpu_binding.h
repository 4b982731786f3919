// CPU binding: which core a process group's communication thread runs on.
//
// Ranks that exchange through memory wake each other constantly, and the scheduler likes to wake a
// thread on the CPU of the thread that woke it: left alone, two ranks end up taking turns on one
// core while the other idles. One core each (what mpirun's default binding does) stops that. Only
// when every rank of the host gets a core of its own; TINYDDP_BIND=none turns it off. The CPUs come
// from this process's allowed set, so a launcher's own binding is respected.
#pragma once

#include <sched.h>

namespace tinyddp::comm {

// The CPU for the communication thread of the local_index-th of local_count ranks on this host, or
// -1 for none (fewer CPUs than ranks, a single rank, or TINYDDP_BIND=none).
int pick_communication_cpu(int local_index, int local_count);

// Binds the calling thread to `cpu` for good.
void bind_this_thread(int cpu);

// Binds the calling thread to `cpu` while it lives, then gives it back the CPUs it had. Leaves the
// thread as it is when those cannot be read.
class ScopedCpuBinding {
 public:
  explicit ScopedCpuBinding(int cpu);
  ~ScopedCpuBinding();
  ScopedCpuBinding(const ScopedCpuBinding&) = delete;
  ScopedCpuBinding& operator=(const ScopedCpuBinding&) = delete;

 private:
  cpu_set_t before_;
  bool bound_ = false;
};

}  // namespace tinyddp::comm
