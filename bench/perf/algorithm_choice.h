// --algo: the algorithm a benchmark asks the library to use, instead of the library's own choice
// by size ("auto").
//
// The names belong to the library, not to the benchmark: a new algorithm in the library needs no
// change here once the library takes a name.
//   - nccl backend: --algo is NCCL_ALGO (Ring, Tree, NVLS, CollnetDirect, ...), set before the
//     communicator is created; NCCL checks it.
//   - host backend: handed to the process group as ProcessGroupOptions::algorithm. All-reduce has
//     ring, direct (the one-round exchange of small messages), rd (recursive doubling),
//     rabenseifner and hier (hierarchical, for ranks that share hosts); see
//     comm/algorithms/algorithm_selection.h. The other collectives have one algorithm each (ring).
#pragma once

#include <string>

#include "tinyddp/comm/process_group.h"

namespace tinyddp::bench {

class PerfCollective;

// Throws UsageError for a name the library cannot take for this collective and backend.
void check_algorithm(const std::string& algo, const std::string& backend, const PerfCollective& collective);
// Applies a checked --algo to the options of the group about to be created.
void apply_algorithm(const std::string& algo, const std::string& backend, comm::ProcessGroupOptions& options);
// What --help says about --algo.
std::string algorithm_help(const PerfCollective& collective);

}  // namespace tinyddp::bench
