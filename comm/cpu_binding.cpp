#include "tinyddp/comm/cpu_binding.h"

#include <pthread.h>

#include <algorithm>
#include <vector>

#include "tinyddp/core/env.h"

namespace tinyddp::comm {

namespace {

// The CPUs this process's affinity mask allows, in order; empty when it cannot be read.
std::vector<int> affinity_cpus() {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return {};
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  return cpus;
}

// The CPUs this process may bind to, in order; empty when binding is off (TINYDDP_BIND=none) or they
// cannot be read.
std::vector<int> allowed_cpus() {
  enum class Bind { automatic, none };
  if (env::choice<Bind>("TINYDDP_BIND", {{"auto", Bind::automatic}, {"none", Bind::none}}) == Bind::none) return {};
  return affinity_cpus();
}

}  // namespace

int pick_communication_cpu(int local_index, int local_count) {
  const std::vector<int> cpus = allowed_cpus();
  if (local_count < 2 || int(cpus.size()) < local_count) return -1;
  return cpus[size_t(local_index) % cpus.size()];
}

std::vector<int> worker_cpus(int local_index, int local_count) {
  const std::vector<int> cpus = allowed_cpus();
  const size_t n = size_t(local_count), i = size_t(local_index);
  if (local_count < 2 || cpus.size() < n || local_index < 0 || i >= n) return {};
  return {cpus.begin() + long(i * cpus.size() / n), cpus.begin() + long((i + 1) * cpus.size() / n)};
}

int compute_threads(int allowed_cpus, int online_cpus, int local_ranks) {
  const int allowed = std::max(1, allowed_cpus), online = std::max(allowed, online_cpus);
  if (allowed < online) return allowed;
  return std::max(1, online / std::max(1, local_ranks));
}

int allowed_cpu_count() { return std::max(1, int(affinity_cpus().size())); }

void bind_this_thread(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

ScopedCpuBinding::ScopedCpuBinding(int cpu) {
  bound_ = pthread_getaffinity_np(pthread_self(), sizeof before_, &before_) == 0;
  if (bound_) bind_this_thread(cpu);
}

ScopedCpuBinding::~ScopedCpuBinding() {
  if (bound_) pthread_setaffinity_np(pthread_self(), sizeof before_, &before_);
}

}  // namespace tinyddp::comm
