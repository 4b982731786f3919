// FlightRecorder: the last N collectives of one rank, kept so that a hung job can say where it hung.
//
// Every collective a process group runs passes through three states here: queued (the caller made
// the call), started (the communication thread began it) and finished (or failed). The recorder
// keeps the last `capacity` of them in a fixed ring, indexed by sequence number, so recording costs
// a lock and at most a clock read per state, and nothing grows.
//
// With TINYDDP_FLIGHT_RECORDER=DIR, the ring is written as DIR/rank-<r>.json (one file per rank,
// written whole and renamed into place):
//   - when a collective of this rank fails (a timeout, a lost peer), before the error reaches the caller;
//   - when the process gets SIGUSR1 (`kill -USR1 <pid>` on a job that looks stuck; tinyddp-run
//     sends it to the workers still alive when a group fails), written by the group's watchdog thread.
// The file, as comm/launch/flight_explain.h reads it back:
//
//   {"rank": 1, "world_size": 3, "group": "default", "host": "node7", "pid": 4242, "restart_count": 0,
//    "reason": "timeout", "written_unix_ms": 1764040000123, "error": "rank 1: all_reduce #12 ...",
//    "last_queued": 12, "last_started": 12, "last_finished": 11,   (finished: succeeded; -1: none yet)
//    "entries": [{"sequence": 12, "op": "all_reduce", "dtype": "f32", "count": 1048576, "bytes": 4194304,
//                 "bucket": 2, "state": "started", "queued_unix_ms": ..., "started_unix_ms": ...,
//                 "finished_unix_ms": null}, ...]}                    (oldest first)
//
// PyTorch's NCCL flight recorder (TORCH_NCCL_TRACE_BUFFER_SIZE) keeps the same facts for the same reason.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "tinyddp/comm/fingerprint.h"

namespace tinyddp::comm {

class FlightRecorder {
 public:
  using Clock = std::chrono::steady_clock;
  enum class State : uint8_t { queued, started, finished, failed };

  struct Entry {
    Fingerprint fingerprint;  // its sequence number is the entry's
    int bucket = -1;          // DDP's bucket, when the caller said (CallOptions::bucket)
    State state = State::queued;
    Clock::time_point queued_at{}, started_at{}, finished_at{};
  };

  // Where this rank stands: what it runs now, and what it finished last.
  struct Position {
    std::optional<Entry> running;        // started, not finished
    std::optional<Entry> last_finished;  // the newest finished (or failed) one
    int64_t last_queued = -1;
  };

  FlightRecorder(int rank, int world_size, std::string group, size_t capacity = kDefaultCapacity);

  // `at`: when it happened. A caller that has just read the clock passes its reading, so that a
  // small collective pays for as few clock reads as possible.
  void queued(const Fingerprint& fingerprint, int bucket, Clock::time_point at = Clock::now());
  // Queued and started at once, in one update: a blocking call its caller runs as it makes it.
  void queued_and_started(const Fingerprint& fingerprint, int bucket, Clock::time_point at);
  void started(uint64_t sequence, Clock::time_point at = Clock::now());
  void finished(uint64_t sequence, bool succeeded);
  // The failure the next dump() reports.
  void set_error(const std::string& message);

  Position position() const;
  // How many collectives finished (or failed) and the seconds they ran, start to end: transfers plus
  // the time spent waiting for the peers. Cumulative since the group was created.
  struct Totals {
    uint64_t collectives = 0;
    double seconds = 0;
  };
  Totals totals() const;
  // "all_reduce #1043 (f32 x1048576, 4.0 MiB, bucket 2)"; "" when `sequence` has left the ring.
  std::string describe(uint64_t sequence) const;
  static std::string describe(const Entry& entry);
  std::vector<Entry> entries() const;  // oldest first
  int rank() const { return rank_; }

  // The JSON above; `reason` says why it was written ("timeout", "error", "SIGUSR1", ...).
  std::string to_json(const std::string& reason) const;
  // Writes to_json(reason) to <directory()>/rank-<r>.json (rank-<r>.<group>.json for a group not
  // named "default"); returns the path, or "" when TINYDDP_FLIGHT_RECORDER is unset or the file
  // cannot be written (a warning says why: the failure being recorded matters more).
  std::string dump(const std::string& reason) const;

  // TINYDDP_FLIGHT_RECORDER, or "" when unset.
  static std::string directory();
  // TINYDDP_FLIGHT_RECORDER_ENTRIES, else this.
  static constexpr size_t kDefaultCapacity = 256;
  static size_t capacity_from_environment();

  // SIGUSR1 asks every recorder of the process to dump. The handler only counts the requests (it is
  // async-signal-safe); each group's watchdog thread notices the count change and writes its file.
  // Installed by the first process group created while TINYDDP_FLIGHT_RECORDER is set.
  static void install_dump_signal();
  static uint64_t dump_requests();

 private:
  Entry* find(uint64_t sequence);  // nullptr when it left the ring
  void add(const Entry& entry);    // a new collective's entry, in the ring (the mutex held)

  const int rank_, world_size_;
  const std::string group_;
  // Which attempt of the job wrote the record (TINYDDP_RESTART_COUNT, TORCHELASTIC_RESTART_COUNT; 0
  // when neither is set): a restarted job's records must not be read beside the failed attempt's.
  const int restart_count_;
  mutable std::mutex mutex_;
  std::vector<Entry> ring_;
  bool any_ = false;
  uint64_t oldest_ = 0, next_ = 0;                                     // the sequence numbers held: [oldest_, next_)
  int64_t last_started_ = -1, last_finished_ = -1, last_failed_ = -1;  // last_finished_: succeeded
  std::string error_;
  Totals totals_;
};

const char* flight_state_name(FlightRecorder::State state);

}  // namespace tinyddp::comm
