// Where libnccl.so.2 is looked for (comm/nccl/nccl_library_search.h), over folder trees made here:
// the order of the places, a pip wheel under a virtual environment, the places named when nothing
// is found, and TINYDDP_NCCL_LIBRARY pointing at nothing or at a file that is not a library.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "tinyddp/comm/nccl/nccl_library_search.h"
#include "test/test_support.h"

using namespace tinyddp::comm;
using namespace tinyddp::testing;
namespace fs = std::filesystem;

namespace {

// An empty file at `path` (its folders made): the search only looks at files.
std::string touch(const fs::path& path) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << "not a library";
  return path.string();
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("NCCL search: a pip wheel's nvidia/nccl/lib under a virtual environment, after the folders") {
  TempDir dir;
  const fs::path root = dir.path;
  fs::create_directories(root / "ld");
  fs::create_directories(root / "cuda/lib64");
  const std::string wheel = touch(root / "venv/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2");
  NcclSearchPlaces places;
  places.folders = {(root / "ld").string(), (root / "cuda/lib64").string()};
  places.python_prefixes = {(root / "home/.local").string(), (root / "venv").string()};

  NcclLibrarySearch found = find_nccl_library(places);
  CHECK(found.path == wheel);
  CHECK(found.problem.empty());
  CHECK(contains(found.searched, (root / "ld").string() + ", " + (root / "cuda/lib64").string()));
  CHECK(contains(found.searched, (root / "home/.local").string() + "/lib/python3*/site-packages/nvidia/nccl/lib (no "
                                                                   "python3 there)"));

  // A toolkit's copy comes before the wheel; Debian's dist-packages is searched as site-packages is.
  const std::string toolkit = touch(root / "cuda/lib64/libnccl.so.2");
  CHECK(find_nccl_library(places).path == toolkit);
  fs::remove(toolkit);
  fs::remove_all(root / "venv");
  const std::string debian = touch(root / "venv/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2");
  CHECK(find_nccl_library(places).path == debian);
}

TEST_CASE("NCCL search: nothing found names every place looked in") {
  TempDir dir;
  NcclSearchPlaces places;
  places.folders = {dir.file("a"), dir.file("b")};
  places.python_prefixes = {dir.file("venv")};
  fs::create_directories(dir.path / "venv/lib/python3.10");
  NcclLibrarySearch found = find_nccl_library(places);
  CHECK(found.path.empty());
  CHECK(found.problem.empty());
  CHECK(found.searched ==
        dir.file("a") + ", " + dir.file("b") + ", " + dir.file("venv") + "/lib/python3*/site-packages/nvidia/nccl/lib");
}

TEST_CASE("NCCL search: TINYDDP_NCCL_LIBRARY is taken alone, and a wrong one is said") {
  TempDir dir;
  NcclSearchPlaces places;
  places.folders = {dir.path.string()};
  touch(dir.path / "libnccl.so.2");  // would be found, but the override decides

  places.override_path = dir.file("nowhere/libnccl.so.2");
  NcclLibrarySearch missing = find_nccl_library(places);
  CHECK(missing.path.empty());
  CHECK(contains(missing.problem, "TINYDDP_NCCL_LIBRARY=" + dir.file("nowhere/libnccl.so.2") + " names no file"));

  const std::string text = touch(dir.path / "notes.txt");
  places.override_path = text;
  NcclLibrarySearch named = find_nccl_library(places);
  REQUIRE(named.path == text);
  const std::string problem = preload_nccl_library(named.path, /*from_override=*/true);
  CHECK(contains(problem, "TINYDDP_NCCL_LIBRARY=" + text + " is not a loadable NCCL library: "));
  CHECK(contains(problem, "point TINYDDP_NCCL_LIBRARY at libnccl.so.2 itself"));
  CHECK(contains(preload_nccl_library(text, false), "set TINYDDP_NCCL_LIBRARY to the libnccl.so.2 to use"));
}

TEST_CASE("NCCL search: the places come from the environment, empty PATH entries dropped") {
  TempDir dir;
  touch(dir.path / "py/bin/python3");
  fs::permissions(dir.path / "py/bin/python3", fs::perms::owner_exec, fs::perm_options::add);
  ScopedEnv override_unset("TINYDDP_NCCL_LIBRARY", nullptr);
  ScopedEnv library_path("LD_LIBRARY_PATH", (dir.file("x") + "::" + dir.file("y")).c_str());
  ScopedEnv venv("VIRTUAL_ENV", dir.file("venv").c_str());
  ScopedEnv conda("CONDA_PREFIX", nullptr);
  ScopedEnv cuda_home("CUDA_HOME", dir.file("cuda").c_str());
  ScopedEnv path("PATH", (":" + dir.file("empty") + ":" + dir.file("py/bin")).c_str());
  NcclSearchPlaces places = NcclSearchPlaces::from_environment();
  CHECK_FALSE(places.override_path.has_value());
  REQUIRE(places.folders.size() >= 4);
  CHECK(places.folders[0] == dir.file("x"));
  CHECK(places.folders[1] == dir.file("y"));
  CHECK(places.folders[2] == dir.file("cuda") + "/lib64");
  CHECK(places.folders[3] == dir.file("cuda") + "/lib");
  for (const std::string& folder : places.folders) CHECK_FALSE(folder.empty());
  REQUIRE(places.python_prefixes.size() >= 2);
  CHECK(places.python_prefixes[0] == dir.file("venv"));
  CHECK(places.python_prefixes[1] == dir.file("py"));
}
