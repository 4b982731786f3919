#include "bench/perf/algorithm_choice.h"

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "bench/perf/perf_collective.h"
#include "bench/perf/perf_options.h"

namespace tinyddp::bench {
namespace {

// The host backend's algorithms, as ProcessGroupOptions::algorithm names them.
std::vector<std::string> host_algorithms(const PerfCollective& collective) {
  if (collective.name() == "all_reduce") return {"auto", "ring", "direct", "rd", "rabenseifner", "hier"};
  return {"auto", "ring"};
}

}  // namespace

void check_algorithm(const std::string& algo, const std::string& backend, const PerfCollective& collective) {
  if (algo.empty()) throw UsageError("--algo: empty; use auto for the library's own choice");
  if (backend != "host") return;  // NCCL checks NCCL_ALGO itself
  auto names = host_algorithms(collective);
  if (std::find(names.begin(), names.end(), algo) != names.end()) return;
  std::string list;
  for (size_t i = 0; i < names.size(); ++i) list += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  throw UsageError("--algo: '" + algo + "' is not an algorithm the host backend has for " + collective.name() +
                   "; use " + list);
}

void apply_algorithm(const std::string& algo, const std::string& backend, comm::ProcessGroupOptions& options) {
  if (algo == "auto") return;
  if (backend == "nccl") {
    ::setenv("NCCL_ALGO", algo.c_str(), 1);
    return;
  }
  options.algorithm = algo;  // only all-reduce has a choice; "ring" is the others' one algorithm
}

std::string algorithm_help(const PerfCollective& collective) {
  std::string names;
  for (const auto& n : host_algorithms(collective)) names += (names.empty() ? "" : ", ") + n;
  return "auto: the library's choice by size. Host backend: " + names +
         (collective.name() == "all_reduce"
              ? " (direct: one-round exchange; rd: recursive doubling; hier: in-host, then across hosts; see "
                "comm/algorithms/algorithm_selection.h)"
              : "") +
         ". nccl backend: an NCCL_ALGO value (Ring, Tree, ...)";
}

}  // namespace tinyddp::bench
