// The flight recorder's ring and JSON, read back; the verdict of comm/launch/flight_explain.h on
// records written by real recorders; and the watchdog's judgement of a board.
#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tinyddp/comm/collective_watchdog.h"
#include "tinyddp/comm/flight_recorder.h"
#include "tinyddp/comm/launch/flight_explain.h"
#include "tinyddp/core/error.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::comm;
using tinyddp::testing::TempDir;

namespace {

Fingerprint all_reduce_of(uint64_t sequence, int64_t count) {
  Fingerprint f = make_fingerprint(CollectiveKind::all_reduce, Tensor::empty({count}), count, ReduceOp::avg);
  f.sequence = sequence;
  return f;
}

// Runs collectives [0, finished) to the end and starts `started` (if >= finished).
void run(FlightRecorder& recorder, uint64_t finished, int64_t started = -1) {
  for (uint64_t s = 0; s < finished; ++s) {
    recorder.queued(all_reduce_of(s, 1024), int(s % 3));
    recorder.started(s);
    recorder.finished(s, true);
  }
  if (started >= 0) {
    recorder.queued(all_reduce_of(uint64_t(started), 1024), 2);
    recorder.started(uint64_t(started));
  }
}

struct EnvVar {
  std::string name;
  EnvVar(std::string n, const std::string& value) : name(std::move(n)) { setenv(name.c_str(), value.c_str(), 1); }
  ~EnvVar() { unsetenv(name.c_str()); }
};

}  // namespace

TEST_CASE("flight recorder: a fixed ring of the last N collectives, written as JSON and read back") {
  FlightRecorder recorder(1, 3, "default", 4);
  run(recorder, 6, 6);  // 0..5 finished, 6 running: the ring holds 3..6
  recorder.set_error("rank 1: all_reduce #6 timed out");
  auto j = nlohmann::json::parse(recorder.to_json("timeout"));
  CHECK(j["rank"] == 1);
  CHECK(j["world_size"] == 3);
  CHECK(j["reason"] == "timeout");
  CHECK(j["pid"] == int(getpid()));
  CHECK(j["last_queued"] == 6);
  CHECK(j["last_started"] == 6);
  CHECK(j["last_finished"] == 5);
  CHECK(j["error"] == "rank 1: all_reduce #6 timed out");
  REQUIRE(j["entries"].size() == 4);
  for (int i = 0; i < 4; ++i) {
    const auto& e = j["entries"][size_t(i)];
    CHECK(e["sequence"] == 3 + i);
    CHECK(e["op"] == "all_reduce");
    CHECK(e["dtype"] == "f32");
    CHECK(e["count"] == 1024);
    CHECK(e["bytes"] == 4096);
    CHECK(e["reduce_op"] == "avg");
    CHECK(e["state"] == (i < 3 ? "finished" : "started"));
    CHECK(e["queued_unix_ms"].is_number());
    CHECK(e["started_unix_ms"].get<int64_t>() >= e["queued_unix_ms"].get<int64_t>());
    CHECK(e["finished_unix_ms"].is_null() == (i == 3));
  }
  CHECK(j["entries"][3]["bucket"] == 2);
  CHECK(recorder.describe(6) == "all_reduce #6 (f32 x1024, 4.0 KiB, bucket 2)");
  CHECK(recorder.describe(2).empty());  // left the ring
  // A failed collective is not "finished", and the recorder no longer counts it as running.
  recorder.finished(6, false);
  auto p = recorder.position();
  CHECK_FALSE(p.running.has_value());
  REQUIRE(p.last_finished.has_value());
  CHECK(p.last_finished->state == FlightRecorder::State::failed);
  CHECK(nlohmann::json::parse(recorder.to_json("error"))["last_finished"] == 5);
}

TEST_CASE("flight recorder: a call recorded queued and started at once reads as one queued, then started") {
  // A blocking call its caller runs as it makes it is recorded in one update (queued_and_started);
  // the ring, the JSON and the position must be those of the two updates the queue's path makes.
  FlightRecorder one_update(0, 2, "default", 3), two_updates(0, 2, "default", 3);
  const auto at = FlightRecorder::Clock::now();
  for (uint64_t s = 0; s < 5; ++s) {  // past the ring's 3 entries
    one_update.queued_and_started(all_reduce_of(s, 256), -1, at);
    two_updates.queued(all_reduce_of(s, 256), -1, at);
    two_updates.started(s, at);
    if (s < 4) one_update.finished(s, true), two_updates.finished(s, true);
  }
  auto a = nlohmann::json::parse(one_update.to_json("error"));
  auto b = nlohmann::json::parse(two_updates.to_json("error"));
  REQUIRE(a["entries"].size() == 3);
  CHECK(a["last_queued"] == 4);
  CHECK(a["last_started"] == 4);
  CHECK(a["entries"][2]["state"] == "started");
  // Unix times are converted from the steady clock as each is written: equal instants may read 1 ms apart.
  CHECK(std::abs(a["entries"][2]["started_unix_ms"].get<int64_t>() -
                 a["entries"][2]["queued_unix_ms"].get<int64_t>()) <= 1);
  for (auto* j : {&a, &b})
    for (auto& e : (*j)["entries"])
      for (const char* time : {"queued_unix_ms", "started_unix_ms", "finished_unix_ms"}) e.erase(time);
  for (const char* key : {"entries", "last_queued", "last_started", "last_finished"}) CHECK(a[key] == b[key]);
  auto p = one_update.position();
  REQUIRE(p.running.has_value());
  CHECK(p.running->fingerprint.sequence == 4);
  CHECK(p.last_finished->fingerprint.sequence == 3);
}

TEST_CASE("flight recorder: dump writes DIR/rank-<r>.json only when TINYDDP_FLIGHT_RECORDER is set") {
  FlightRecorder recorder(0, 2, "default", 8);
  run(recorder, 2);
  CHECK(recorder.dump("error").empty());
  TempDir dir;
  EnvVar var("TINYDDP_FLIGHT_RECORDER", (dir.path / "records").string());  // created on demand
  std::string path = recorder.dump("error");
  CHECK(path == (dir.path / "records" / "rank-0.json").string());
  std::ifstream in(path);
  CHECK(nlohmann::json::parse(in)["last_finished"] == 1);
  FlightRecorder other_group(0, 2, "experts", 8);
  CHECK(other_group.dump("SIGUSR1") == (dir.path / "records" / "rank-0.experts.json").string());
}

TEST_CASE("flight explain: the rank that did not start the furthest collective lags; a missing record counts") {
  TempDir dir;
  EnvVar var("TINYDDP_FLIGHT_RECORDER", dir.path.string());
  FlightRecorder r0(0, 4, "default"), r1(1, 4, "default"), r2(2, 4, "default");
  run(r0, 7, 7);
  run(r1, 5);  // idle after #4: two behind
  run(r2, 7, 7);
  r0.finished(7, false);
  r0.dump("timeout");
  r1.dump("SIGUSR1");
  r2.dump("timeout");  // rank 3 wrote nothing
  FlightExplanation x = explain_flight_records(dir.path.string());
  CHECK(x.world_size == 4);
  CHECK(x.furthest == 7);
  CHECK(x.lagging == std::vector<int>{1, 3});
  CHECK(x.waiting == std::vector<int>{0, 2});
  CHECK_MESSAGE(x.verdict.find(
                    "ranks 1, 3 lag, not in all_reduce #7 (f32 x1024, 4096 bytes, bucket 2) which ranks 0, 2 "
                    "wait in") == 0,
                x.verdict);
  CHECK(x.verdict.find("rank 1 (") != std::string::npos);
  CHECK(x.verdict.find("its last collective is #4") != std::string::npos);
  CHECK(x.verdict.find("rank 3: it left no record") != std::string::npos);
  std::string table = format_explanation(x);
  CHECK(table.find("(no record)") != std::string::npos);
  CHECK(table.find("verdict: ranks 1, 3 lag") != std::string::npos);
  CHECK_THROWS_WITH_AS(explain_flight_records((dir.path / "nothing").string()), doctest::Contains("no such directory"),
                       Error);
}

TEST_CASE("flight explain: only the newest attempt's records are read; an earlier attempt's file is left out") {
  TempDir dir;
  EnvVar var("TINYDDP_FLIGHT_RECORDER", dir.path.string());
  {
    EnvVar attempt("TORCHELASTIC_RESTART_COUNT", "0");  // the failed attempt: rank 1 stalled at #3
    FlightRecorder r0(0, 2, "default"), r1(1, 2, "default");
    run(r0, 4, 4);
    run(r1, 3);
    r0.dump("timeout");
    r1.dump("SIGUSR1");
  }
  EnvVar attempt("TINYDDP_RESTART_COUNT", "1");  // the restart: only rank 0 wrote, and names the new rank 1
  FlightRecorder again(0, 2, "default");
  run(again, 2, 2);
  CHECK(nlohmann::json::parse(again.to_json("timeout"))["restart_count"] == 1);
  again.dump("timeout");
  FlightExplanation x = explain_flight_records(dir.path.string());
  CHECK(x.restart_count == 1);
  CHECK(x.earlier_records == 1);
  CHECK_FALSE(x.ranks[1].present);  // not the failed attempt's rank 1, with its #2 finished
  CHECK(x.furthest == 2);
  CHECK(x.lagging == std::vector<int>{1});
  CHECK_MESSAGE(x.verdict.find("rank 1: it left no record") != std::string::npos, x.verdict);
  CHECK(format_explanation(x).find("(1 record of earlier attempts left out: these are restart 1's)") !=
        std::string::npos);
}

TEST_CASE("watchdog: the board's verdict names who has not entered the collective, and who waits in it") {
  std::vector<BoardEntry> board(3);
  board[0] = {0, true, true, 12, 20.0, 100, "a"};   // in #12
  board[1] = {1, true, false, 11, 20.5, 101, "b"};  // idle after #11
  board[2] = {2, false, false, -1, 0, 102, "c"};    // never reported
  StallVerdict v = judge_board(board, 12, "all_reduce #12");
  CHECK(v.lagging == std::vector<int>{1, 2});
  CHECK_MESSAGE(v.text ==
                    "rank 1 (b, pid 101) has not entered all_reduce #12 (it is outside any collective since #11 "
                    "finished 20.5 s ago); rank 2 (c, pid 102) has not entered all_reduce #12 (it has not said "
                    "where it stands: a stopped or frozen process cannot); rank 0 waits in it",
                v.text);
  board[1].sequence = 12, board[1].running = true;
  board[2].reported = true, board[2].running = true, board[2].sequence = 12;
  CHECK(judge_board(board, 12, "x").text.empty());
}
