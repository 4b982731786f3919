// The test fakes (test/support/: fake CUDA devices, fake NCCL) are in no library a user links, and so
// in no program built against them: nm finds none of their symbols in the libraries or in a program
// linked as a user links one (test_user_program), and finds them in this test binary, which links them.
// test/library/consumers.cmake checks the installed tree the same way.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "test/examples/command_output.h"

namespace {

// `nm -C` of a file: its symbols, demangled.
std::string symbols_of(const std::string& path) {
  return tinyddp::testing::command_output("nm -C '" + path + "'").output;
}

const char* const kFakeSymbols[] = {"tinyddp::FakeCuda", "tinyddp::comm::FakeNccl", "tinyddp::active_fake_cuda",
                                    "tinyddp::comm::fake_nccl"};

std::string fake_symbol_in(const std::string& symbols) {
  for (const char* fake : kFakeSymbols)
    if (symbols.find(fake) != std::string::npos) return fake;
  return "";
}

}  // namespace

TEST_CASE("test fakes: none in the libraries or in a program linked as a user links one; all in the tests") {
  const std::filesystem::path bin = TINYDDP_BIN_DIR;
  std::vector<std::filesystem::path> libraries;
  for (const auto& entry : std::filesystem::directory_iterator(bin.parent_path())) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("libtinyddp_", 0) == 0 && (name.ends_with(".a") || name.find(".so") != std::string::npos) &&
        entry.is_regular_file())
      libraries.push_back(entry.path());
  }
  REQUIRE_MESSAGE(libraries.size() >= 4, "libtinyddp_core, _kernels, _comm and _nn beside ", bin.string());
  for (const auto& library : libraries) {
    const std::string symbols = symbols_of(library);
    INFO(library.string());
    CHECK(symbols.find("tinyddp::") != std::string::npos);  // nm read it
    CHECK(fake_symbol_in(symbols) == "");
  }

  const std::string user_program = symbols_of((bin / "test_user_program").string());
  CHECK(user_program.find("tinyddp::cuda_device_count") != std::string::npos);
  CHECK(fake_symbol_in(user_program) == "");

  const std::string this_test = symbols_of(std::filesystem::read_symlink("/proc/self/exe").string());
  for (const std::string fake : kFakeSymbols) CHECK_MESSAGE(this_test.find(fake) != std::string::npos, fake);
}
