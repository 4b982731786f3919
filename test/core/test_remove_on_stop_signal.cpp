// A file being written goes with its writer on SIGINT/SIGTERM/SIGHUP (core/remove_on_stop_signal.h),
// the process still ends by the signal, and a program's own handler is left alone.
#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "tinyddp/core/remove_on_stop_signal.h"
#include "tinyddp/core/safetensors.h"
#include "tinyddp/core/tensor.h"
#include "test/comm/helpers/child_process.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::testing;

namespace {
// The test runner catches signals to report crashes; a forked child puts them back to what a
// program starts with.
void default_stop_signals() {
  for (int s : {SIGINT, SIGTERM, SIGHUP}) signal(s, SIG_DFL);
}

std::atomic<int> g_caught{0};
void count_signal(int) { g_caught.fetch_add(1); }

int files_named_like(const std::filesystem::path& dir, const std::string& part) {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    n += entry.path().filename().string().find(part) != std::string::npos;
  return n;
}
}  // namespace

TEST_CASE("RemoveOnStopSignal: a stop signal unlinks the files registered then, and still ends the process by it") {
  TINYDDP_SKIP_UNDER_TSAN();
  TempDir dir;
  const std::string writing = dir.file("writing.tmp"), finished = dir.file("finished.tmp");
  ChildOutcome out = finish_child(spawn_child([&](std::string&) {
                                    default_stop_signals();
                                    {
                                      RemoveOnStopSignal done_with(finished);  // its guard is gone before the signal
                                      std::ofstream(finished) << "kept";
                                    }
                                    RemoveOnStopSignal guard(writing);
                                    std::ofstream(writing) << "half";
                                    raise(SIGTERM);
                                    return 0;  // not reached: the signal ends the process
                                  }),
                                  std::chrono::seconds(30));
  CHECK(out.signal == SIGTERM);
  CHECK_FALSE(std::filesystem::exists(writing));
  CHECK(std::filesystem::exists(finished));
}

TEST_CASE("RemoveOnStopSignal: a program's own handler is left in place, and the file with it") {
  TINYDDP_SKIP_UNDER_TSAN();
  TempDir dir;
  const std::string writing = dir.file("writing.tmp");
  ChildOutcome out = finish_child(spawn_child([&](std::string& report) {
                                    default_stop_signals();
                                    signal(SIGINT, count_signal);
                                    RemoveOnStopSignal guard(writing);
                                    std::ofstream(writing) << "half";
                                    raise(SIGINT);
                                    report = std::to_string(g_caught.load());
                                    return 0;
                                  }),
                                  std::chrono::seconds(30));
  CHECK(out.exit_code == 0);
  CHECK(out.report == "1");
  CHECK(std::filesystem::exists(writing));
}

TEST_CASE("save_safetensors stopped by SIGTERM in the middle of its writes leaves no temporary file") {
  TINYDDP_SKIP_UNDER_TSAN();
  TempDir dir;
  const std::string path = dir.file("big.safetensors");
  for (int attempt = 0; attempt < 3; ++attempt) {
    CAPTURE(attempt);
    Child writer = spawn_child([&](std::string&) {
      default_stop_signals();
      Tensor big = Tensor::zeros({16, 1024, 1024});  // 64 MiB: most of the child's time is spent writing
      for (;;) save_safetensors(path, {{"big", big}});
      return 0;
    });
    ChildGuard guard{writer};
    // Stopped once the first file is there, so the next save is under way.
    REQUIRE(eventually([&] { return std::filesystem::exists(path); }, std::chrono::seconds(60)));
    std::this_thread::sleep_for(std::chrono::milliseconds(20 * attempt));
    REQUIRE(kill(writer.pid, SIGTERM) == 0);
    ChildOutcome out = finish_child(writer, std::chrono::seconds(30));
    CHECK(out.signal == SIGTERM);
    CHECK(files_named_like(dir.path, ".tmp.") == 0);
    CHECK(load_safetensors(path).tensors.size() == 1);  // and the last complete file is intact
  }
}
