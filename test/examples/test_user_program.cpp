// A user's own program, written as the README teaches, meets the failures a user meets: a worker
// killed, Ctrl-C, a read-only checkpoint directory, labels of the wrong dtype. Each must end with
// exit code 1 and one message -- never "terminate called after throwing" and SIGABRT -- and leave
// nothing behind: not in $TMPDIR (the spawner's temporary folder), not in the checkpoint directory
// (a checkpoint's temporary), not in /dev/shm (the workers' segments). The program is the real
// sine_fit (it uses run_main) or test_user_program (examples/helpers/user_program.cpp), which catches
// nothing at all: what it gets right, the library did alone.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "test/comm/helpers/child_process.h"
#include "test/examples/example_programs.h"
#include "test/test_skip.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::testing;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::set<std::string> names_in(const std::filesystem::path& dir) {
  std::set<std::string> names;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error))
    names.insert(entry.path().filename().string());
  return names;
}

// The processes whose parent is `parent` (read from /proc/<pid>/stat: "pid (command) state ppid ...").
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> children;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", error)) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "stat");
    std::string line;
    std::getline(in, line);
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(line.c_str() + close + 1, " %c %d", &state, &ppid) == 2 && ppid == parent)
      children.push_back(pid_t(std::atoi(name.c_str())));
  }
  return children;
}

// The RANK a process was started with (its /proc/<pid>/environ), or -1.
int rank_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  std::string entry;
  while (std::getline(in, entry, '\0'))
    if (entry.starts_with("RANK=")) return std::atoi(entry.c_str() + 5);
  return -1;
}

// The /dev/shm segments a process made: the shm transport names each one "...-<creator pid>".
std::vector<std::string> shm_segments_of(const std::vector<pid_t>& pids) {
  std::vector<std::string> found;
  for (const std::string& name : names_in("/dev/shm"))
    for (pid_t pid : pids)
      if (name.starts_with("tinyddp-") && name.ends_with("-" + std::to_string(pid))) found.push_back(name);
  return found;
}

// Runs argv[0] as given (run() finds it among the built programs) to its end, at most two minutes.
ChildOutcome run_as_is(const std::vector<std::string>& argv, const std::vector<std::string>& env = {}) {
  return finish_child(spawn_program(argv, env), std::chrono::seconds(120));
}

// What every failure must look like: exit code 1, the expected words, the library's message once,
// no abort and no internal "check ... failed at" line.
void check_one_clean_failure(const ChildOutcome& out, const std::string& expected) {
  INFO("the program said: ", out.report);
  CHECK(out.signal == 0);
  CHECK(out.exit_code == 1);
  CHECK(contains(out.report, expected));
  CHECK(count(out.report, "tinyddp error: ") == 1);
  CHECK_FALSE(contains(out.report, "terminate called"));
  CHECK_FALSE(contains(out.report, "Aborted"));
  CHECK_FALSE(contains(out.report, "failed at "));
  CHECK_FALSE(contains(out.report, "--checkpoint-dir"));  // a library hint names no example's flag
}

// Nothing left: $TMPDIR as empty as it was given, the checkpoint directory holding only checkpoints
// and their history, no segment of the spawner or its workers in /dev/shm.
void check_nothing_left(const TempDir& tmp, const std::string& checkpoint_dir, const std::vector<pid_t>& pids) {
  CHECK(names_in(tmp.path).empty());
  if (!checkpoint_dir.empty())
    for (const std::string& name : names_in(checkpoint_dir))
      CHECK_MESSAGE((name == "last.safetensors" || name == "best.safetensors" || name == "history.jsonl"),
                    "left in the checkpoint directory: ", name);
  CHECK(shm_segments_of(pids).empty());
}

// Starts `argv` with its own TMPDIR and waits until both workers run and, with a checkpoint
// directory, the first checkpoint is written (the job is training).
struct RunningJob {
  Child spawner;
  ChildGuard guard{spawner};  // a failed REQUIRE below leaves no job running (its workers die with it)
  std::vector<pid_t> workers;

  RunningJob(const std::vector<std::string>& argv, const TempDir& tmp, const std::string& checkpoint_dir) {
    spawner = spawn_program(argv, {"TMPDIR=" + tmp.path.string()});
    REQUIRE(eventually([&] { return children_of(spawner.pid).size() == 2; }, std::chrono::seconds(60)));
    workers = children_of(spawner.pid);
    if (!checkpoint_dir.empty())
      REQUIRE(eventually([&] { return std::filesystem::exists(checkpoint_dir + "/last.safetensors"); },
                         std::chrono::seconds(60)));
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(500));  // into training
  }

  std::vector<pid_t> everyone() const {
    std::vector<pid_t> pids = workers;
    pids.push_back(spawner.pid);
    return pids;
  }
};

}  // namespace

TEST_CASE("user program: a worker killed with SIGKILL ends the job with exit 1 naming it; nothing is left behind") {
  if (!have_programs({"test_user_program"})) return;
  TempDir tmp, checkpoints;
  const std::string dir = checkpoints.file("run");
  RunningJob job({program("test_user_program"), dir, "100000", "i64"}, tmp, dir);
  REQUIRE(kill(job.workers[0], SIGKILL) == 0);
  ChildOutcome out = finish_child(job.spawner, std::chrono::seconds(60));
  check_one_clean_failure(out, "was killed by signal 9");
  // No output of its own to point at: the hint says where a SIGKILL comes from.
  CHECK(contains(out.report, "hint: something outside the job killed it"));
  check_nothing_left(tmp, dir, job.everyone());
}

TEST_CASE(
    "user program: SIGINT (to the spawner, or Ctrl-C to the whole job) stops it with exit 1, says how to resume, "
    "leaves nothing") {
  if (!have_programs({"test_user_program"})) return;
  for (bool whole_job : {false, true}) {
    CAPTURE(whole_job);
    TempDir tmp, checkpoints;
    const std::string dir = checkpoints.file("run");
    RunningJob job({program("test_user_program"), dir, "100000", "i64"}, tmp, dir);
    if (whole_job) {
      // What the terminal does on Ctrl-C: SIGINT to every process of the foreground job at once.
      for (pid_t pid : job.everyone()) kill(pid, SIGINT);
    } else {
      REQUIRE(kill(job.spawner.pid, SIGINT) == 0);  // the spawner then stops its workers (SIGTERM)
    }
    ChildOutcome out = finish_child(job.spawner, std::chrono::seconds(60));
    check_one_clean_failure(out, "stopped by signal 2 (Interrupt)");
    CHECK(contains(out.report, "hint: run it again to resume from " + dir + "/last.safetensors ("));
    check_nothing_left(tmp, dir, job.everyone());
  }
}

TEST_CASE(
    "user program: f32 labels for a classifier are refused with exit 1 naming the dtype; nothing is left behind") {
  if (!have_programs({"test_user_program"})) return;
  TempDir tmp, checkpoints;
  const std::string dir = checkpoints.file("run");
  Child spawner = spawn_program({program("test_user_program"), dir, "2", "f32"}, {"TMPDIR=" + tmp.path.string()});
  ChildGuard guard{spawner};
  const pid_t pid = spawner.pid;
  ChildOutcome out = finish_child(spawner, std::chrono::seconds(120));
  check_one_clean_failure(out, "argument `labels` is f32[32] on cpu but must be i64");
  check_nothing_left(tmp, dir, {pid});
}

TEST_CASE(
    "user program: a read-only checkpoint directory is refused as read-only, with exit 1; nothing is left behind") {
  if (!have_programs({"test_user_program"})) return;
  TempDir tmp, checkpoints;
  const std::string dir = checkpoints.file("run");
  std::filesystem::create_directories(dir);
  // A read-only file system over the directory, in a mount namespace of the program's own (as an
  // unprivileged user too, through a user namespace). Where Linux forbids that, the test says so.
  ChildOutcome probe = run_as_is({"/usr/bin/unshare", "-rm", "sh", "-c", "mount -t tmpfs -o ro tmpfs \"$0\"", dir});
  if (probe.exit_code != 0) {
    TINYDDP_SKIP("unshare -rm cannot mount a read-only file system here: ", probe.report);
  }
  Child spawner = spawn_program({"/usr/bin/unshare", "-rm", "sh", "-c",
                                 "mount -t tmpfs -o ro tmpfs \"$1\" && exec \"$0\" \"$1\" 2 i64",
                                 program("test_user_program"), dir},
                                {"TMPDIR=" + tmp.path.string()});
  ChildGuard guard{spawner};
  ChildOutcome out = finish_child(spawner, std::chrono::seconds(120));
  check_one_clean_failure(out, "the checkpoint directory " + dir + " is on a read-only file system; hint: ");
  CHECK_FALSE(contains(out.report, "not writable by this user"));
  check_nothing_left(tmp, dir, {});

  // The same words for an output path checked before the work (core/output_path.h).
  if (!have_programs({"dummy"})) return;
  ChildOutcome save = run_as_is(
      {"/usr/bin/unshare", "-rm", "sh", "-c",
       "mount -t tmpfs -o ro tmpfs \"$1\" && exec \"$0\" --epochs 1 --save \"$1/x.safetensors\"", program("dummy"),
       dir});
  CHECK(save.exit_code == 1);
  CHECK(contains(save.report,
                 "--save " + dir + "/x.safetensors: the directory " + dir + " is on a read-only file system; hint: "));
}

TEST_CASE("user program: a checkpoint directory without write permission is refused as such (not as read-only)") {
  if (!have_programs({"test_user_program"})) return;
  if (geteuid() == 0) {
    TINYDDP_SKIP("root writes through any permission; the read-only file system case covers root");
  }
  TempDir tmp, checkpoints;
  const std::string dir = checkpoints.file("run");
  std::filesystem::create_directories(dir);
  std::filesystem::permissions(dir, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
  ChildOutcome out = run({"test_user_program", dir, "2", "i64"}, {"TMPDIR=" + tmp.path.string()});
  check_one_clean_failure(out, "the checkpoint directory " + dir + " is not writable by this user; hint: ");
  std::filesystem::permissions(dir, std::filesystem::perms::owner_all);
  check_nothing_left(tmp, dir, {});
}

TEST_CASE(
    "sine_fit, the README's program: a killed worker and Ctrl-C each end with exit 1 and one message, no litter") {
  if (!have_programs({"sine_fit"})) return;
  for (bool interrupt : {false, true}) {
    CAPTURE(interrupt);
    TempDir tmp;
    Child spawner = spawn_program({program("sine_fit")}, {"TMPDIR=" + tmp.path.string()});
    ChildGuard guard{spawner};
    // sine_fit trains for a fraction of a second: its workers are frozen (SIGSTOP) as soon as they
    // appear, so the signal surely comes while the job runs. Only once they run the program (their
    // environment has RANK): a child frozen between fork and exec would keep the spawner waiting for
    // that exec, and the second worker would never start.
    std::vector<pid_t> workers;
    REQUIRE(eventually(
        [&] {
          for (pid_t pid : children_of(spawner.pid))
            if (std::find(workers.begin(), workers.end(), pid) == workers.end() && rank_of(pid) >= 0 &&
                kill(pid, SIGSTOP) == 0)
              workers.push_back(pid);
          return workers.size() == 2;
        },
        std::chrono::seconds(60)));
    std::vector<pid_t> everyone = workers;
    everyone.push_back(spawner.pid);
    if (interrupt) {
      for (pid_t pid : everyone) kill(pid, SIGINT);  // Ctrl-C: the whole foreground job
    } else {
      REQUIRE(kill(workers[1], SIGKILL) == 0);
    }
    for (pid_t pid : workers) kill(pid, SIGCONT);
    ChildOutcome out = finish_child(spawner, std::chrono::seconds(60));
    check_one_clean_failure(out, interrupt ? "stopped by signal 2 (Interrupt)" : "was killed by signal 9");
    if (interrupt) CHECK(contains(out.report, "hint: nothing was saved; a trainer with StateManager"));
    check_nothing_left(tmp, "", everyone);
  }
}

namespace {
std::string host_name() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return host;
}
}  // namespace

TEST_CASE("user program: a second job into a checkpoint directory in use fails at once naming the holder") {
  if (!have_programs({"test_user_program"})) return;
  TempDir tmp, checkpoints;
  const std::string dir = checkpoints.file("run");
  RunningJob first({program("test_user_program"), dir, "100000", "i64"}, tmp, dir);
  pid_t writer = -1;  // the first job's rank 0: the process that writes the checkpoints
  for (pid_t pid : first.workers)
    if (rank_of(pid) == 0) writer = pid;
  REQUIRE(writer > 0);
  {
    std::ifstream lock(dir + "/lock");
    std::string line;
    std::getline(lock, line);
    CHECK(line.starts_with("pid " + std::to_string(writer) + " on host " + host_name() + " since "));
  }

  TempDir second_tmp;
  ChildOutcome second = run({"test_user_program", dir, "100000", "i64"}, {"TMPDIR=" + second_tmp.path.string()});
  check_one_clean_failure(second, "the checkpoint directory " + dir + " is in use by another job (pid " +
                                      std::to_string(writer) + " on host " + host_name() + " since ");
  CHECK(names_in(second_tmp.path).empty());
  CHECK(process_is_gone(writer) == false);  // the first job goes on, untouched

  // Once the first job is gone, the directory is free: nothing is left that a third would trip on.
  for (pid_t pid : first.everyone()) kill(pid, SIGINT);
  ChildOutcome out = finish_child(first.spawner, std::chrono::seconds(60));
  CHECK(out.exit_code == 1);
  check_nothing_left(tmp, dir, first.everyone());
}
