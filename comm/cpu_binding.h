// CPU binding: which CPUs each rank of a host runs on, and which core its communication thread takes.
//
// Ranks that exchange through memory wake each other constantly, and the scheduler likes to wake a
// thread on the CPU of the thread that woke it: left alone, two ranks end up taking turns on one
// core while the other idles. One core each (what mpirun's default binding does) stops that. Only
// when every rank of the host gets a core of its own; TINYDDP_BIND=none turns it off. The CPUs come
// from this process's allowed set, so a launcher's own binding is respected.
//
// Two levels: tinyddp-run starts each worker on its own share of the node's CPUs (as mpirun binds
// its ranks), which also keeps a blocking caller -- a rank's own thread running its collectives --
// off its peers' cores; inside a rank, the communication thread is pinned to one CPU of the rank's.
#pragma once

#include <sched.h>

#include <string>
#include <vector>

namespace tinyddp::comm {

// The CPU for the communication thread of the local_index-th of local_count ranks on this host, or
// -1 for none (fewer CPUs than ranks, a single rank, or TINYDDP_BIND=none).
int pick_communication_cpu(int local_index, int local_count);

// The CPUs a launcher gives the local_index-th of local_count workers it starts on this host: an equal
// share, in order, of the CPUs this process may use (worker i: the i-th of local_count runs of them).
// Empty for none: a single worker, more workers than CPUs, or TINYDDP_BIND=none.
std::vector<int> worker_cpus(int local_index, int local_count);

// How many threads a rank's own compute (its GEMMs) runs, given how many CPUs it may run on, how many
// the host has online, and how many ranks share the host: all of its own when it was started on a
// subset of the host's (a launcher bound it: tinyddp-run, srun --cpu-bind, mpirun), else an even share
// of the host's, so that the ranks together do not oversubscribe the cores.
int compute_threads(int allowed_cpus, int online_cpus, int local_ranks);

// How many CPUs this process may run on (its affinity mask, whatever TINYDDP_BIND says); at least 1.
int allowed_cpu_count();

// A list of CPUs as Linux writes one (Cpus_allowed_list in /proc/<pid>/status, taskset -c): "0-3,8".
std::string cpu_list_text(const std::vector<int>& cpus);
// The CPUs such a list names, in order; throws on anything else.
std::vector<int> parse_cpu_list(const std::string& text);
// The CPUs this process may run on (its affinity mask) as such a list; "" when they cannot be read.
std::string own_cpu_list();
// Whether a rank that runs on the CPUs `mine` names may share one with a rank on any of `others`
// (lists as above; an empty list means unknown, and may).
bool may_share_cpus(const std::string& mine, const std::vector<std::string>& others);

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
