// The collective benchmark programs themselves, as a user runs them: under tinyddp-run at world
// sizes 1 to 4, every result exact (#wrong 0), nccl-tests' table; bad flags refused with their
// message and exit status 2, by rank 0 alone; --help with the defaults.
#include <doctest/doctest.h>

#include <cctype>
#include <sstream>

#include "test/bench/perf_programs.h"
#include "test/test_skip.h"
#include "bench/perf/perf_collective.h"

using namespace tinyddp;
using namespace tinyddp::bench;
using namespace tinyddp::testing;

namespace {

const char* kPrograms[] = {"all_reduce_perf", "all_gather_perf", "reduce_scatter_perf", "broadcast_perf"};

const PerfCollective& collective_of(const std::string& program) {
  if (program == "all_gather_perf") return all_gather_collective();
  if (program == "reduce_scatter_perf") return reduce_scatter_collective();
  if (program == "broadcast_perf") return broadcast_collective();
  return all_reduce_collective();
}

bool programs_built() {
  for (const char* p : kPrograms)
    if (!built(p)) return false;
  return built("tinyddp-run");
}

}  // namespace

TEST_CASE("every collective benchmark runs at world sizes 1 to 4 with every result exact") {
  if (!programs_built()) {
    TINYDDP_SKIP(
        "build the benchmarks first (cmake --build BUILD --target all_reduce_perf all_gather_perf "
        "reduce_scatter_perf broadcast_perf tinyddp-run)");
  }
  // A different type, op, transport and root at each world size, so the four runs cover them all.
  const char* types[] = {"float", "int64", "double", "int32"};
  const char* elem_bytes[] = {"4", "8", "8", "4"};
  const char* ops[] = {"sum", "max", "prod", "avg"};
  const char* transports[] = {"auto", "shm", "tcp", "shm"};
  for (const char* program : kPrograms) {
    const PerfCollective& c = collective_of(program);
    for (int world = 1; world <= 4; ++world) {
      const int k = world - 1;
      const std::string name = program;
      CAPTURE(name);
      CAPTURE(world);
      auto run = run_perf(program, world,
                          {"-b", "8", "-e", "32K", "-f", "8", "-n", "2", "-w", "1", "-d", types[k], "-o", ops[k], "-r",
                           std::to_string(world - 1), "--transport", transports[k]});
      REQUIRE_MESSAGE(run.ok(), run.describe());
      const std::string& out = run.report;
      CHECK(out.find("# Collective test starting: " + std::string(program)) != std::string::npos);
      CHECK(out.find("# Out of bounds values : 0 OK") != std::string::npos);
      CHECK(out.find("# Avg bus bandwidth    : ") != std::string::npos);
      CHECK(out.find(world == 1 ? "transport none" : k == 2 ? "transport tcp" : "transport shm") != std::string::npos);
      auto rows = table_rows(out);
      REQUIRE(rows.size() == 5);  // 8, 64, 512, 4K, 32K bytes
      size_t bytes = 8;
      for (const auto& row : rows) {
        REQUIRE(row.size() == 13);
        const size_t elem = size_t(std::stoi(elem_bytes[k]));
        CollectiveCounts counts = c.counts(bytes / elem, elem, world);
        CHECK(row[0] == std::to_string(std::max(counts.send, counts.recv) * elem));
        CHECK(row[1] == std::to_string(counts.param));
        CHECK(row[2] == types[k]);
        CHECK(row[3] == (c.reduces() ? ops[k] : "none"));
        CHECK(row[4] == (c.has_root() ? std::to_string(world - 1) : "-1"));
        CHECK(row[8] == (c.has_out_of_place() ? "0" : "N/A"));  // #wrong out of place
        CHECK(row[12] == "0");                                  // #wrong in place
        bytes *= 8;
      }
    }
  }
}

TEST_CASE("all_reduce_perf with a forced algorithm (--algo direct): int32 max, exact") {
  if (!programs_built()) {
    TINYDDP_SKIP("build all_reduce_perf and tinyddp-run first");
  }
  auto run = run_perf("all_reduce_perf", 2,
                      {"-b", "1K", "-e", "1M", "-f", "32", "-n", "3", "-w", "1", "-d", "int32", "-o", "max", "--algo",
                       "direct"});
  REQUIRE_MESSAGE(run.ok(), run.describe());
  CHECK(run.report.find("# Collective test starting: all_reduce_perf") != std::string::npos);
  CHECK(run.report.find("        1024           256     int32     max      -1") != std::string::npos);
  CHECK(run.report.find("       32768          8192     int32     max      -1") != std::string::npos);
  CHECK(run.report.find("# Out of bounds values : 0 OK") != std::string::npos);
}

TEST_CASE("the programs refuse bad flags by name, once, with exit status 2") {
  if (!programs_built()) {
    TINYDDP_SKIP("build the benchmarks first");
  }
  struct Case {
    const char* program;
    int world;
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"all_reduce_perf", 2, {"-b", "abc"}, "all_reduce_perf: -b: 'abc' is not a size (examples: 8, 64K, 1M)"},
      {"all_gather_perf", 1, {"-c", "2"}, "-c must be 0 or 1, got 2"},
      {"reduce_scatter_perf", 1, {"-z", "2"}, "-z must be 0 or 1, got 2"},
      {"broadcast_perf", 2, {"-b", "8", "-e", "8", "-r", "5"}, "broadcast_perf: -r 5: the world has 2 rank(s), 0 to 1"},
      {"all_reduce_perf", 2, {"-b", "8", "-e", "4096G", "-f", "2"}, "lower -e to"},
      {"all_reduce_perf",
       1,
       {"-b", "8", "-e", "8", "-J", "/nonexistent-dir/x.json"},
       "-J /nonexistent-dir/x.json: cannot create"},
      {"all_reduce_perf",
       1,
       {"-b", "8", "-e", "8", "--csv", "/nonexistent-dir/x.csv"},
       "--csv /nonexistent-dir/x.csv: cannot write"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.message);
    auto run = run_perf(c.program, c.world, c.args);
    CHECK(run.exit_code == 2);
    const auto at = run.report.find(c.message);
    CHECK_MESSAGE(at != std::string::npos, run.report);
    CHECK_MESSAGE(run.report.find(c.message, at + 1) == std::string::npos, "said more than once: ", run.report);
    CHECK(run.report.find("Collective test starting") == std::string::npos);  // refused before anything ran
  }
}

TEST_CASE("--help shows every flag with its default") {
  if (!built("broadcast_perf")) {
    TINYDDP_SKIP("build broadcast_perf first");
  }
  auto run = run_perf("broadcast_perf", 1, {"--help"});
  CHECK(run.exit_code == 0);
  for (const char* shown :
       {"-b,--minbytes SIZE=32M", "-e,--maxbytes SIZE=32M", "-n,--iters N=20", "-w,--warmup_iters N=1",
        "-c,--check 0|1=1", "-z,--blocking 0|1=0", "-d,--datatype TYPE=float", "-r,--root RANK=0",
        "--backend NAME=host", "--transport NAME=auto", "--algo NAME=auto", "busbw = algbw x 1"})
    CHECK_MESSAGE(run.report.find(shown) != std::string::npos, shown, " is not in:\n", run.report);
}

TEST_CASE("under tinyddp-run --print-ranks 0 --prefix '', standard output is nccl-tests' own: rank 0's table alone") {
  if (!programs_built()) {
    TINYDDP_SKIP("build the benchmarks first");
  }
  // Standard output alone, as a parser of nccl-tests' output reads it (2>/dev/null).
  auto plain = finish_child(spawn_program(
                                {"/bin/sh", "-c",
                                 "\"$0\" --print-ranks 0 --prefix '' -n 3 \"$1\" -b 1K -e 4K -f 4 -n 2 2>/dev/null",
                                 bin_path("tinyddp-run"), bin_path("all_reduce_perf")}),
                            std::chrono::seconds(120));
  REQUIRE_MESSAGE(plain.ok(), plain.describe());
  CHECK(plain.report.rfind("# tinyddp collective test, nccl-tests ", 0) == 0);
  std::istringstream lines(plain.report);
  int rows = 0;
  for (std::string line; std::getline(lines, line);) {
    // nccl-tests' output has two kinds of lines: comments and rows that start with the size.
    const bool row = line.find_first_not_of(' ') != std::string::npos &&
                     std::isdigit(line[line.find_first_not_of(' ')]);
    CHECK_MESSAGE((line.empty() || line[0] == '#' || row), "not a line nccl-tests writes: '", line, "'");
    rows += row;
  }
  CHECK(rows == 2);  // 1K, 4K
  CHECK(plain.report.find("# Avg bus bandwidth") != std::string::npos);
  // With the default prefix, still only rank 0 prints.
  auto raw = finish_child(spawn_program({bin_path("tinyddp-run"), "-n", "3", bin_path("all_reduce_perf"), "-b", "1K",
                                         "-e", "1K", "-n", "2"}),
                          std::chrono::seconds(120));
  REQUIRE_MESSAGE(raw.ok(), raw.describe());
  CHECK_MESSAGE(raw.report.find("[rank 1]") == std::string::npos, raw.report);
  CHECK_MESSAGE(raw.report.find("[rank 2]") == std::string::npos, raw.report);
}
