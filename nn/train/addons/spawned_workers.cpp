#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <iterator>
#include <mutex>
#include <optional>
#include <thread>

#include "tinyddp/comm/cpu_binding.h"
#include "tinyddp/core/error.h"
#include "tinyddp/nn/train/addons/spawned_workers.h"

namespace tinyddp::nn {

namespace {

using Clock = std::chrono::steady_clock;
// How often wait() looks at the workers. waitpid(WNOHANG) on a handful of children costs microseconds,
// and 10 ms is far below anything a training job would notice.
constexpr auto kPollInterval = std::chrono::milliseconds(10);
// After a failure, how long the other workers may take to end on their own (see wait()).
constexpr auto kSettle = std::chrono::milliseconds(1000);

// StopSignals' state: how many guards live, the signal caught, the handlers they replaced.
constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP};
std::atomic<int> g_received{0};
std::mutex g_guards_mutex;
int g_guards = 0;
struct sigaction g_previous[std::size(kStopSignals)];

void on_stop_signal(int signal) { g_received.store(signal); }

}  // namespace

StopSignals::StopSignals() {
  std::lock_guard<std::mutex> lock(g_guards_mutex);
  if (g_guards++ > 0) return;
  g_received = 0;
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  for (size_t i = 0; i < std::size(kStopSignals); ++i) sigaction(kStopSignals[i], &action, &g_previous[i]);
}

StopSignals::~StopSignals() {
  std::lock_guard<std::mutex> lock(g_guards_mutex);
  if (--g_guards > 0) return;
  for (size_t i = 0; i < std::size(kStopSignals); ++i) sigaction(kStopSignals[i], &g_previous[i], nullptr);
  // A signal nobody took arrived while a failure was already on its way out: that failure ends the
  // program (exit code 1), and the signal asked for no more than that.
  g_received = 0;
}

int StopSignals::received() { return g_received.load(); }
int StopSignals::take() { return g_received.exchange(0); }

std::string WorkerEnd::describe() const {
  std::string who = "rank " + std::to_string(rank) + " (pid " + std::to_string(pid) + ")";
  if (timed_out) return who + " was still running when the time limit passed, and was stopped";
  if (signal != 0) return who + " was killed by signal " + std::to_string(signal) + " (" + strsignal(signal) + ")";
  return who + " exited with code " + std::to_string(exit_code);
}

SpawnedWorkers::SpawnedWorkers(const std::vector<std::string>& argv, const std::vector<Environment>& environments,
                               bool bind_cpus) {
  TINYDDP_CHECK(!argv.empty() && !argv[0].empty(), "MultiDevice: the worker command is empty",
                hint("give the program to run as argv[0]"));
  TINYDDP_CHECK(!environments.empty(), "MultiDevice: no workers to start", hint("give one environment per rank"));
  try {
    // The workers stay in this process's group: they share its terminal, and Ctrl-C reaches them too.
    const int count = int(environments.size());
    for (int rank = 0; rank < count; ++rank) {
      ChildCommand command{argv[0], argv, environment_with(environments[size_t(rank)])};
      if (bind_cpus) command.cpus = comm::worker_cpus(rank, count);
      pids_.push_back(children_.pid(children_.start(command)));
    }
  } catch (...) {
    stop_running(std::chrono::seconds(1));
    throw;
  }
}

SpawnedWorkers::~SpawnedWorkers() { stop_running(std::chrono::seconds(5)); }

std::vector<WorkerEnd> SpawnedWorkers::wait(std::chrono::milliseconds timeout, std::chrono::milliseconds grace) {
  auto deadline = timeout > std::chrono::milliseconds::zero() ? Clock::now() + timeout : Clock::time_point::max();
  std::vector<WorkerEnd> failures;
  std::optional<Clock::time_point> settle_until;
  for (;;) {
    if (int signal = StopSignals::take()) {
      stop_running(grace);
      throw StoppedBySignal("MultiDevice: stopped by signal " + std::to_string(signal) + " (" + strsignal(signal) +
                                "); the " + std::to_string(pids_.size()) + " workers were stopped",
                            signal, __FILE__, __LINE__);
    }
    for (size_t rank : children_.reap_ended()) {
      int status = children_.status(rank);
      if (children_.failed(rank))
        failures.push_back({int(rank), pids_[rank], WIFEXITED(status) ? WEXITSTATUS(status) : 0,
                            WIFSIGNALED(status) ? WTERMSIG(status) : 0, false});
    }
    bool any_running = children_.any_running();
    if (!failures.empty()) {
      // Give the others a moment to end on their own before stopping them. When rank 1 crashes and
      // takes rank 0 down with it, rank 0 may be reapable first: a crashed process stays unreapable
      // until its last thread is gone, and the peer noticed the crash as soon as its sockets closed.
      // The caller needs both to tell which one started it.
      if (!settle_until) settle_until = Clock::now() + std::min(grace, kSettle);
      if (!any_running || Clock::now() >= *settle_until) {
        stop_running(grace);
        std::sort(failures.begin(), failures.end(),
                  [](const WorkerEnd& a, const WorkerEnd& b) { return a.rank < b.rank; });
        return failures;
      }
    } else {
      if (!any_running) return {};
      if (Clock::now() >= deadline) {
        std::vector<WorkerEnd> late;
        for (size_t rank = 0; rank < pids_.size(); ++rank)
          if (children_.running(rank)) {
            late.push_back({int(rank), pids_[rank], 0, 0, true});
            break;
          }
        stop_running(grace);
        return late;
      }
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

void SpawnedWorkers::stop_running(std::chrono::milliseconds grace) { children_.stop(SIGTERM, grace); }

}  // namespace tinyddp::nn
