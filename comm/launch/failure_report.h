// Failure report: telling torchrun which rank failed first, and why.
//
// torchrun prints a "Root Cause" when a job fails: of the ranks it finds ended, the one with the
// earliest timestamp in its TORCHELASTIC_ERROR_FILE (whole seconds), or, with no file, the time the
// agent noticed (and among equals, the lowest rank). Left to that, it names the wrong rank almost
// every time: a rank that raised an error and the peers that then lost it fail in the same second,
// and a rank killed by a signal writes no file and gets the agent's (later) time. So a failing rank,
// before it exits:
//
//   1. settles, through the job's store, which rank failed first: a peer on this host whose process
//      is gone (killed: it could say nothing), else the first rank to get here (compare_set);
//   2. writes its error file in torchrun's format ({"message": {"message": ..., "extraInfo":
//      {"py_callstack": ..., "timestamp": ...}}}), with its own time when it failed first, or a second
//      after the first failure's time when it did not (its error is a consequence);
//   3. when it did not fail first, waits (up to `linger`, 10 s) for torchrun to stop it: torchrun
//      checks its workers every few seconds (5 s in PyTorch 1.13) and counts every worker it finds
//      ended, so a peer that exits at once would be one more failure next to the real one.
//
// Outside torchrun (no TORCHELASTIC_ERROR_FILE) it does nothing: tinyddp-run names the root cause
// itself. MultiDevice calls it for every rank it runs under a launcher; a program of its own calls
// it from the catch around its work, while the job's store is still open.
#pragma once

#include <chrono>
#include <string>

#include "tinyddp/comm/store/store.h"

namespace tinyddp::comm {

struct FailureReportOptions {
  std::chrono::milliseconds linger = std::chrono::seconds(10);
  // torchrun's variable; empty: read TORCHELASTIC_ERROR_FILE.
  std::string error_file;
};

// `job_store`: the store as rendezvous() scoped it (Rendezvous::store), or nullptr when there is none
// (the report then only writes the file, with this rank as the first failure).
void report_failure_to_launcher(Store* job_store, int rank, const std::string& message,
                                FailureReportOptions options = {});

// The error file's JSON for `message` failing at `unix_seconds` (what torchrun reads back).
std::string torchelastic_error_json(const std::string& message, long long unix_seconds);

}  // namespace tinyddp::comm
