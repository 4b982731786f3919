// The layering of the library folders (scripts/check_layering.sh): the tree keeps it, and a tree
// that breaks it, in each way it can be broken, is refused with the offending line named.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "test/examples/command_output.h"

namespace {

tinyddp::testing::CommandOutput check_layering(const std::string& root) {
  return tinyddp::testing::command_output(std::string(TINYDDP_SOURCE_DIR) + "/scripts/check_layering.sh '" + root +
                                          "'");
}

void write(const std::filesystem::path& file, const std::string& text) {
  std::filesystem::create_directories(file.parent_path());
  std::ofstream(file) << text;
}

}  // namespace

TEST_CASE("layering: core, kernels, comm and nn include only what the dependency rules allow") {
  tinyddp::testing::CommandOutput tree = check_layering(TINYDDP_SOURCE_DIR);
  INFO(tree.output);
  CHECK(tree.exit_code == 0);

  const std::filesystem::path root = std::filesystem::temp_directory_path() /
                                     ("tinyddp-layering-" + std::to_string(::getpid()));
  std::filesystem::remove_all(root);
  write(root / "core/a.h", "#include \"tinyddp/core/tensor.h\"\n#include \"tinyddp/comm/process_group.h\"\n");
  write(root / "kernels/b.cpp", "#include \"tinyddp/kernels/ops.h\"\n#include \"tinyddp/nn/module.h\"\n");
  write(root / "comm/c.cpp", "#include \"tinyddp/comm/work.h\"\n  #  include \"tinyddp/kernels/ops.h\"\n");
  write(root / "nn/d.cpp",
        "#include \"tinyddp/comm/process_group.h\"\n#include \"tinyddp/comm/chunks.h\"\n"
        "#include \"tinyddp/comm/nccl/nccl_api.h\"\n#include \"tinyddp/comm/algorithms/engine.h\"\n");
  tinyddp::testing::CommandOutput broken = check_layering(root.string());
  std::filesystem::remove_all(root);
  INFO(broken.output);
  CHECK(broken.exit_code == 1);
  CHECK(broken.output.find("core/a.h:2: includes tinyddp/comm/process_group.h") != std::string::npos);
  CHECK(broken.output.find("kernels/b.cpp:2: includes tinyddp/nn/module.h") != std::string::npos);
  CHECK(broken.output.find("comm/c.cpp:2: includes tinyddp/kernels/ops.h") != std::string::npos);
  CHECK(broken.output.find("nn/d.cpp:3: includes tinyddp/comm/nccl/nccl_api.h") != std::string::npos);
  CHECK(broken.output.find("nn/d.cpp:4: includes tinyddp/comm/algorithms/engine.h") != std::string::npos);
  // Allowed includes are not named.
  CHECK(broken.output.find("core/a.h:1") == std::string::npos);
  CHECK(broken.output.find("nn/d.cpp:1") == std::string::npos);
  CHECK(broken.output.find("nn/d.cpp:2") == std::string::npos);
}
