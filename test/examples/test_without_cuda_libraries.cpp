// A CUDA-enabled build's program on a machine without the CUDA libraries: bin/dummy runs with every
// folder the CUDA half loads its libraries from hidden -- an empty folder bound over each, in a
// private mount namespace -- and trains on the CPU; asked for a GPU there, it says why it cannot have
// one. Needs root (for the namespace); skipped with a message otherwise.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tinyddp/core/cuda_plugin.h"
#include "tinyddp/core/cuda_runtime.h"
#include "test/comm/helpers/child_process.h"
#include "test/test_skip.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace std::chrono_literals;

namespace {

// The folders of the NVIDIA libraries the CUDA half's modules load, as the dynamic loader resolves them.
std::set<std::string> cuda_library_folders() {
  std::set<std::string> folders;
  for (const char* module : {kCudaHalfLibrary, kNcclHalfLibrary}) {
    std::string path = find_cuda_half(module);
    if (path.empty()) continue;
    FILE* ldd = ::popen(("ldd '" + path + "'").c_str(), "r");
    if (!ldd) continue;
    char line[1024];
    while (std::fgets(line, sizeof line, ldd)) {
      std::istringstream in(line);
      std::string name, arrow, resolved;
      in >> name >> arrow >> resolved;
      bool nvidia = name.find("cudart") != std::string::npos || name.find("cublas") != std::string::npos ||
                    name.find("nccl") != std::string::npos;
      if (nvidia && arrow == "=>" && !resolved.empty() && resolved[0] == '/')
        folders.insert(std::filesystem::canonical(resolved).parent_path().string());
    }
    ::pclose(ldd);
  }
  return folders;
}

testing::ChildOutcome run(const std::vector<std::string>& argv) {
  testing::ChildOutcome outcome = testing::finish_child(testing::spawn_program(argv), 120s);
  INFO(outcome.report);
  CHECK_MESSAGE(!outcome.timed_out, argv[0], " did not finish within 120 s");
  return outcome;
}

}  // namespace

TEST_CASE("a CUDA-enabled build's program runs on the CPU where the CUDA libraries are absent") {
  const std::string dummy = std::string(TINYDDP_BIN_DIR) + "/dummy";
  if (!cuda_built()) {
    TINYDDP_SKIP("this build has no CUDA half, so there is nothing to hide");
  }
  if (!std::filesystem::exists(dummy)) {
    TINYDDP_SKIP(dummy, " is not built");
  }
  if (::geteuid() != 0 || !run({"/usr/bin/unshare", "--mount", "/bin/true"}).ok()) {
    TINYDDP_SKIP("hiding the CUDA libraries needs a mount namespace (root, and unshare --mount)");
  }
  const std::set<std::string> folders = cuda_library_folders();
  REQUIRE_MESSAGE(!folders.empty(), "ldd names no libcudart/libcublas/libnccl for the CUDA half");
  testing::TempDir empty;
  std::string script = "mount --make-rprivate / && ";
  std::string listed;
  for (const std::string& folder : folders) {
    script += "mount --bind '" + empty.path.string() + "' '" + folder + "' && ";
    listed += " '" + folder + "'";
  }
  auto hidden = [&](std::vector<std::string> command) {
    std::vector<std::string> argv{"/usr/bin/unshare", "--mount", "/bin/sh", "-c", script + "exec \"$@\"", "sh"};
    argv.insert(argv.end(), command.begin(), command.end());
    return run(argv);
  };
  INFO("hidden:" << listed);

  // The hiding works: inside, the folders are empty.
  testing::ChildOutcome listing = hidden({"/bin/sh", "-c", "find" + listed + " -mindepth 1 -maxdepth 1 | wc -l"});
  CHECK(listing.ok());
  CHECK(listing.report.find("0") == 0);

  testing::ChildOutcome trained = hidden({dummy, "--epochs", "2", "--save", ""});
  CHECK(trained.ok());
  CHECK(trained.report.find("final: loss") != std::string::npos);

  testing::ChildOutcome refused = hidden({dummy, "--epochs", "1", "--save", "", "--device", "cuda:0"});
  CHECK(refused.exit_code == 1);
  const bool says_why = refused.report.find("no NVIDIA driver found") != std::string::npos ||
                        refused.report.find("could not load tinyddp's CUDA half") != std::string::npos;
  CHECK_MESSAGE(says_why, refused.report);
}
