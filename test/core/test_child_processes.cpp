// ChildProcesses (core/child_processes.h): a child gets its environment and nothing else of its
// parent (no descriptor, no signal disposition), an exec that fails is an error, stop() ends what
// ignores SIGTERM and what a child started in its own group, and a child dies with its parent.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "tinyddp/core/child_processes.h"
#include "tinyddp/core/error.h"
#include "tinyddp/core/process.h"

using namespace tinyddp;
using namespace std::chrono_literals;

namespace {

ChildCommand shell(const std::string& script, std::map<std::string, std::string> env = {}) {
  return {"/bin/sh", {"sh", "-c", script}, environment_with(env)};
}

// Everything a child writes on `fd` until it closes it.
std::string read_all(int fd) {
  std::string text;
  char buffer[256];
  for (ssize_t n; (n = read(fd, buffer, sizeof buffer)) > 0;) text.append(buffer, size_t(n));
  return text;
}

bool ends_within(pid_t pid, std::chrono::milliseconds limit) {
  for (auto until = std::chrono::steady_clock::now() + limit; std::chrono::steady_clock::now() < until;) {
    if (!process_alive(pid)) return true;
    std::this_thread::sleep_for(10ms);
  }
  return !process_alive(pid);
}

}  // namespace

TEST_CASE("ChildProcesses: exit codes and signals, the environment given, and an exec that fails") {
  ChildProcesses children("test");
  size_t ok = children.start(shell("test \"$CHILD_VALUE\" = forty-two", {{"CHILD_VALUE", "forty-two"}}));
  size_t three = children.start(shell("exit 3"));
  size_t segv = children.start(shell("kill -SEGV $$"));
  for (size_t i : {ok, three, segv}) CHECK(children.reap(i, true));
  CHECK_FALSE(children.failed(ok));
  CHECK(WEXITSTATUS(children.status(three)) == 3);
  CHECK(children.failed(three));
  CHECK(WIFSIGNALED(children.status(segv)));
  CHECK(WTERMSIG(children.status(segv)) == SIGSEGV);
  CHECK_FALSE(children.any_running());
  CHECK(children.pidfd(ok) == -1);  // closed with the reap
  CHECK_THROWS_WITH_AS(children.start({"/nonexistent/program", {"program"}, {}}),
                       doctest::Contains("test: cannot execute /nonexistent/program: No such file or directory"),
                       Error);
  CHECK(children.size() == 3);
}

TEST_CASE(
    "ChildProcesses: a child inherits no descriptor but 0-2 and no ignored signal; its output goes where it is told") {
  int leak[2];
  REQUIRE(pipe(leak) == 0);  // not close-on-exec: only the supervisor keeps it from the child
  REQUIRE(dup2(leak[0], 57) == 57);
  struct sigaction ignore {
  }, previous{};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGUSR2, &ignore, &previous);
  int out[2];
  REQUIRE(pipe2(out, O_CLOEXEC) == 0);
  ChildProcesses children("test");
  ChildCommand command = shell(
      "if [ -e /proc/self/fd/57 ]; then echo fd 57 leaked; fi; echo to stdout; kill -USR2 $$; echo survived");
  command.stdout_fd = out[1];
  size_t child = children.start(command);
  close(out[1]);
  std::string output = read_all(out[0]);
  close(out[0]);
  REQUIRE(children.reap(child, true));
  sigaction(SIGUSR2, &previous, nullptr);
  close(57), close(leak[0]), close(leak[1]);
  CHECK(output == "to stdout\n");
  CHECK(WIFSIGNALED(children.status(child)));
  CHECK(WTERMSIG(children.status(child)) == SIGUSR2);
}

TEST_CASE("ChildProcesses::stop: SIGTERM, SIGKILL after the grace period for what ignores it, and a group's strays") {
  int out[2];
  REQUIRE(pipe2(out, O_CLOEXEC) == 0);
  ChildProcesses children("test");
  size_t polite = children.start(shell("exec sleep 60"));
  size_t stubborn = children.start(shell("trap '' TERM; while :; do sleep 0.05; done"));
  ChildCommand parent_of_stray = shell("sleep 60 & echo $!; wait");
  parent_of_stray.own_process_group = true;
  parent_of_stray.stdout_fd = out[1];
  size_t group = children.start(parent_of_stray);
  close(out[1]);
  std::string line;
  for (char c; read(out[0], &c, 1) == 1 && c != '\n';) line += c;
  close(out[0]);
  const pid_t stray = pid_t(std::stol(line));
  CHECK(process_alive(stray));
  std::this_thread::sleep_for(100ms);  // the stubborn one has set its trap

  auto start = std::chrono::steady_clock::now();
  std::vector<size_t> late = children.stop(SIGTERM, 500ms);
  auto took = std::chrono::steady_clock::now() - start;
  CHECK(late == std::vector<size_t>{stubborn});
  CHECK(took >= 500ms);
  CHECK(took < 5s);
  CHECK(WTERMSIG(children.status(polite)) == SIGTERM);
  CHECK(WTERMSIG(children.status(stubborn)) == SIGKILL);
  CHECK(WTERMSIG(children.status(group)) == SIGTERM);
  CHECK_FALSE(children.any_running());
  CHECK(ends_within(stray, 2s));  // the group's SIGTERM reached what its leader started
  children.clear();
  CHECK(children.size() == 0);
}

TEST_CASE("ChildProcesses: a child dies with its parent, even one killed with SIGKILL") {
  int out[2];
  REQUIRE(pipe2(out, O_CLOEXEC) == 0);
  pid_t parent = fork();
  REQUIRE(parent >= 0);
  if (parent == 0) {
    ChildProcesses children("test");
    pid_t pid = children.pid(children.start(shell("exec sleep 60")));
    ssize_t ignored = write(out[1], &pid, sizeof pid);
    (void)ignored;
    pause();  // until the test kills this process
    _exit(0);
  }
  close(out[1]);
  pid_t grandchild = 0;
  REQUIRE(read(out[0], &grandchild, sizeof grandchild) == sizeof grandchild);
  close(out[0]);
  CHECK(process_alive(grandchild));
  kill(parent, SIGKILL);
  waitpid(parent, nullptr, 0);
  CHECK(ends_within(grandchild, 5s));
}
