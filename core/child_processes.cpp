#include "tinyddp/core/child_processes.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "tinyddp/core/error.h"
#include "tinyddp/core/process.h"

extern char** environ;

namespace tinyddp {

namespace {

using Clock = std::chrono::steady_clock;
// How often stop() looks at the children. waitpid(WNOHANG) on a handful of them costs microseconds.
constexpr auto kPollInterval = std::chrono::milliseconds(10);

std::vector<char*> pointers(const std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (const std::string& s : strings) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

// Closes every descriptor from `first` up, but `keep`. Async-signal-safe.
void close_from(int first, int keep) {
  auto close_range = [](unsigned from, unsigned to) {
    if (from > to) return;
    if (syscall(SYS_close_range, from, to, 0u) != 0)  // kernels before 5.9 lack close_range
      for (unsigned fd = from; fd <= to && fd < 4096; ++fd) close(int(fd));
  };
  close_range(unsigned(first), unsigned(keep) - 1);
  close_range(unsigned(keep) + 1, ~0u);
}

// The child's side of start(), from fork to exec: only async-signal-safe calls. `report` is the
// close-on-exec pipe an exec failure's errno goes into.
[[noreturn]] void become(const ChildCommand& command, char* const* argv, char* const* envp, const cpu_set_t* cpus,
                         pid_t parent, int report) {
  if (command.own_process_group) setpgid(0, 0);
  if (cpus) sched_setaffinity(0, sizeof *cpus, cpus);  // should it fail, the child runs where its parent may
  // Die with the parent, even if it is killed with SIGKILL; and if it already died before this line,
  // go now rather than run unsupervised.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(126);
  if (command.stdout_fd >= 0) dup2(command.stdout_fd, 1);
  if (command.stderr_fd >= 0) dup2(command.stderr_fd, 2);
  close_from(3, report);
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  for (int s = 1; s < NSIG; ++s) sigaction(s, &default_action, nullptr);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  execve(command.program.c_str(), argv, envp);
  int error = errno;
  ssize_t ignored = write(report, &error, sizeof error);
  (void)ignored;
  _exit(127);
}

}  // namespace

std::vector<std::string> environment_with(const std::map<std::string, std::string>& overrides) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string entry(*e);
    if (!overrides.count(entry.substr(0, entry.find('=')))) env.push_back(std::move(entry));
  }
  for (const auto& [name, value] : overrides) env.push_back(name + "=" + value);
  return env;
}

ChildProcesses::ChildProcesses(std::string owner) : owner_(std::move(owner)) {}

ChildProcesses::~ChildProcesses() {
  for (Child& c : children_)
    if (c.running) ::kill(c.own_group ? -c.pid : c.pid, SIGKILL);
  for (size_t i = 0; i < children_.size(); ++i) reap(i, true);
}

size_t ChildProcesses::start(const ChildCommand& command) {
  TINYDDP_CHECK(!command.program.empty() && !command.argv.empty(), owner_, ": no program to start",
                hint("give the program's path and its argv"));
  // Everything that allocates happens before fork(): this process may have threads, and between fork
  // and exec only async-signal-safe calls are allowed.
  std::vector<char*> argv = pointers(command.argv), envp = pointers(command.environment);
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int cpu : command.cpus)
    if (cpu >= 0 && cpu < CPU_SETSIZE) CPU_SET(cpu, &cpus);
  int report[2];
  TINYDDP_CHECK(pipe2(report, O_CLOEXEC) == 0, owner_, ": pipe2 failed: ", std::strerror(errno),
                hint("the process may be out of file descriptors (ulimit -n)"));
  pid_t parent = getpid();
  // Signals stay blocked across the fork until the child has reset every handler: a SIGTERM sent to a
  // child that has not reached exec yet must end it, not run this process's handler in it.
  sigset_t all, saved;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &saved);
  pid_t pid = fork();
  if (pid == 0) become(command, argv.data(), envp.data(), command.cpus.empty() ? nullptr : &cpus, parent, report[1]);
  int fork_error = errno;
  pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  close(report[1]);
  if (pid < 0) {
    close(report[0]);
    // fork says which limit it hit: EAGAIN is the count of processes (this user's `ulimit -u`, or the
    // cgroup's pids.max), ENOMEM the memory the copy of this process needs.
    TINYDDP_FAIL(owner_, ": fork failed: ", std::strerror(fork_error),
                 hint(fork_error == ENOMEM ? "free memory, or start fewer workers on this host"
                                           : "this user or container may not start more processes (ulimit -u, the "
                                             "cgroup's pids.max): end some, or raise the limit"));
  }
  // Also from the parent, so the group exists before this process might signal it.
  if (command.own_process_group) setpgid(pid, pid);
  // A successful exec closes the pipe unwritten; a failed one leaves its errno in it.
  int exec_error = 0;
  ssize_t n;
  do n = read(report[0], &exec_error, sizeof exec_error);
  while (n < 0 && errno == EINTR);
  close(report[0]);
  if (n > 0) {
    while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {}
    TINYDDP_FAIL(owner_, ": cannot execute ", command.program, ": ", std::strerror(exec_error),
                 hint("the command must name an executable file"));
  }
  Child child;
  child.pid = pid;
  child.own_group = command.own_process_group;
  child.running = true;
  child.pidfd = int(syscall(SYS_pidfd_open, pid, 0));
  children_.push_back(child);
  return children_.size() - 1;
}

bool ChildProcesses::any_running() const {
  for (const Child& c : children_)
    if (c.running) return true;
  return false;
}

bool ChildProcesses::failed(size_t child) const {
  int s = children_[child].status;
  return !(WIFEXITED(s) && WEXITSTATUS(s) == 0);
}

bool ChildProcesses::reap(size_t index, bool block) {
  Child& c = children_[index];
  if (!c.running) return true;
  int status = 0;
  pid_t r;
  do r = waitpid(c.pid, &status, block ? 0 : WNOHANG);
  while (r < 0 && errno == EINTR);
  if (r == 0) return false;
  // r < 0 (ECHILD) means someone else reaped it: count it as ended, status unknown.
  c.running = false;
  c.status = r == c.pid ? status : 0;
  if (c.pidfd >= 0) close(c.pidfd), c.pidfd = -1;
  return true;
}

std::vector<size_t> ChildProcesses::reap_ended() {
  std::vector<size_t> ended;
  for (size_t i = 0; i < children_.size(); ++i)
    if (children_[i].running && reap(i)) ended.push_back(i);
  return ended;
}

bool ChildProcesses::group_alive(const Child& c) const { return c.own_group && process_group_alive(c.pid); }

std::vector<size_t> ChildProcesses::stop(int signal, std::chrono::milliseconds grace, const Idle& idle) {
  for (Child& c : children_) {
    if (c.own_group) {
      ::kill(-c.pid, signal), ::kill(-c.pid, SIGCONT);
    } else if (c.running) {
      ::kill(c.pid, signal), ::kill(c.pid, SIGCONT);
    }
  }
  auto anything_alive = [&] {
    for (const Child& c : children_)
      if (c.running || group_alive(c)) return true;
    return false;
  };
  for (auto deadline = Clock::now() + grace; Clock::now() < deadline;) {
    reap_ended();
    if (!anything_alive()) break;
    if (idle) {
      idle(kPollInterval);
    } else {
      std::this_thread::sleep_for(kPollInterval);
    }
  }
  reap_ended();
  std::vector<size_t> late;
  for (size_t i = 0; i < children_.size(); ++i) {
    Child& c = children_[i];
    if (c.running) late.push_back(i);
    if (group_alive(c)) {
      ::kill(-c.pid, SIGKILL);
    } else if (c.running) {
      ::kill(c.pid, SIGKILL);
    }
  }
  // SIGKILL cannot be caught or ignored, so the blocking reap returns promptly.
  for (size_t i = 0; i < children_.size(); ++i) reap(i, true);
  return late;
}

void ChildProcesses::clear() {
  for (size_t i = 0; i < children_.size(); ++i)
    TINYDDP_CHECK(!children_[i].running, owner_, ": child ", i, " (pid ", children_[i].pid, ") is still running",
                  hint("stop() them first"));
  children_.clear();
}

}  // namespace tinyddp
