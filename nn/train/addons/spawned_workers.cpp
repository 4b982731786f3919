#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <mutex>
#include <optional>
#include <thread>

#include "tinyddp/core/error.h"
#include "tinyddp/nn/train/addons/spawned_workers.h"

extern char** environ;

namespace tinyddp::nn {

namespace {

using Clock = std::chrono::steady_clock;
// How often wait() looks at the workers. waitpid(WNOHANG) on a handful of children costs microseconds,
// and 10 ms is far below anything a training job would notice.
constexpr auto kPollInterval = std::chrono::milliseconds(10);
// After a failure, how long the other workers may take to end on their own (see wait()).
constexpr auto kSettle = std::chrono::milliseconds(1000);

// This process's environment with `added` replacing or adding variables, as "NAME=value" strings.
std::vector<std::string> environment_with(const SpawnedWorkers::Environment& added) {
  std::vector<std::string> out;
  for (char** e = environ; *e; ++e) {
    std::string entry(*e);
    std::string name = entry.substr(0, entry.find('='));
    if (added.count(name) == 0) out.push_back(std::move(entry));
  }
  for (const auto& [name, value] : added) out.push_back(name + "=" + value);
  return out;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// Starts one worker. Everything that allocates happens before fork(): the parent may have threads
// (the store server, a data loader), and between fork and exec only async-signal-safe calls are allowed.
// If exec fails, the child writes errno into a close-on-exec pipe; a successful exec closes the pipe
// unwritten. So the parent learns "could not start" here, not as a mysterious exit code 127 later.
pid_t start_worker(const std::vector<std::string>& argv_strings, const SpawnedWorkers::Environment& added) {
  std::vector<std::string> args = argv_strings, env = environment_with(added);
  std::vector<char*> argv = pointers(args), envp = pointers(env);
  int report[2];
  TINYDDP_CHECK(pipe2(report, O_CLOEXEC) == 0, "MultiDevice: pipe2 failed: ", std::strerror(errno),
                "; hint: the process may be out of file descriptors (ulimit -n)");
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    close(report[0]);
    // Die with the parent, even if it is killed with SIGKILL; and if it already died before this line,
    // go now rather than run unsupervised.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);
    execve(argv[0], argv.data(), envp.data());
    int error = errno;
    ssize_t ignored = write(report[1], &error, sizeof error);
    (void)ignored;
    _exit(127);
  }
  int fork_error = errno;
  close(report[1]);
  if (pid < 0) {
    close(report[0]);
    TINYDDP_FAIL("MultiDevice: fork failed: ", std::strerror(fork_error),
                 "; hint: the system may be out of processes or memory");
  }
  int exec_error = 0;
  ssize_t n;
  do n = read(report[0], &exec_error, sizeof exec_error);
  while (n < 0 && errno == EINTR);
  close(report[0]);
  if (n > 0) {
    int status = 0;
    waitpid(pid, &status, 0);
    TINYDDP_FAIL("MultiDevice: cannot execute ", argv_strings[0], ": ", std::strerror(exec_error),
                 "; hint: the worker command must name an executable file");
  }
  return pid;
}

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

SpawnedWorkers::SpawnedWorkers(const std::vector<std::string>& argv, const std::vector<Environment>& environments) {
  TINYDDP_CHECK(!argv.empty() && !argv[0].empty(), "MultiDevice: the worker command is empty",
                "; hint: give the program to run as argv[0]");
  TINYDDP_CHECK(!environments.empty(), "MultiDevice: no workers to start; hint: give one environment per rank");
  try {
    for (const Environment& env : environments) {
      pids_.push_back(start_worker(argv, env));
      running_.push_back(true);
      status_.push_back(0);
    }
  } catch (...) {
    stop_running(std::chrono::seconds(1));
    throw;
  }
}

SpawnedWorkers::~SpawnedWorkers() { stop_running(std::chrono::seconds(5)); }

bool SpawnedWorkers::reap(size_t rank, bool block) {
  if (!running_[rank]) return true;
  int status = 0;
  pid_t r;
  do r = waitpid(pids_[rank], &status, block ? 0 : WNOHANG);
  while (r < 0 && errno == EINTR);
  if (r == 0) return false;
  // r < 0 (ECHILD) means someone else reaped it: count it as ended, status unknown.
  running_[rank] = false;
  status_[rank] = r == pids_[rank] ? status : 0;
  return true;
}

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
    bool any_running = false;
    for (size_t rank = 0; rank < pids_.size(); ++rank) {
      bool was_running = running_[rank];
      if (!reap(rank, false)) {
        any_running = true;
        continue;
      }
      int status = status_[rank];
      if (was_running && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
        failures.push_back({int(rank), pids_[rank], WIFEXITED(status) ? WEXITSTATUS(status) : 0,
                            WIFSIGNALED(status) ? WTERMSIG(status) : 0, false});
    }
    if (!failures.empty()) {
      // Give the others a moment to end on their own before stopping them. When rank 1 crashes and
      // takes rank 0 down with it, rank 0 may be reapable first: a crashed process stays unreapable
      // until its last thread is gone, and the peer noticed the crash as soon as its sockets closed.
      // The caller needs both to tell which one started it.
      if (!settle_until) settle_until = Clock::now() + std::min(grace, kSettle);
      if (!any_running || Clock::now() >= *settle_until) {
        stop_running(grace);
        std::sort(failures.begin(), failures.end(), [](const WorkerEnd& a, const WorkerEnd& b) { return a.rank < b.rank; });
        return failures;
      }
    } else {
      if (!any_running) return {};
      if (Clock::now() >= deadline) {
        std::vector<WorkerEnd> late;
        for (size_t rank = 0; rank < pids_.size(); ++rank)
          if (running_[rank]) {
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

void SpawnedWorkers::stop_running(std::chrono::milliseconds grace) {
  for (size_t rank = 0; rank < pids_.size(); ++rank)
    if (running_[rank]) kill(pids_[rank], SIGTERM);
  auto deadline = Clock::now() + grace;
  for (;;) {
    bool any_running = false;
    for (size_t rank = 0; rank < pids_.size(); ++rank) any_running |= !reap(rank, false);
    if (!any_running) return;
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(kPollInterval);
  }
  // SIGKILL cannot be caught or ignored, so the blocking reap below returns promptly.
  for (size_t rank = 0; rank < pids_.size(); ++rank)
    if (running_[rank]) {
      kill(pids_[rank], SIGKILL);
      reap(rank, true);
    }
}

}  // namespace tinyddp::nn
