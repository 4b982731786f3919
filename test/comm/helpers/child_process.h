// Multi-process test helpers: fork a child that runs a lambda, or run a program, and collect how it
// ended, always within a deadline (a child that overruns is SIGKILLed and reported as timed out).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "test/test_skip.h"

// ThreadSanitizer cannot follow a forked child of a multi-threaded process that keeps running
// instead of calling exec (it reports "dup thread" and exits 66). Test cases whose children are
// spawn_child lambdas start with this, and skip with a message under TSan; spawn_program is fine.
#if defined(__SANITIZE_THREAD__)
#define TINYDDP_SKIP_UNDER_TSAN() \
  TINYDDP_SKIP("under ThreadSanitizer, which does not support forked children that do not exec")
#else
#define TINYDDP_SKIP_UNDER_TSAN() \
  do {                            \
  } while (0)
#endif

namespace tinyddp::testing {

using Clock = std::chrono::steady_clock;

struct ChildOutcome {
  int exit_code = -1;  // when it exited
  int signal = 0;      // when a signal ended it
  bool timed_out = false;
  std::string report;  // what the child wrote to its report pipe (lambda children) or its output (programs)

  bool ok() const { return exit_code == 0 && !timed_out; }
  std::string describe() const {
    std::string text = timed_out ? "timed out (killed)"
                       : signal  ? "killed by signal " + std::to_string(signal)
                                 : "exit code " + std::to_string(exit_code);
    return text + (report.empty() ? "" : "; said: " + report);
  }
};

struct Child {
  pid_t pid = -1;
  int out_fd = -1;  // read end: the child's report (or stdout+stderr for programs)
};

// Forks; the child runs body(report) and _exit()s with its return value (99 when it throws, with the
// exception text as the report). _exit, not exit: the child must not flush the parent's buffers or run
// its destructors.
inline Child spawn_child(const std::function<int(std::string& report)>& body) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return {};
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    std::string report;
    int code = 98;
    try {
      code = body(report);
    } catch (const std::exception& e) {
      report += e.what();
      code = 99;
    } catch (...) {
      report += "unknown exception";
      code = 99;
    }
    for (size_t at = 0; at < report.size();) {
      ssize_t n = write(fds[1], report.data() + at, report.size() - at);
      if (n <= 0) break;
      at += size_t(n);
    }
    _exit(code);
  }
  close(fds[1]);
  return {pid, fds[0]};
}

// Runs argv with this environment plus `env_add` (NAME=value, replacing any NAME already set),
// stdout and stderr both captured.
inline Child spawn_program(const std::vector<std::string>& argv, const std::vector<std::string>& env_add = {}) {
  std::vector<std::string> env_strings;
  auto overridden = [&](const std::string& entry) {
    for (const auto& e : env_add)
      if (e.substr(0, e.find('=') + 1) == entry.substr(0, entry.find('=') + 1)) return true;
    return false;
  };
  for (char** e = environ; *e; ++e)
    if (!overridden(*e)) env_strings.emplace_back(*e);
  for (const auto& e : env_add) env_strings.push_back(e);
  std::vector<char*> args, envs;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const auto& e : env_strings) envs.push_back(const_cast<char*>(e.c_str()));
  envs.push_back(nullptr);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return {};
  // Blocked across the fork, so a signal meant for the program cannot run the test's handlers in the
  // child before exec.
  sigset_t all, saved;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &saved);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    struct sigaction default_action {};
    default_action.sa_handler = SIG_DFL;
    for (int s = 1; s < NSIG; ++s) sigaction(s, &default_action, nullptr);
    sigprocmask(SIG_SETMASK, &saved, nullptr);
    execve(args[0], args.data(), envs.data());
    _exit(127);
  }
  pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  close(fds[1]);
  return {pid, fds[0]};
}

// Reads the child's output until EOF and reaps it, or kills it at the deadline. Afterwards `child`
// is empty (pid -1), so a ChildGuard knows there is nothing left to do.
inline ChildOutcome finish_child(Child& child, Clock::time_point deadline) {
  ChildOutcome outcome;
  if (child.pid <= 0) {
    outcome.report = "could not start the child";
    return outcome;
  }
  char buffer[4096];
  while (child.out_fd >= 0) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) break;
    pollfd p{child.out_fd, POLLIN, 0};
    if (poll(&p, 1, int(std::min<long>(left, 1000))) <= 0) continue;
    ssize_t n = read(child.out_fd, buffer, sizeof buffer);
    if (n <= 0) {
      close(child.out_fd);
      child.out_fd = -1;
    } else {
      outcome.report.append(buffer, size_t(n));
    }
  }
  int status = 0;
  for (;;) {
    pid_t done = waitpid(child.pid, &status, WNOHANG);
    if (done == child.pid) break;
    if (Clock::now() >= deadline) {
      kill(child.pid, SIGKILL);
      waitpid(child.pid, &status, 0);
      outcome.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (child.out_fd >= 0) close(child.out_fd);
  child = Child{};
  if (WIFEXITED(status)) outcome.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) outcome.signal = WTERMSIG(status);
  return outcome;
}

inline ChildOutcome finish_child(Child& child, std::chrono::milliseconds timeout) {
  return finish_child(child, Clock::now() + timeout);
}
inline ChildOutcome finish_child(Child&& child, Clock::time_point deadline) { return finish_child(child, deadline); }
inline ChildOutcome finish_child(Child&& child, std::chrono::milliseconds timeout) {
  return finish_child(child, Clock::now() + timeout);
}

// Kills and reaps a child that a test leaves behind (a failed REQUIRE, an exception), so no process
// outlives its test.
struct ChildGuard {
  Child& child;
  ~ChildGuard() {
    if (child.pid <= 0) return;
    kill(child.pid, SIGKILL);
    finish_child(child, std::chrono::seconds(5));
  }
};

// Reads from a child's output until `marker` has appeared and the line it is on is complete.
// Returns everything read ("" when the deadline passed first). Used to learn the port a server
// printed.
inline std::string read_until(int fd, const std::string& marker, std::chrono::milliseconds timeout) {
  std::string text;
  auto deadline = Clock::now() + timeout;
  char c;
  while (Clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 50) <= 0) continue;
    if (read(fd, &c, 1) != 1) break;
    text += c;
    if (c == '\n' && text.find(marker) != std::string::npos) return text;
  }
  return "";
}

// Polls `condition` every few milliseconds until it holds or the timeout passes.
template <typename Condition>
bool eventually(Condition condition, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  auto deadline = Clock::now() + timeout;
  while (!condition()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// True when no process with this pid is alive (gone, or a zombie waiting for a parent that may never
// reap it inside a container).
inline bool process_is_gone(pid_t pid) {
  if (kill(pid, 0) != 0) return true;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", int(pid));
  FILE* f = std::fopen(path, "r");
  if (!f) return true;
  char line[512] = {0};
  size_t n = std::fread(line, 1, sizeof line - 1, f);
  std::fclose(f);
  const char* close_paren = std::strrchr(line, ')');
  return n == 0 || (close_paren && close_paren[1] == ' ' && (close_paren[2] == 'Z' || close_paren[2] == 'X'));
}

// A loopback port that was free a moment ago (bound to port 0, read back, released), for tests whose
// processes must agree on a port before any of them listens on it.
// A socket listening on a free loopback port (its port in *port), for tests that play a server
// themselves; the caller closes it. -1 when the system refuses.
inline int loopback_listener(int* port, int backlog = 16) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof addr;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, backlog) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  *port = ntohs(addr.sin_port);
  return fd;
}

inline int free_loopback_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof addr;
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) == 0)
    port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

}  // namespace tinyddp::testing
