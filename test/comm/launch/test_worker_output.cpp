// What tinyddp-run prints of its workers' output: --prefix, --print-ranks and --log-dir, through the
// parsing functions and through the real bin/tinyddp-run.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tinyddp/comm/launch/worker_output.h"
#include "tinyddp/core/error.h"
#include "test/comm/helpers/child_process.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::comm;
using namespace tinyddp::testing;
using namespace std::chrono_literals;

namespace {

const std::string kRun = std::string(TINYDDP_BIN_DIR) + "/tinyddp-run";

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  }
  return "(no error)";
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

TEST_CASE("parse_rank_list: all, single ranks and ranges; each mistake named") {
  CHECK(!parse_rank_list("all", 4).has_value());
  CHECK(*parse_rank_list("0", 4) == std::set<int>{0});
  CHECK(*parse_rank_list("3,0-1", 4) == std::set<int>{0, 1, 3});
  CHECK(*parse_rank_list("4-7,5", 8) == std::set<int>{4, 5, 6, 7});
  CHECK(message_of([] { parse_rank_list("4", 4); }) ==
        "--print-ranks 4: rank 4 is not in this job, whose ranks are 0 to 3; hint: count the ranks over every node "
        "(--nnodes x --nproc-per-node)");
  CHECK(message_of([] { parse_rank_list("3-1", 4); }) ==
        "--print-ranks 3-1: the range 3-1 runs backwards; hint: write the lower rank first (1-3)");
  for (const char* bad : {"", "x", "1,", "-1", "0,,1", "1-", "0x1", "rank0"})
    CHECK_MESSAGE(message_of([&] { parse_rank_list(bad, 4); }).find("is not a rank; hint: give ranks and ranges") !=
                      std::string::npos,
                  bad);
}

TEST_CASE("expand_prefix: {rank}, {local_rank} and {node} filled in; another field is refused") {
  CHECK(expand_prefix("[rank {rank}] ", 5, 1, 2) == "[rank 5] ");
  CHECK(expand_prefix("{node}/{local_rank}:{rank}| ", 5, 1, 2) == "2/1:5| ");
  CHECK(expand_prefix("", 5, 1, 2) == "");
  CHECK(expand_prefix("plain ", 5, 1, 2) == "plain ");
  CHECK(message_of([] { expand_prefix("{host} ", 0, 0, 0); }) ==
        "--prefix '{host} ': {host} is not a field it can fill in; hint: use {rank}, {local_rank} or {node}, or '' "
        "for no prefix");
  CHECK(message_of([] { expand_prefix("{rank", 0, 0, 0); }).find("{rank is not a field") != std::string::npos);
}

TEST_CASE(
    "tinyddp-run --print-ranks 0 --prefix '': rank 0's standard output alone, as written; every rank's errors; "
    "--log-dir keeps all of it") {
  TempDir dir("tinyddp_worker_output");
  const std::string logs = dir.file("logs");
  const std::string worker = "echo \"table line of $RANK\"; echo \"error of $RANK\" >&2";
  // Standard output alone: what a parser of nccl-tests' output reads.
  auto out = finish_child(spawn_program({"/bin/sh", "-c",
                                         "\"$0\" -n 3 --print-ranks 0 --prefix '' --log-dir \"$1\" -- /bin/sh -c '" +
                                             worker + "' 2>/dev/null",
                                         kRun, logs}),
                          60s);
  REQUIRE_MESSAGE(out.ok(), out.describe());
  CHECK(out.report == "table line of 0\n");
  for (int r = 0; r < 3; ++r) {
    const std::string base = logs + "/rank" + std::to_string(r);
    CHECK(slurp(base + ".stdout") == "table line of " + std::to_string(r) + "\n");
    CHECK(slurp(base + ".stderr") == "error of " + std::to_string(r) + "\n");
  }
  // Both streams: each rank's error still shows, with the prefix asked for.
  auto both = finish_child(spawn_program({kRun, "-n", "3", "--print-ranks", "1-2", "--prefix", "{rank}> ", "--",
                                          "/bin/sh", "-c", worker}),
                           60s);
  REQUIRE_MESSAGE(both.ok(), both.describe());
  CHECK(both.report.find("table line of 0") == std::string::npos);
  for (int r = 0; r < 3; ++r)
    CHECK(both.report.find(std::to_string(r) + "> error of " + std::to_string(r) + "\n") != std::string::npos);
  for (int r = 1; r < 3; ++r)
    CHECK(both.report.find(std::to_string(r) + "> table line of " + std::to_string(r) + "\n") != std::string::npos);
  // A list naming a rank the job does not have is a usage error before anything starts.
  auto bad = finish_child(spawn_program({kRun, "-n", "2", "--print-ranks", "2", "--", "/bin/true"}), 30s);
  CHECK(bad.exit_code == 2);
  CHECK(bad.report.find("tinyddp-run: --print-ranks 2: rank 2 is not in this job, whose ranks are 0 to 1") !=
        std::string::npos);
}
