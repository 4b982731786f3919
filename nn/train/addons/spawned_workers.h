// SpawnedWorkers: one child process per rank, all running the same program, supervised until they
// end. This is the part of torch.multiprocessing.spawn (start method "spawn") that MultiDevice needs,
// on top of core/child_processes.h:
//
//   - each worker is a fresh process started from the program file with its own environment
//     (RANK, WORLD_SIZE, ...), not a fork() of the parent: a forked copy of a process with running
//     threads (the store server, a data loader, OpenBLAS) inherits their locks but not the threads,
//     and a GPU context cannot survive a fork at all;
//   - the workers share the parent's terminal (stdin/stdout/stderr), so rank 0's progress bar draws
//     in place exactly as it would without spawning;
//   - the first worker that fails (non-zero exit or a signal) is the root cause; the others are sent
//     SIGTERM, then SIGKILL after a grace period, and every one is reaped: no orphans, no zombies;
//   - each worker asks the kernel to kill it if the parent dies (PR_SET_PDEATHSIG), so even a parent
//     killed with SIGKILL leaves nothing running.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tinyddp/core/child_processes.h"
#include "tinyddp/core/error.h"

namespace tinyddp::nn {

// While one lives, SIGINT, SIGTERM and SIGHUP do not kill this process at once: SpawnedWorkers::wait()
// notices the signal within its poll interval, stops the workers and throws StoppedBySignal, so that
// everything the spawner made (its temporary directory, its store) is cleaned up on the way out and
// the program ends as on any other failure: one message, exit code 1. When the last one goes, the
// previous handlers come back.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The signal received since the first StopSignals was made, or 0.
  static int received();
  // The same, and forgets it: the caller acts on it.
  static int take();
};

// What wait() throws for a signal StopSignals caught, once every worker is stopped and reaped.
class StoppedBySignal : public Error {
 public:
  StoppedBySignal(std::string message, int signal, const char* file, int line)
      : Error(std::move(message), "", file, line), signal_(signal) {}
  int signal() const { return signal_; }

 private:
  int signal_;
};

// How one worker ended, when it is what made the job fail.
struct WorkerEnd {
  int rank = -1;
  pid_t pid = 0;
  int exit_code = 0;       // when it exited
  int signal = 0;          // when a signal ended it
  bool timed_out = false;  // still running when the wait's time limit passed (then killed)

  // "rank 1 (pid 4242) exited with code 3", "... was killed by signal 11 (Segmentation fault)"
  std::string describe() const;
};

class SpawnedWorkers {
 public:
  using Environment = std::map<std::string, std::string>;

  // Starts `argv` once per entry of `environments`; worker i (rank i) gets this process's
  // environment with environments[i] added (replacing variables of the same name). argv[0] must be
  // a path to an executable file. With `bind_cpus`, worker i starts on its own share of this
  // process's CPUs (comm::worker_cpus), as tinyddp-run starts its workers: two ranks on two cores then
  // never queue on one core while the other idles. Throws when a worker cannot be started (the ones
  // already started are stopped first).
  SpawnedWorkers(const std::vector<std::string>& argv, const std::vector<Environment>& environments,
                 bool bind_cpus = false);
  // Stops (SIGTERM, grace, SIGKILL) and reaps every worker still running.
  ~SpawnedWorkers();
  SpawnedWorkers(const SpawnedWorkers&) = delete;
  SpawnedWorkers& operator=(const SpawnedWorkers&) = delete;

  // Waits until every worker has ended, or one has failed, or `timeout` has passed (zero: no limit).
  // After a failure the others get up to a second (at most `grace`) to end on their own; then, as
  // after a timeout, every worker still running is stopped (SIGTERM, then SIGKILL after `grace`) and
  // reaped before this returns. Throws StoppedBySignal, after stopping them, when a StopSignals caught a
  // signal. Returns nothing when all exited with 0. Otherwise it returns every
  // worker that failed on its own, in rank order (a crash takes its peers down within milliseconds,
  // and which of them came first is for the caller to tell), or, after a timeout, one entry with
  // timed_out set.
  std::vector<WorkerEnd> wait(std::chrono::milliseconds timeout = std::chrono::milliseconds::zero(),
                              std::chrono::milliseconds grace = std::chrono::seconds(5));

  // The workers' process ids, by rank (for messages; they are reaped once wait() returns).
  const std::vector<pid_t>& pids() const { return pids_; }

 private:
  void stop_running(std::chrono::milliseconds grace);

  ChildProcesses children_{"MultiDevice"};  // child i is rank i
  std::vector<pid_t> pids_;
};

}  // namespace tinyddp::nn
