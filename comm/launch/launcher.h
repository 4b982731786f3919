// Launcher: what tinyddp-run does (torchrun's role), as a class.
//
//   tinyddp-run -n 4 ./train --epochs 3
//
// starts 4 workers of ./train on this host with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT and TINYDDP_RESTART_COUNT set, so `rendezvous("env://")` finds its place.
//
// The launcher hosts the job's store itself (on node 0), on --master-port or on a free port it
// picks, and tells the workers so (TINYDDP_LAUNCHER_STORE=1): the store then outlives any worker,
// which is what lets a failed group be restarted, and there is no window between picking a free port
// and a worker binding it. It also sets a fresh TINYDDP_TOKEN per job (unless one is given) that the
// store demands, so a stray process cannot wander into the job.
//
// Supervision, in the order it happens:
//   - each worker runs in its own process group, its output read line by line and handed to
//     `output` with its rank (tinyddp-run prints "[rank 1] ...");
//   - when a worker fails (non-zero exit or a signal), that worker is the root cause; the others get
//     SIGTERM, then SIGKILL after the grace period, and so does anything they started. The launcher
//     watches each worker through a pidfd, so it wakes the moment the first one dies, before its
//     peers fail in turn ("peer closed the connection"); when several are found ended at once, one
//     killed by a signal is named before one that exited with an error code, and a worker that exits
//     with a code is named only after a short wait (200 ms, up to 2 s while another worker is still
//     dying) in which no worker turned out to have been killed by a signal;
//   - when the first worker to fail exited with an error code, the group may have failed by timeout,
//     waiting for a rank that is alive but stuck: a worker stopped by a signal (SIGSTOP), or, from
//     the flight records (comm/launch/flight_explain.h; the workers still alive are asked for theirs
//     with SIGUSR1), the rank that never entered the collective the others timed out in. That rank
//     is then the root cause, and its stall is said;
//   - with restarts left the whole group starts again (TINYDDP_RESTART_COUNT + 1), on the same store,
//     its rendezvous keys under the new restart count, and a program that checkpoints (nn::StateManager)
//     resumes from its last complete checkpoint; otherwise run() returns the root cause: which rank,
//     and its exit code or signal;
//   - SIGINT/SIGTERM given to the launcher (request_stop) go to every worker, then the same grace.
//   - a worker also gets PR_SET_PDEATHSIG, so even a launcher killed by SIGKILL leaves no worker.
//
// Multi-node: the same command on every node with --nnodes/--node-rank/--master-addr/--master-port.
// The launchers coordinate through the store under "tinyddp/<run id>/launcher/": they check that they
// agree on the shape of the job, start each attempt together (a barrier), publish the first failure
// anywhere so every node stops its workers, and restart or finish together.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tinyddp/comm/timeout.h"
#include "tinyddp/core/log.h"

namespace tinyddp::comm {

// Receives each line a worker prints (without its newline). stream is 1 (stdout) or 2 (stderr).
using WorkerOutputSink = std::function<void(int rank, int stream, std::string_view line)>;

struct LauncherOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: pick a free port (one node only)
  int max_restarts = 0;
  // Each worker starts on its own share of this node's CPUs, as mpirun binds its ranks
  // (comm/cpu_binding.h: not when the workers outnumber the CPUs, nor under TINYDDP_BIND=none).
  bool bind_cpus = true;
  std::vector<std::string> program;                           // argv of each worker; program[0] is searched on PATH
  std::chrono::milliseconds grace = std::chrono::seconds(5);  // between SIGTERM and SIGKILL
  std::chrono::milliseconds rendezvous_timeout = timeout_from_environment();  // for other nodes to join
  // Where the workers write their flight records (comm/flight_recorder.h), which the launcher reads
  // to name the rank a timed-out group waited for. Empty: TINYDDP_FLIGHT_RECORDER, else a temporary
  // directory removed at the end.
  std::string flight_recorder_dir;
  std::string run_id;       // keys' namespace; default: TINYDDP_RUN_ID, or "default"
  WorkerOutputSink output;  // empty: worker output is read and dropped
  LogSink log;              // the launcher's own messages; default: stderr, component "tinyddp-run"
};

struct WorkerFailure {
  int rank = -1;
  int local_rank = -1;
  int node_rank = 0;
  pid_t pid = 0;
  int exit_code = 0;  // when it exited
  int signal = 0;     // when a signal ended it
  // Set when the worker did not fail itself but stalled: the others timed out waiting for it. Says how
  // (stopped by a signal, or not in the collective the others were in).
  std::string stall;

  // "rank 2 (local rank 2 on node 0, pid 4242) exited with code 3", or "... stalled: <stall>"
  std::string describe() const;
};

struct LaunchResult {
  // What tinyddp-run exits with: 0; the failed worker's exit code (128 + signal when a signal ended
  // it); or 128 + the signal that stopped the launcher.
  int exit_code = 0;
  int restarts = 0;                         // how many times the group was restarted
  std::optional<WorkerFailure> root_cause;  // the first worker that failed, on any node
  std::string summary;                      // one line saying how the job ended, and why
};

class Launcher {
 public:
  explicit Launcher(LauncherOptions options);
  ~Launcher();
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;

  // Runs the job to its end. Throws only for a job that cannot start (bad options, a program that
  // does not exist, a port in use, nodes that disagree); worker failures are in the result.
  LaunchResult run();

  // Async-signal-safe: call it from a SIGINT/SIGTERM handler. run() forwards `signal` to every
  // worker, waits the grace period, kills what is left and returns.
  void request_stop(int signal);

  // The store's port (the one picked, when master_port was 0), once run() has started it; 0 before.
  int master_port() const { return bound_port_.load(); }

 private:
  struct Job;
  LauncherOptions options_;
  std::atomic<int> stop_signal_{0};
  std::atomic<int> bound_port_{0};
  int wake_pipe_[2] = {-1, -1};  // request_stop writes a byte here to wake run()'s poll
};

}  // namespace tinyddp::comm
