// Our client of PyTorch's TCPStore, against PyTorch's own server (test/comm/helpers/torch_store_server.py):
// every Store call, the dialect it finds, and values that cross between the two implementations in
// both directions. Runs with each Python that has torch: /usr/bin/python3 (Debian's python3-torch,
// PyTorch 1.13: the legacy dialect) and any listed in TINYDDP_TEST_TORCH_PYTHONS (colon-separated,
// e.g. a venv with PyTorch 2.x: the current dialect, over both of its server backends).
#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <future>
#include <sstream>
#include <thread>

#include "tinyddp/comm/store/torch_tcp_store.h"
#include "tinyddp/core/error.h"
#include "test/comm/helpers/child_process.h"
#include "test/test_skip.h"

using namespace tinyddp;
using namespace tinyddp::comm;
using namespace std::chrono_literals;
using namespace tinyddp::testing;

namespace {

const std::string kServerScript = std::string(TINYDDP_SOURCE_DIR) + "/test/comm/helpers/torch_store_server.py";

// The Pythons to test with, each with its torch version ("" when it has no torch).
std::vector<std::pair<std::string, std::string>> pythons_with_torch() {
  std::vector<std::string> candidates{"/usr/bin/python3"};
  if (const char* more = std::getenv("TINYDDP_TEST_TORCH_PYTHONS")) {
    std::istringstream list(more);
    for (std::string p; std::getline(list, p, ':');)
      if (!p.empty()) candidates.push_back(p);
  }
  std::vector<std::pair<std::string, std::string>> found;
  for (const auto& python : candidates) {
    if (access(python.c_str(), X_OK) != 0) continue;
    auto probe = finish_child(spawn_program({python, "-c",
                                             "import torch.distributed as d; import torch; "
                                             "print('torch', torch.__version__, d.is_available())"}),
                              120s);
    if (probe.ok() && probe.report.find(" True") != std::string::npos) {
      std::string version = probe.report.substr(probe.report.find("torch ") + 6);
      found.emplace_back(python, version.substr(0, version.find(' ')));
    }
  }
  return found;
}

// Every Store call against one running server.
void exercise(TorchTcpStore& store) {
  CHECK(store.get("/from-python").rfind("hello from torch ", 0) == 0);

  CHECK(store.add("/counter", 5) == 5);
  CHECK(store.add("/counter", -2) == 3);
  store.set("/counter-done", "1");

  // compare_set with our Store's meaning, over PyTorch's (which answers `expected` for a missing key).
  CHECK(store.compare_set("/cas", "", "a") == "a");
  CHECK(store.compare_set("/cas", "x", "b") == "a");
  CHECK(store.compare_set("/cas", "a", "b") == "b");
  CHECK(store.compare_set("/cas-missing", "x", "y") == "");
  CHECK(store.compare_set("/cas-missing", "z", "z") == "");
  CHECK(store.compare_set("/cas", "b", "b") == "b");

  CHECK(store.check({"/cas", "/counter"}));
  CHECK_FALSE(store.check({"/cas", "/never"}));
  auto start = Clock::now();
  CHECK_THROWS_WITH_AS(store.wait({"/never", "/cas"}, 300ms), doctest::Contains("still missing: '/never'"), Error);
  CHECK(Clock::now() - start < 5s);
  CHECK(store.get("/cas") == "b");  // usable again after the timeout

  store.append("/log", "a,");
  store.append("/log", "b,");
  CHECK(store.get("/log") == "a,b,");

  int64_t keys = store.num_keys();
  store.multi_set({"/m1", "/m2"}, {"one", std::string("t\0o", 3)});
  CHECK(store.num_keys() == keys + 2);
  CHECK(store.multi_get({"/m2", "/m1"}) == std::vector<std::string>{std::string("t\0o", 3), "one"});
  CHECK(store.delete_key("/m1"));
  CHECK_FALSE(store.delete_key("/m1"));
  CHECK(store.num_keys() == keys + 1);

  // A value set here, read by PyTorch, and its answer read back.
  store.set("/from-cpp", "hello from tinyddp");
  store.set_timeout(30s);
  CHECK(store.get("/verdict") == "hello from tinyddp|3");
  store.set("/bye", "1");
}

void run_against(const std::string& python, const std::string& backend, TorchStoreDialect expected) {
  Child server = spawn_program({python, kServerScript, backend});
  ChildGuard guard{server};
  std::string banner = read_until(server.out_fd, "port ", 60s);
  REQUIRE_MESSAGE(!banner.empty(), "PyTorch's TCPStore server did not start (", python, ")");
  int port = std::stoi(banner.substr(banner.rfind("port ") + 5));
  TorchTcpStoreOptions options;
  options.timeout = 20s;
  TorchTcpStore store("127.0.0.1", port, options);
  CHECK(store.dialect() == expected);
  // A key that compare_set creates ends another client's wait (PyTorch's own wait would not end).
  TorchTcpStore other("127.0.0.1", port, options);
  auto waited = std::async(std::launch::async, [&] { return other.get("/claimed"); });
  std::this_thread::sleep_for(100ms);
  CHECK(store.compare_set("/claimed", "", "by rank 3") == "by rank 3");
  REQUIRE(waited.wait_for(10s) == std::future_status::ready);
  CHECK(waited.get() == "by rank 3");
  exercise(store);
  auto ended = finish_child(server, 30s);
  CHECK_MESSAGE(ended.ok(), ended.describe());
}

}  // namespace

TEST_CASE("TorchTcpStore: every call against PyTorch's own TCPStore server, in each dialect") {
  auto pythons = pythons_with_torch();
  if (pythons.empty()) {
    TINYDDP_SKIP(
        "no Python with torch.distributed (Debian: apt-get install python3-torch, which make deps "
        "installs as root)");
  }
  for (const auto& [python, version] : pythons) {
    INFO("PyTorch ", version, " (", python, ")");
    MESSAGE("TorchTcpStore against PyTorch ", version, " (", python, ")");
    if (version.rfind("1.", 0) == 0) {
      run_against(python, "", TorchStoreDialect::legacy);
    } else {
      run_against(python, "libuv", TorchStoreDialect::current);
      run_against(python, "classic", TorchStoreDialect::current);
    }
  }
}

TEST_CASE("TorchTcpStore: nothing listening fails after the timeout, naming the address") {
  int port = free_loopback_port();
  TorchTcpStoreOptions options;
  options.timeout = 500ms;
  auto start = Clock::now();
  std::string expected = "cannot reach the PyTorch TCPStore 127.0.0.1:" + std::to_string(port);
  CHECK_THROWS_WITH_AS(TorchTcpStore("127.0.0.1", port, options), doctest::Contains(expected.c_str()), Error);
  CHECK(Clock::now() - start < 5s);
}
