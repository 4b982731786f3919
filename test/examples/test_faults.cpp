// Fault tolerance, end to end: the seed's multi-device job (dummy_mgpu, 2 CPU workers) under
// tinyddp-run --max-restarts, with a worker SIGKILLed at each moment core/fault_injection.h names
// (forward, backward, mid all-reduce, mid checkpoint write). The restarted group must resume from the
// last complete checkpoint and end *bitwise* where a run that was never killed ends: the same final
// weights, computed independently by an unfaulted run. Without restarts left, the launcher must name
// the rank that was killed, not the ones that failed because it had gone; ranks that resumed from
// different checkpoints must refuse to train. And the short soak
// (test/soak/soak: random worker, random moment) must finish every run with no checkpoint corrupt.
#include <doctest/doctest.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tinyddp/core/error.h"
#include "tinyddp/core/safetensors.h"
#include "tinyddp/nn/train/addons/state_manager.h"
#include "test/comm/helpers/child_process.h"
#include "test/test_skip.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace std::chrono_literals;

namespace {

using FaultDir = tinyddp::testing::TempDir;

std::string bin(const std::string& name) { return std::string(TINYDDP_BIN_DIR) + "/" + name; }

// What a checkpoint directory holds once its writers are done: the checkpoints and the history
// (nn/train/addons/history_file.h), no temporary file.
bool checkpoint_dir_file(const std::filesystem::path& path) {
  return path.extension() == ".safetensors" || path.filename() == "history.jsonl";
}

bool built(std::initializer_list<const char*> names) {
  for (const char* name : names)
    if (!std::filesystem::exists(bin(name))) {
      TINYDDP_RECORD_SKIP(bin(name), " is not built (configure with examples and benchmarks on, and build it)");
      return false;
    }
  return true;
}

bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

constexpr int kEpochs = 4;  // dummy_mgpu on 2 workers: 1000 samples, 500 a rank, 16 steps an epoch

// tinyddp-run -n 2 dummy_mgpu for kEpochs epochs, with `fault` in TINYDDP_FAULT (none when empty).
testing::ChildOutcome run_job(const std::string& fault, int max_restarts, const std::string& checkpoint_dir,
                              const std::string& save) {
  std::vector<std::string> argv{
      bin("tinyddp-run"), "-n",       "2",   "--max-restarts", std::to_string(max_restarts), "--grace-ms", "3000",
      bin("dummy_mgpu"),  "--device", "cpu", "--epochs",       std::to_string(kEpochs),      "--save",     save};
  if (!checkpoint_dir.empty()) argv.insert(argv.end(), {"--checkpoint-dir", checkpoint_dir});
  // A token of our own would be used by the launcher; none, so that it makes one per job.
  testing::ChildOutcome outcome =
      testing::finish_child(testing::spawn_program(argv, {"TINYDDP_FAULT=" + fault, "TINYDDP_TOKEN="}), 120s);
  CHECK_MESSAGE(!outcome.timed_out, "the job did not end within 120 s:\n", outcome.report);
  return outcome;
}

// The final weights of the job run straight through, never killed: what every faulted run must match.
const std::string& straight_weights() {
  static const std::string weights = [] {
    FaultDir dir;
    auto out = run_job("", 0, "", dir.file("straight.safetensors"));
    REQUIRE_MESSAGE(out.exit_code == 0, out.report);
    return slurp(dir.file("straight.safetensors"));
  }();
  return weights;
}

}  // namespace

TEST_CASE(
    "faults: a worker SIGKILLed at each moment of a step; the group restarts, resumes and ends bitwise as if never "
    "killed") {
  if (!built({"tinyddp-run", "dummy_mgpu"})) return;
  REQUIRE(!straight_weights().empty());
  struct Case {
    const char* fault;   // TINYDDP_FAULT
    const char* said;    // what the dying worker says
    int resumed_epochs;  // the last complete checkpoint when it died
  };
  // 16 steps an epoch: step 20 is in epoch 2, steps 35 and 40 in epoch 3. Checkpoint writes: epoch 1
  // last (1st) and best (2nd), epoch 2 last (3rd) and best (4th): the 4th dies in the middle of
  // best.safetensors, after last.safetensors already holds epoch 2.
  const Case cases[] = {
      {"forward:20:1", "SIGKILL at forward (rank 1, attempt 0", 1},
      {"backward:40:0", "SIGKILL at backward (rank 0, attempt 0", 2},
      {"allreduce:35:1", "SIGKILL at allreduce (rank 1, attempt 0", 2},
      {"checkpoint_write:4:0", "SIGKILL in the middle of checkpoint_write (rank 0, attempt 0", 2},
  };
  for (const Case& c : cases) {
    INFO("TINYDDP_FAULT=", c.fault);
    FaultDir dir;
    auto out = run_job(c.fault, 1, dir.file("ck"), dir.file("final.safetensors"));
    INFO(out.report);
    REQUIRE(out.exit_code == 0);
    CHECK(has(out.report, c.said));
    CHECK(has(out.report, "was killed by SIGKILL; stopped the group; restart 1 of 1"));
    CHECK(has(out.report, "finished successfully (after 1 restart)"));
    CHECK(has(out.report, "resuming from " + dir.file("ck/last.safetensors") + ": " + std::to_string(c.resumed_epochs) +
                              " of " + std::to_string(kEpochs) + " epochs done"));
    // Every epoch's line once after the resume: the job ends with the epochs asked for, no more.
    CHECK(has(out.report, "epoch " + std::to_string(kEpochs) + "/" + std::to_string(kEpochs)));
    CHECK(nn::checkpoint_epochs_done(dir.file("ck/last.safetensors")) == kEpochs);
    CHECK(slurp(dir.file("final.safetensors")) == straight_weights());
    // best.safetensors holds the epoch that last.safetensors says was best (the checkpoint_write
    // fault left it one best behind: the resume repaired it).
    const Metadata last = load_safetensors(dir.file("ck/last.safetensors")).metadata;
    REQUIRE(last.count("extra.trainer.best_epoch"));
    CHECK(nn::checkpoint_epochs_done(dir.file("ck/best.safetensors")) ==
          std::stoll(last.at("extra.trainer.best_epoch")) + 1);
    // No temporary file of a killed writer is left: the checkpoints and the history file only.
    for (const auto& entry : std::filesystem::directory_iterator(dir.file("ck")))
      CHECK_MESSAGE(checkpoint_dir_file(entry.path()), entry.path());
  }
}

TEST_CASE("faults: a kill in the middle of a checkpoint write leaves the last complete checkpoint readable") {
  if (!built({"tinyddp-run", "dummy_mgpu"})) return;
  FaultDir dir;
  // The 3rd write is epoch 2's last.safetensors; with no restart the job ends there.
  auto killed = run_job("checkpoint_write:3", 0, dir.file("ck"), "");
  INFO(killed.report);
  CHECK(killed.exit_code == 128 + SIGKILL);
  const std::string last = dir.file("ck/last.safetensors");
  CHECK(nn::checkpoint_epochs_done(last) == 1);  // the previous one, whole and valid
  // The half-written temporary is there, cut at half the size, and is not a valid file.
  int temporaries = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.file("ck"))) {
    std::string name = entry.path().filename().string();
    if (name.rfind("last.safetensors.tmp.", 0) != 0) continue;
    ++temporaries;
    CHECK(std::filesystem::file_size(entry.path()) == std::filesystem::file_size(last) / 2);
    CHECK_THROWS_AS(load_safetensors(entry.path().string()), Error);
  }
  CHECK(temporaries == 1);

  // Started again by hand, the job resumes from epoch 1, clears the leftover and ends as if never killed.
  auto resumed = run_job("", 0, dir.file("ck"), dir.file("final.safetensors"));
  INFO(resumed.report);
  REQUIRE(resumed.exit_code == 0);
  CHECK(has(resumed.report, "1 of 4 epochs done"));
  CHECK(slurp(dir.file("final.safetensors")) == straight_weights());
  for (const auto& entry : std::filesystem::directory_iterator(dir.file("ck")))
    CHECK_MESSAGE(checkpoint_dir_file(entry.path()), entry.path());
}

TEST_CASE("faults: with no restarts left the launcher names the killed rank, not the peers that failed after it") {
  if (!built({"tinyddp-run", "dummy_mgpu"})) return;
  FaultDir dir;
  SUBCASE("--max-restarts 0") {
    auto out = run_job("allreduce:20:1", 0, dir.file("ck"), "");
    INFO(out.report);
    CHECK(out.exit_code == 128 + SIGKILL);
    CHECK(has(out.report, "tinyddp-run: worker rank 1 (local rank 1 on node 0, pid "));
    CHECK(has(out.report, ") was killed by SIGKILL (the first to fail); stopped the other 1 worker; no restarts"));
  }
  SUBCASE("killed again in the restarted group: all restarts used") {
    auto out = run_job("allreduce:20:1:0,backward:3:0:1", 1, dir.file("ck"), "");
    INFO(out.report);
    CHECK(out.exit_code == 128 + SIGKILL);
    CHECK(has(out.report, "SIGKILL at backward (rank 0, attempt 1"));
    CHECK(has(out.report, "tinyddp-run: worker rank 0 (local rank 0 on node 0, pid "));
    CHECK(has(out.report,
              ") was killed by SIGKILL (the first to fail); stopped the other 1 worker; all 1 restarts used"));
  }
}

TEST_CASE("faults: ranks that find different checkpoints (a directory that is not shared) stop with an error") {
  if (!built({"tinyddp-run", "dummy_mgpu"})) return;
  FaultDir dir;
  auto first = run_job("", 0, dir.file("ck0"), "");  // a checkpoint of 4 epochs, where only rank 0 will look
  REQUIRE_MESSAGE(first.exit_code == 0, first.report);
  // Each rank its own directory: rank 0 finds 4 epochs done, rank 1 none.
  std::string worker = bin("dummy_mgpu") + " --device cpu --epochs 6 --save '' --checkpoint-dir " + dir.file("ck") +
                       "$RANK";
  auto out = testing::finish_child(
      testing::spawn_program({bin("tinyddp-run"), "-n", "2", "/bin/sh", "-c", "exec " + worker}, {"TINYDDP_TOKEN="}),
      120s);
  INFO(out.report);
  REQUIRE(!out.timed_out);
  CHECK(out.exit_code == 1);
  CHECK(has(out.report, "ranks did not resume from the same point (this rank: "));
  CHECK(has(out.report, "hint: every rank must see the same checkpoint directory"));
  CHECK_FALSE(has(out.report, "epoch 5/6"));  // neither trained on
}

TEST_CASE("faults: a malformed TINYDDP_FAULT is refused with a message, not ignored") {
  if (!built({"tinyddp-run", "dummy_mgpu"})) return;
  FaultDir dir;
  auto unknown = run_job("sideways:1", 0, "", "");
  CHECK(unknown.exit_code == 1);
  CHECK_MESSAGE(has(unknown.report, "TINYDDP_FAULT: unknown fault point \"sideways\"; hint: the points are forward"),
                unknown.report);
  auto zero = run_job("forward:0", 0, "", "");
  CHECK(zero.exit_code == 1);
  CHECK_MESSAGE(has(zero.report, "the count in \"forward:0\" is 0"), zero.report);
}

TEST_CASE(
    "faults: test/soak/soak, a few runs with a random worker killed at a random moment: every run finishes, no "
    "checkpoint corrupt") {
  if (!built({"tinyddp-run", "dummy_mgpu", "soak"})) return;
  FaultDir dir;
  auto out = testing::finish_child(testing::spawn_program({bin("soak"), "--runs", "3", "--job", "dummy_mgpu",
                                                           "--epochs", "6", "--seed", "7", "--bin-dir", TINYDDP_BIN_DIR,
                                                           "--work-dir", dir.path.string()},
                                                          {"TINYDDP_TOKEN="}),
                                   180s);
  INFO(out.report);
  REQUIRE(!out.timed_out);
  CHECK(out.exit_code == 0);
  CHECK(has(out.report, "runs finished             3 of 3"));
  CHECK(has(out.report, "checkpoints found corrupt 0 of "));
  CHECK(has(out.report, "final weights as unkilled 3 of 3"));
}
