#include "bench/perf/algorithm_choice.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <vector>

#include "bench/perf/perf_collective.h"
#include "bench/perf/perf_options.h"

namespace tinyddp::bench {
namespace {

// Whether the library's group options take an algorithm by name.
template <typename Options>
constexpr bool takes_algorithm_name = requires(Options options, std::string name) { options.algorithm = name; };

// The ring backend's algorithms while it has no algorithm option (see the header).
std::vector<std::string> ring_algorithms(const PerfCollective& collective) {
  if (collective.name() == "all_reduce") return {"auto", "ring", "direct"};
  return {"auto", "ring"};
}

template <typename Options>
void set_ring_algorithm(const std::string& algo, Options& options) {
  if constexpr (takes_algorithm_name<Options>) {
    options.algorithm = algo;
  } else {
    if (algo == "ring") options.small_message_bytes = 0;
    if (algo == "direct") options.small_message_bytes = std::numeric_limits<size_t>::max();
  }
}

}  // namespace

void check_algorithm(const std::string& algo, const std::string& backend, const PerfCollective& collective) {
  if (algo.empty()) throw UsageError("--algo: empty; use auto for the library's own choice");
  if (backend != "ring" || takes_algorithm_name<comm::ProcessGroupOptions>) return;  // the library checks
  auto names = ring_algorithms(collective);
  if (std::find(names.begin(), names.end(), algo) != names.end()) return;
  std::string list;
  for (size_t i = 0; i < names.size(); ++i) list += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  throw UsageError("--algo: '" + algo + "' is not an algorithm the ring backend has for " + collective.name() + "; use " +
                   list);
}

void apply_algorithm(const std::string& algo, const std::string& backend, comm::ProcessGroupOptions& options) {
  if (algo == "auto") return;
  if (backend == "nccl") {
    ::setenv("NCCL_ALGO", algo.c_str(), 1);
    return;
  }
  set_ring_algorithm(algo, options);
}

std::string algorithm_help(const PerfCollective& collective) {
  std::string names;
  for (const auto& n : ring_algorithms(collective)) names += (names.empty() ? "" : ", ") + n;
  return "auto: the library's choice by size. Ring backend: " + names +
         (collective.name() == "all_reduce" ? " (direct: the one-round exchange of small messages)" : "") +
         ". nccl backend: an NCCL_ALGO value (Ring, Tree, ...)";
}

}  // namespace tinyddp::bench
