#include "tinyddp/comm/cpu_binding.h"

#include <pthread.h>

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "tinyddp/core/env.h"
#include "tinyddp/core/error.h"

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

std::string cpu_list_text(const std::vector<int>& cpus) {
  std::string text;
  for (size_t i = 0; i < cpus.size();) {
    size_t last = i;  // the run of consecutive CPUs from cpus[i]
    while (last + 1 < cpus.size() && cpus[last + 1] == cpus[last] + 1) ++last;
    if (!text.empty()) text += ',';
    text += std::to_string(cpus[i]);
    if (last > i) text += '-' + std::to_string(cpus[last]);
    i = last + 1;
  }
  return text;
}

std::vector<int> parse_cpu_list(const std::string& text) {
  std::vector<int> cpus;
  size_t at = 0;
  auto number = [&] {
    size_t end = at;
    while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
    TINYDDP_CHECK(end > at && end - at < 7, "CPU list '", text, "': expected a CPU number at character ", at + 1,
                  hint("write CPUs as Linux does: 0-3,8"));
    const int n = std::stoi(text.substr(at, end - at));
    at = end;
    return n;
  };
  while (at < text.size()) {
    const int first = number();
    int last = first;
    if (at < text.size() && text[at] == '-') {
      ++at;
      last = number();
      TINYDDP_CHECK(last >= first, "CPU list '", text, "': the range ", first, "-", last, " runs backwards",
                    hint("write the lower CPU first: ", last, "-", first));
    }
    for (int c = first; c <= last; ++c) cpus.push_back(c);
    if (at < text.size()) {
      TINYDDP_CHECK(text[at] == ',' && at + 1 < text.size(), "CPU list '", text,
                    "': expected ',' and a CPU at character ", at + 1, hint("write CPUs as Linux does: 0-3,8"));
      ++at;
    }
  }
  return cpus;
}

std::string own_cpu_list() { return cpu_list_text(affinity_cpus()); }

bool may_share_cpus(const std::string& mine, const std::vector<std::string>& others) {
  if (mine.empty()) return true;
  std::vector<int> own = parse_cpu_list(mine);
  std::sort(own.begin(), own.end());
  for (const std::string& other : others) {
    if (other.empty()) return true;
    for (int c : parse_cpu_list(other))
      if (std::binary_search(own.begin(), own.end(), c)) return true;
  }
  return false;
}

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
