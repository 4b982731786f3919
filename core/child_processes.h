// ChildProcesses: programs this process starts and watches until they end. tinyddp-run starts its
// workers with it (comm/launch/launcher.h), and MultiDevice the ranks it spawns
// (nn/train/addons/spawned_workers.h); what both need from the kernel is written here once:
//
//   - start() is fork + exec of a program file with an environment of its own. A child is a fresh
//     process, never a fork() that goes on running: a forked copy of a process with threads (a store
//     server, a data loader, OpenBLAS) inherits their locks but not the threads;
//   - the child asks the kernel to kill it when its parent dies (PR_SET_PDEATHSIG), so even a parent
//     killed with SIGKILL leaves nothing running, and exits at once if the parent died before it
//     could ask (the orphan check);
//   - it inherits no descriptor but stdin, stdout and stderr (a parent's sockets must not live on in
//     its children), and no signal handler: a SIGTERM that arrives before exec ends it, it does not
//     run the parent's handler in the child;
//   - an exec that fails is reported by start() as an error naming the program, not as a mysterious
//     exit code 127 later;
//   - stop() ends them all: a signal (SIGTERM), then SIGKILL to what is left after a grace period, and
//     every child is reaped: no orphans, no zombies. A child started in its own process group is
//     signalled as a group, so whatever it started itself goes too.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace tinyddp {

// This process's environment with `overrides` replacing or adding variables, as "NAME=value" strings.
std::vector<std::string> environment_with(const std::map<std::string, std::string>& overrides);

// How to start one child.
struct ChildCommand {
  std::string program;                   // path of an executable file (not searched on PATH)
  std::vector<std::string> argv;         // argv[0] included
  std::vector<std::string> environment;  // the child's whole environment, "NAME=value" each
  // In a process group of its own: stop() then reaches everything it starts. A child in its own group
  // no longer gets the terminal's Ctrl-C, so only a supervisor that forwards signals itself (the
  // launcher) wants this.
  bool own_process_group = false;
  int stdout_fd = -1;  // where its stdout goes; -1: this process's stdout
  int stderr_fd = -1;  // the same for stderr
  // The CPUs it may run on, set before exec so that every thread it starts inherits them; empty: the
  // ones this process may run on.
  std::vector<int> cpus{};
};

class ChildProcesses {
 public:
  // `owner` begins every error message: "tinyddp-run", "MultiDevice".
  explicit ChildProcesses(std::string owner);
  // Kills (SIGKILL, the group too) and reaps every child still running: whatever happened, an
  // exception included, no child outlives its supervisor.
  ~ChildProcesses();
  ChildProcesses(const ChildProcesses&) = delete;
  ChildProcesses& operator=(const ChildProcesses&) = delete;

  // Starts one child; returns its index (0, 1, ... in the order started). Throws when it cannot be
  // started: fork failed, or exec did (then the child is already reaped).
  size_t start(const ChildCommand& command);

  size_t size() const { return children_.size(); }
  pid_t pid(size_t child) const { return children_[child].pid; }
  bool running(size_t child) const { return children_[child].running; }
  bool any_running() const;
  // Its waitpid status, once reap() found it ended (0 when it was reaped by someone else).
  int status(size_t child) const { return children_[child].status; }
  // Whether it ended other than by exit(0).
  bool failed(size_t child) const;
  // Readable from the moment the child ends, until it is reaped: a poll() that includes it wakes at
  // once. -1 once reaped, or on kernels before 5.3 (no pidfd_open).
  int pidfd(size_t child) const { return children_[child].pidfd; }

  // True once `child` has ended, its status recorded; `block` waits for that.
  bool reap(size_t child, bool block = false);
  // Reaps every child that has ended; returns those that ended now, in index order.
  std::vector<size_t> reap_ended();

  // What stop() does between its looks at the children; the launcher reads their output meanwhile.
  using Idle = std::function<void(std::chrono::milliseconds)>;
  // Ends every child: `signal` (and SIGCONT, so that a stopped child wakes to get it), then, for up to
  // `grace`, `idle` (default: sleep) and a look whether all have ended; then SIGKILL to what is left,
  // and every child reaped. Returns the children that were still running when the grace period ran
  // out. A child in its own process group is signalled as a group even after it exited, for what it
  // left behind.
  std::vector<size_t> stop(int signal, std::chrono::milliseconds grace, const Idle& idle = {});

  // Forgets every child; each must have been reaped (stop() does that).
  void clear();

 private:
  struct Child {
    pid_t pid = -1;
    bool own_group = false;
    bool running = false;
    int status = 0;
    int pidfd = -1;
  };
  bool group_alive(const Child& child) const;

  std::string owner_;
  std::vector<Child> children_;
};

}  // namespace tinyddp
