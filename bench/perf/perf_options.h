// PerfOptions: the command line every collective benchmark shares. nccl-tests' flags, names and
// defaults (its README, "Arguments"), and tinyddp's own: --backend, --transport, --algo, --device,
// --init-method, --csv.
//
// Every flag is checked by name before anything starts, and a bad one is a UsageError whose message
// names the flag, the value and what to write instead ("-b: 'abc' is not a size (examples: 8, 64K,
// 1M)"). The checks that need the world (a root beyond the last rank, buffers beyond the memory)
// come after the ranks have met: see perf_run.h.
#pragma once

#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "tinyddp/comm/reduce_op.h"
#include "tinyddp/core/dtype.h"

namespace tinyddp::bench {

class PerfCollective;

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct PerfOptions {
  // Sizes: from min_bytes to max_bytes, multiplying by step_factor when it is above 1, else adding
  // step_bytes (nccl-tests' rule).
  size_t min_bytes = size_t(32) << 20;
  size_t max_bytes = size_t(32) << 20;
  size_t step_bytes = size_t(1) << 20;
  size_t step_factor = 1;
  // What each row runs (-d all / -o all / -r all run every one in turn).
  std::vector<DType> types{DType::f32};
  std::vector<comm::ReduceOp> ops{comm::ReduceOp::sum};
  int root = 0;
  bool all_roots = false;
  // Timing.
  int iters = 20;
  int warmup_iters = 1;
  int agg_iters = 1;
  int run_cycles = 1;  // 0: forever
  int average = 1;     // the time across ranks: 0 rank 0, 1 mean, 2 min, 3 max
  bool per_iter_timing = false;
  int per_iter_skip = 0;
  bool blocking = false;
  // Checking and reporting.
  bool check = true;
  bool report_timestamps = false;
  int timeout_s = 0;    // 0: the library's default
  int64_t unalign = 0;  // elements
  // -R, nccl-tests' buffer registration: 0 ordinary buffers, 2 symmetric buffers
  // (ProcessGroup::allocate_symmetric, NCCL's ncclMemAlloc + window registration). 1, registering
  // buffers allocated as usual, is refused: the host backend has no such registration.
  int registration = 0;
  std::string json_file;
  std::string csv_file;
  // tinyddp.
  std::string backend = "host";
  std::string transport = "auto";
  std::string algo = "auto";
  std::string device;  // "": cpu for host, cuda for nccl
  std::string init_method = "env://";
  // Every rank writes its whole input before each timed call (the write's own time left out), as a
  // backward pass writes the gradients of a DDP bucket before its all-reduce: the input's cache lines
  // are then the writer's, not where the previous call left them. Needs -z 1 and host memory.
  bool rewrite = false;

  std::string program;            // argv[0]'s file name
  std::vector<std::string> argv;  // as given, for the JSON

  // The sizes of the rows, in order (at most `limit` of them).
  std::vector<size_t> sizes(size_t limit = size_t(-1)) const;
};

// Parses and checks the command line. nullopt when --help was asked (the help is printed).
std::optional<PerfOptions> parse_perf_options(int argc, char** argv, const PerfCollective& collective);

// "-b: 'abc' is not a size (examples: 8, 64K, 1M)" unless `text` is a size: a number with an
// optional K, M or G (binary, as nccl-tests reads them; KB, KiB, ... too).
size_t parse_size(const std::string& flag, const std::string& text);

// nccl-tests' names of the types (float, double, int32, int64, ...) and back.
const char* nccl_type_name(DType dtype);

}  // namespace tinyddp::bench
