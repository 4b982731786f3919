// CollectiveWatchdog: a process group's second thread, which watches its collectives wait.
//
// A collective that waits on a rank which never comes (stopped by SIGSTOP, stuck in its own
// computation, calling another collective) can only name the neighbour it waits on: in a ring,
// rank 0 waits on rank 2, which waits on the stalled rank 1. To name rank 1, each rank's watchdog
// publishes where it stands in the job's store once that stops changing (a "board" entry per rank:
// "in 12 <since, unix ms>" or "idle 11 <since>"), and reads the others' entries when a wait grows
// long. The rank that has not entered the collective the others wait in is the one to blame.
//
// Publishing happens only when a rank has stood still for a while (settle_time(): a quarter of the
// timeout, at most 2 s), so a busy job writes nothing. While a collective runs longer than the
// progress interval (10 s; TINYDDP_PROGRESS_SECONDS), the watchdog prints one line per interval:
//
//   rank 0: all_reduce #1043 (4 MiB, bucket 2) waiting for 20.0 s: rank 1 (node7, pid 4242) has not
//   entered it (idle after #1042 for 20.3 s); rank 2 waits in it too
//
// When a collective fails, explain_stall() gives the same verdict for its error message. The
// watchdog also writes the flight recorder's file when the process gets SIGUSR1.
//
// Its store calls go through a connection of its own with a short timeout (when the store is a
// TcpStore), so a store that does not answer delays a verdict by seconds, never the job.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "tinyddp/comm/flight_recorder.h"
#include "tinyddp/comm/store/store.h"

namespace tinyddp::comm {

// One rank's board entry, as read back.
struct BoardEntry {
  int rank = -1;
  bool reported = false;  // false: the rank never published (stopped, or stalled before its first collective)
  bool running = false;   // true: "in #sequence"; false: "idle after #sequence" (-1: none yet)
  int64_t sequence = -1;
  double seconds = 0;  // how long it has been so, as of reading
  int pid = 0;         // known from the group's setup even when the rank never reported
  std::string host;
};

// The ranks that have not entered collective `sequence`, and the sentence that names them ("" when
// every rank has entered it).
struct StallVerdict {
  std::vector<int> lagging;
  std::string text;
};
StallVerdict judge_board(const std::vector<BoardEntry>& board, int64_t sequence, const std::string& what);

class CollectiveWatchdog {
 public:
  // `hosts` and `pids`: where every rank runs (by rank), as the group's setup learned them.
  CollectiveWatchdog(std::shared_ptr<Store> store, std::string board_prefix, const FlightRecorder& recorder,
                     std::vector<std::string> hosts, std::vector<int> pids, std::chrono::milliseconds timeout);
  ~CollectiveWatchdog();
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  // For a collective that failed: publishes this rank's position, reads the board and judges who has
  // not entered collective `sequence` (described as `what`). Waits at most `patience`; "" when the
  // board could not be read in time or names nobody.
  std::string explain_stall(uint64_t sequence, const std::string& what, std::chrono::milliseconds patience);

  std::chrono::milliseconds settle_time() const;
  // How long a failing collective waits for explain_stall's answer: the board's calls take
  // milliseconds, and kBoardStoreTimeout each when the store does not answer.
  static constexpr std::chrono::milliseconds kVerdictPatience{2500};

 private:
  void loop();
  void tick();
  Store* board_store();
  bool publish(bool force);
  std::vector<BoardEntry> read_board();
  void report_progress(const FlightRecorder::Position& p);

  std::shared_ptr<Store> store_;
  std::shared_ptr<Store> own_store_;  // a connection of its own with a short timeout (board_store())
  const std::string prefix_;
  const FlightRecorder& recorder_;
  const int rank_, world_size_;
  const std::vector<std::string> hosts_;
  const std::vector<int> pids_;
  const std::chrono::milliseconds timeout_, progress_interval_;

  // The thread's own state (touched by it only).
  std::string published_, standing_;
  std::chrono::steady_clock::time_point standing_since_{};
  int64_t reported_sequence_ = -1;
  int reports_ = 0;
  uint64_t dumps_served_ = 0;

  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  // explain_stall's request and answer.
  std::optional<std::pair<uint64_t, std::string>> question_;
  std::optional<std::string> answer_;
  std::thread thread_;  // last: it starts after the members it uses exist
};

}  // namespace tinyddp::comm
