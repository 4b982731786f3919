// WorkerOutput: what tinyddp-run does with each line its workers print. torchrun's --tee,
// --redirects and --local-ranks-filter do the same jobs; these names say what they do:
//
//   --prefix TEMPLATE   every line printed starts with TEMPLATE, its {rank}, {local_rank} and {node}
//                       filled in; "[rank {rank}] " unless given; --prefix '' prints the lines as written
//   --print-ranks LIST  whose standard output reaches tinyddp-run's: "all" (the default) or ranks and
//                       ranges, "0" or "0,4-7". Standard error of every rank is always printed, so that
//                       an error is never hidden
//   --log-dir DIR       every rank's whole output also in DIR/rank<N>.stdout and DIR/rank<N>.stderr, as
//                       the worker wrote it (no prefix), whatever --print-ranks says; appended to
//                       across restarts
//
// nccl-tests under mpirun prints rank 0's table alone, with no prefix, and scripts read it that way:
// `tinyddp-run --print-ranks 0 --prefix '' -n 8 all_reduce_perf ...` prints exactly that.
#pragma once

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>

namespace tinyddp::comm {

struct WorkerOutputOptions {
  std::string prefix = "[rank {rank}] ";
  std::optional<std::set<int>> print_ranks;  // nullopt: every rank's standard output
  std::string log_dir;                       // "": no files
};

// "all" -> nullopt; "0,2-3" -> {0, 2, 3}. Throws tinyddp::Error naming what is wrong: not a rank,
// a range running backwards, or a rank outside 0 .. world_size - 1.
std::optional<std::set<int>> parse_rank_list(const std::string& text, int world_size);

// The template with its fields filled in. Throws for a field it does not know ("{host}").
std::string expand_prefix(const std::string& prefix, int rank, int local_rank, int node);

// The sink for LauncherOptions::output: call it with each line (stream 1 stdout, 2 stderr). Copies
// share the open files. Creates the log directory when given (throws when it cannot).
class WorkerOutput {
 public:
  WorkerOutput(WorkerOutputOptions options, int nproc_per_node, int node_rank);
  void operator()(int rank, int stream, std::string_view line) const;

 private:
  struct Files;
  WorkerOutputOptions options_;
  int nproc_per_node_;
  int node_rank_;
  std::shared_ptr<Files> files_;
};

}  // namespace tinyddp::comm
