// One job at a time in a checkpoint directory (nn/train/addons/checkpoint_dir_lock.h): the holder is
// named, the file goes when the holder lets go or is stopped, and a leftover is taken over.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tinyddp/core/error.h"
#include "tinyddp/nn/train/addons/checkpoint_dir_lock.h"
#include "test/comm/helpers/child_process.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::testing;

namespace {
std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string host_name() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return host;
}
}  // namespace

TEST_CASE("CheckpointDirLock: the holder is named to a second taker; the file goes when it lets go") {
  TempDir dir;
  const std::string lock_file = dir.file("lock");
  {
    nn::CheckpointDirLock held(dir.path.string());
    const std::string holder = "pid " + std::to_string(getpid()) + " on host " + host_name() + " since ";
    CHECK(first_line(lock_file).starts_with(holder));
    // flock belongs to the open file, so a second open in this very process is refused like another job.
    CHECK_THROWS_WITH_AS(nn::CheckpointDirLock(dir.path.string()),
                         doctest::Contains(("is in use by another job (" + holder).c_str()), Error);
    nn::remove_stale_lock(dir.path.string());  // a held lock is not stale
    CHECK(std::filesystem::exists(lock_file));
  }
  CHECK_FALSE(std::filesystem::exists(lock_file));
  nn::CheckpointDirLock again(dir.path.string());  // free again
}

TEST_CASE("CheckpointDirLock: a file left by a killed holder is taken over, or removed as stale") {
  TempDir dir;
  const std::string lock_file = dir.file("lock");
  std::ofstream(lock_file) << "pid 1 on host gone since long ago\n";  // what SIGKILL leaves: a file nobody locks
  {
    nn::CheckpointDirLock taken(dir.path.string());
    CHECK(first_line(lock_file).starts_with("pid " + std::to_string(getpid())));
  }
  std::ofstream(lock_file) << "pid 1 on host gone since long ago\n";
  nn::remove_stale_lock(dir.path.string());
  CHECK_FALSE(std::filesystem::exists(lock_file));
}

TEST_CASE("CheckpointDirLock: a holder stopped by SIGTERM takes its lock file with it") {
  TINYDDP_SKIP_UNDER_TSAN();
  TempDir dir;
  ChildOutcome out = finish_child(spawn_child([&](std::string&) {
                                    signal(SIGTERM, SIG_DFL);  // as a program starts (the test runner catches it)
                                    nn::CheckpointDirLock held(dir.path.string());
                                    raise(SIGTERM);
                                    return 0;
                                  }),
                                  std::chrono::seconds(30));
  CHECK(out.signal == SIGTERM);
  CHECK_FALSE(std::filesystem::exists(dir.file("lock")));
}
