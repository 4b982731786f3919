// Bad input to the programs, as a careless user gives it: every mistake is refused before the work
// starts, by name, with the exit code of its kind (2: the command line; 1: the work failed), and
// nothing is left behind. docs/reliability.md ("Bad input") lists each case with its message.
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tinyddp/core/safetensors.h"
#include "tinyddp/core/tensor.h"
#include "test/comm/helpers/child_process.h"
#include "test/examples/example_programs.h"
#include "test/test_skip.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::testing;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A mistake on the command line: exit code 2, no training, and the message.
void check_usage_error(const std::vector<std::string>& argv, const std::string& message) {
  ChildOutcome out = run(argv);
  INFO(argv[0], " said: ", out.report);
  CHECK(out.exit_code == 2);
  CHECK(contains(out.report, message));
  CHECK_FALSE(contains(out.report, "epoch 1/"));
}

// The spawners' temporary folders left in `dir`.
int spawn_dirs_in(const std::string& dir) {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    n += entry.path().filename().string().starts_with("tinyddp_spawn_") ? 1 : 0;
  return n;
}

// A pid that no process has: a child that has exited and been reaped.
pid_t dead_pid() {
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  int status = 0;
  waitpid(pid, &status, 0);
  return pid;
}

// Listens on a free loopback port, as another program holding it would.
struct HeldPort {
  int fd = -1, port = 0;
  HeldPort() {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&address), length) == 0);
    REQUIRE(::listen(fd, 1) == 0);
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0);
    port = ntohs(address.sin_port);
  }
  ~HeldPort() { ::close(fd); }
};

}  // namespace

TEST_CASE("programs: a number out of range or an unknown flag is a usage error (exit 2) naming the flag") {
  if (!have_programs({"dummy", "dummy_mgpu", "digits", "tinyddp-run", "train_bench", "ring_explain"})) return;
  check_usage_error({"digits", "--epochs", "-1"}, "--epochs: must be >= 0, got -1");
  check_usage_error({"dummy", "--epochs", "-1"}, "--epochs: must be >= 0, got -1");
  check_usage_error({"dummy", "--samples", "0"}, "--samples: must be >= 1, got 0");
  check_usage_error({"dummy", "--samples", "-5"}, "--samples: must be >= 1, got -5");
  check_usage_error({"dummy_mgpu", "--world-size", "0"}, "--world-size: must be from 1 to 4096, got 0");
  check_usage_error({"dummy_mgpu", "--world-size", "-1"}, "--world-size: must be from 1 to 4096, got -1");
  check_usage_error({"dummy_mgpu", "--lr", "0"}, "--lr: must be > 0, got 0");
  check_usage_error({"digits", "--bogus"}, "digits: unknown flag --bogus");
  check_usage_error({"digits", "--precision", "bf17"}, "--precision 'bf17' is not a precision; hint: use fp32");
  check_usage_error({"dummy_mgpu", "--precision", "int8"}, "--precision 'int8' is not a precision");
  check_usage_error({"train_bench", "--precision", "fp8"}, "--precision 'fp8' is not a precision");
  check_usage_error({"train_bench", "--batch", "8"}, "unknown flag --batch");
  check_usage_error({"train_bench", "--batch-size", "0"}, "--batch-size: must be >= 1, got 0");
  check_usage_error({"ring_explain", "--ranks", "9"}, "--ranks: must be from 2 to 6, got 9");
  check_usage_error({"tinyddp-run", "--bogus", "-n", "2", "prog"}, "tinyddp-run: unknown flag --bogus");
  check_usage_error({"tinyddp-run", "--grace-ms", "-1", "true"}, "--grace-ms: must be from 0 to 3600000, got -1");
  check_usage_error({"tinyddp-run", "-n", "0", "true"}, "--nproc-per-node: must be from 1 to 4096, got 0");
  check_usage_error({"tinyddp-run", "--nnodes", "2", "--node-rank", "2", "true"},
                    "--node-rank 2 is not below --nnodes 2");
}

TEST_CASE("programs: --version everywhere, and --help shows the defaults") {
  if (!have_programs({"dummy", "dummy_mgpu", "digits", "tinyddp-run", "tinyddp-store", "train_bench", "ring_explain"}))
    return;
  for (const char* name :
       {"dummy", "dummy_mgpu", "digits", "tinyddp-run", "tinyddp-store", "train_bench", "ring_explain"}) {
    ChildOutcome version = run({name, "--version"});
    CHECK(version.exit_code == 0);
    CHECK(contains(version.report, std::string(name) + " (tinyddp 0."));
  }
  ChildOutcome help = run({"digits", "--help"});
  CHECK(help.exit_code == 0);
  CHECK(contains(help.report, "--epochs"));
  CHECK(contains(help.report, "50"));  // digits' own default epochs
  CHECK(contains(help.report, "data/digits.csv.gz"));
}

TEST_CASE("programs: an output path that cannot be written is refused before training, and by name") {
  if (!have_programs({"dummy", "dummy_mgpu"})) return;
  ChildOutcome save = run({"dummy", "--epochs", "3", "--save", "/nonexistent/dir/x.safetensors"});
  CHECK(save.exit_code == 1);
  CHECK(contains(save.report, "--save /nonexistent/dir/x.safetensors: the directory /nonexistent/dir does not exist"));
  CHECK_FALSE(contains(save.report, "epoch  1/3"));
  TempDir dir;
  ChildOutcome trace = run({"dummy_mgpu", "--device", "cpu", "--world-size", "2", "--epochs", "3", "--save", ""},
                           {"TINYDDP_TRACE=/nonexistent/run.json", "TMPDIR=" + dir.path.string()});
  CHECK(trace.exit_code == 1);
  CHECK(contains(trace.report, "TINYDDP_TRACE /nonexistent/run.json: the directory /nonexistent does not exist"));
  CHECK_FALSE(contains(trace.report, "epoch 1/3"));
  CHECK(spawn_dirs_in(dir.path.string()) == 0);
}

TEST_CASE("programs: a bad environment variable stops the run naming the variable and the values it allows") {
  if (!have_programs({"dummy_mgpu"})) return;
  TempDir dir;
  const std::vector<std::string> argv = {"dummy_mgpu", "--device", "cpu", "--world-size", "2", "--epochs",
                                         "1",          "--save",   ""};
  ChildOutcome debug = run(argv, {"TINYDDP_DEBUG=verbose", "TMPDIR=" + dir.path.string()});
  CHECK(debug.exit_code == 1);
  CHECK(contains(debug.report, "TINYDDP_DEBUG='verbose' is not one of OFF, INFO or DETAIL"));
  ChildOutcome fifo = run(argv, {"TINYDDP_SHM_FIFO_BYTES=abc", "TMPDIR=" + dir.path.string()});
  CHECK(fifo.exit_code == 1);
  CHECK(contains(fifo.report, "TINYDDP_SHM_FIFO_BYTES='abc' is not a whole number"));
  ChildOutcome level = run(argv, {"TINYDDP_LOG_LEVEL=loud", "TMPDIR=" + dir.path.string()});
  CHECK(level.exit_code == 1);
  CHECK(contains(level.report, "TINYDDP_LOG_LEVEL='loud' is not one of debug, info, warn, error or off"));
  CHECK(spawn_dirs_in(dir.path.string()) == 0);
}

TEST_CASE(
    "digits: a label that is not a class is refused at its line; a directory is named as one; no data/ says make "
    "data") {
  if (!have_programs({"digits"})) return;
  TempDir dir;
  {
    std::ofstream csv(dir.file("d.csv"));
    for (int row = 0; row < 3; ++row) {
      for (int pixel = 0; pixel < 64; ++pixel) csv << pixel % 17 << ",";
      csv << (row == 1 ? 12 : row) << "\n";
    }
  }
  ChildOutcome label = run({"digits", "--data", dir.file("d.csv"), "--world-size", "1"});
  CHECK(label.exit_code == 1);
  CHECK(contains(label.report, "d.csv:2, column 65: the label 12 is not a class of this model (10 classes: 0 to 9)"));
  // A directory where the file was meant: said as such, with the CSV files it holds; not "damaged".
  ChildOutcome directory = run({"digits", "--data", dir.path.string(), "--world-size", "1"});
  CHECK(directory.exit_code == 1);
  CHECK(contains(directory.report,
                 dir.path.string() +
                     " is a directory, not a CSV file; hint: name the file to read: " + dir.file("d.csv")));
  CHECK_FALSE(contains(directory.report, "damaged"));
  if (std::filesystem::exists("data/digits.csv.gz")) {
    TINYDDP_SKIP_PART("the make-data hint: data/digits.csv.gz is there in ", std::filesystem::current_path().string());
    return;
  }
  ChildOutcome missing = run({"digits", "--world-size", "1"});
  CHECK(missing.exit_code == 1);
  CHECK(contains(missing.report, "--data data/digits.csv.gz does not exist; hint: run `make data`"));
}

TEST_CASE("dummy_mgpu: a NaN weight stops the job at the first step, said once with each rank's line after it") {
  if (!have_programs({"dummy_mgpu"})) return;
  TempDir dir;
  Tensor weight = Tensor::zeros({2, 10}), bias = Tensor::zeros({2});
  weight.data<float>()[3] = std::numeric_limits<float>::quiet_NaN();
  save_safetensors(dir.file("nan.safetensors"), {{"weight", weight}, {"bias", bias}});
  ChildOutcome out = run({"dummy_mgpu", "--device", "cpu", "--world-size", "2", "--epochs", "2", "--load",
                          dir.file("nan.safetensors"), "--save", dir.file("out.safetensors")},
                         {"TMPDIR=" + dir.path.string()});
  CHECK(out.exit_code == 1);
  // The spawner's one message: the root cause with its hint, then the other rank's own line.
  CHECK(count(out.report, "tinyddp error: MultiDevice: rank ") == 1);
  CHECK(count(out.report, "tinyddp error:") == 1);  // the workers' own copies are not printed
  CHECK(count(out.report, "the loss is nan at epoch 1, batch 1 (step 1, rank ") == 2);
  CHECK(count(out.report, "\n  then rank ") == 1);
  CHECK(
      contains(out.report,
               "hint: look for NaN or huge values in the inputs and in the weights it started from (a loaded model)"));
  CHECK_FALSE(std::filesystem::exists(dir.file("out.safetensors")));
  CHECK(spawn_dirs_in(dir.path.string()) == 0);
}

TEST_CASE("dummy_mgpu: an explicit --init-method whose port is taken is an error naming who holds it") {
  if (!have_programs({"dummy_mgpu"})) return;
  HeldPort held;
  TempDir dir;
  ChildOutcome out = run({"dummy_mgpu", "--device", "cpu", "--world-size", "2", "--epochs", "1", "--save", "",
                          "--init-method", "tcp://127.0.0.1:" + std::to_string(held.port)},
                         {"TMPDIR=" + dir.path.string()});
  CHECK(out.exit_code == 1);
  CHECK(contains(out.report, "port " + std::to_string(held.port) + " on 127.0.0.1 is already in use by pid " +
                                 std::to_string(getpid())));
  CHECK_FALSE(contains(out.report, "epoch 1/1"));
}

TEST_CASE(
    "dummy_mgpu: SIGTERM to the spawner stops the workers, removes its temporary folder and exits 1; stale ones go") {
  if (!have_programs({"dummy_mgpu"})) return;
  TempDir dir;
  // What a spawner killed with SIGKILL leaves: a folder named after a pid that no longer runs.
  const std::string stale = dir.file("tinyddp_spawn_" + std::to_string(dead_pid()) + "_abc123");
  std::filesystem::create_directories(stale);
  std::ofstream(stale + "/final.safetensors") << "partial";
  Child spawner = spawn_program({program("dummy_mgpu"), "--device", "cpu", "--world-size", "2", "--epochs", "10000",
                                 "--samples", "64", "--save", ""},
                                {"TMPDIR=" + dir.path.string()});
  ChildGuard guard{spawner};
  // The stale folder is cleared when the spawner makes its own.
  REQUIRE(eventually([&] { return !std::filesystem::exists(stale) && spawn_dirs_in(dir.path.string()) == 1; },
                     std::chrono::seconds(30)));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the workers are training
  REQUIRE(kill(spawner.pid, SIGTERM) == 0);
  ChildOutcome out = finish_child(spawner, std::chrono::seconds(30));
  INFO(out.report);
  // It ends as every failure does: one message, exit code 1, after cleaning up.
  CHECK(out.signal == 0);
  CHECK(out.exit_code == 1);
  CHECK(contains(out.report, "MultiDevice: stopped by signal 15 (Terminated); the 2 workers were stopped"));
  CHECK(count(out.report, "tinyddp error: ") == 1);
  CHECK(spawn_dirs_in(dir.path.string()) == 0);
}
