// Flight explain: reading every rank's flight record back (comm/flight_recorder.h) and saying which
// rank the job waits for. `tinyddp-run --explain DIR` prints it; the launcher uses the verdict to name
// the root cause of a group that failed by timeout.
//
//   rank  host    pid    last queued  last started  last finished  written because
//   0     node7   4242   13           13            12             timeout
//   1     -       -      -            -             -              (no record)
//   2     node7   4244   13           13            12             timeout
//   verdict: rank 1 lags: it has no record (stopped, killed, or never ran a collective) while ranks 0, 2
//   wait in all_reduce #13 (f32 x1048576, 4 MiB, bucket 2)
//
// The rule: the furthest collective any rank started is the one the job is in; a rank that did not
// start it (its last started is lower, or it left no record) is lagging. A rank with no file at
// all counts as lagging only when the others waited (a file written because of a timeout or SIGUSR1).
// Only the newest attempt's records are read: after a restart the directory may still hold files the
// failed attempt wrote ("restart_count" in each file), and a rank of the new attempt that wrote
// nothing yet must not be judged by its predecessor's record.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tinyddp::comm {

struct RankFlightRecord {
  int rank = -1;
  bool present = false;  // false: no file for this rank
  std::string host, reason, error, group;
  int pid = 0, world_size = 0, restart_count = 0;
  int64_t last_queued = -1, last_started = -1, last_finished = -1;
  std::string last_started_op;  // "all_reduce #13 (f32 x1048576, 4 MiB, bucket 2)", "" when not in the ring
};

struct FlightExplanation {
  int world_size = 0;
  std::vector<RankFlightRecord> ranks;  // by rank, 0 .. world_size - 1
  int64_t furthest = -1;                // the furthest collective started by any rank
  std::string furthest_op;
  std::vector<int> lagging;  // the verdict
  std::vector<int> waiting;  // ranks in the furthest collective, not finished
  std::string verdict;       // one sentence
  int restart_count = 0;     // the attempt the records are from
  int earlier_records = 0;   // files of earlier attempts, left out
};

// Reads DIR/rank-*.json of the group `group` ("default": rank-<r>.json). Throws when DIR holds none.
FlightExplanation explain_flight_records(const std::string& dir, const std::string& group = "default");

// The table and the verdict, as above.
std::string format_explanation(const FlightExplanation& explanation);

}  // namespace tinyddp::comm
