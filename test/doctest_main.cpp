// The doctest runner shared by every suite, with the run-time skips of test_skip.h: a listener notes
// which test case runs, TINYDDP_SKIP records it with the reason, and after doctest's own summary the
// runner names every skip (a skipped test case counts as passed in doctest's numbers).
//
// TINYDDP_SKIP_LOG=<file>: each skip is also appended there as one line of four tab-separated fields,
//   <suite binary> TAB skipped|partly TAB <test case name> TAB <reason>
// ("partly": the test case skipped some checks and ran the rest). Tabs and newlines inside a field
// become spaces, so every skip is exactly one line.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "test/test_skip.h"

namespace tinyddp::testing {
namespace {

struct Skip {
  std::string test_case;
  std::string reason;
  bool whole;
};

std::mutex skips_mutex;
std::vector<Skip> skips;
std::string running_test_case = "(outside any test case)";

// Keeps running_test_case up to date; reports nothing itself.
struct TestCaseNamer : doctest::IReporter {
  explicit TestCaseNamer(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData& data) override {
    std::lock_guard<std::mutex> lock(skips_mutex);
    running_test_case = data.m_name;
  }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

std::string one_line(std::string text) {
  for (char& c : text)
    if (c == '\t' || c == '\n' || c == '\r') c = ' ';
  return text;
}

std::string suite_name(const char* argv0) {
  std::string path = argv0 ? argv0 : "test";
  return path.substr(path.find_last_of('/') + 1);
}

// The closing list on stdout, and the lines for TINYDDP_SKIP_LOG.
void report_skips(const std::string& suite) {
  std::lock_guard<std::mutex> lock(skips_mutex);
  if (skips.empty()) return;
  size_t whole = 0;
  for (const Skip& s : skips) whole += s.whole;
  std::printf("%s: %zu test case(s) skipped at run time, %zu skipped some checks (all counted as passed above):\n",
              suite.c_str(), whole, skips.size() - whole);
  for (const Skip& s : skips)
    std::printf("  %s \"%s\": %s\n", s.whole ? "skipped" : "partly ", s.test_case.c_str(), s.reason.c_str());
  std::fflush(stdout);
  const char* log = std::getenv("TINYDDP_SKIP_LOG");
  if (!log || !*log) return;
  int fd = ::open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::fprintf(stderr, "%s: cannot append the skips to TINYDDP_SKIP_LOG=%s\n", suite.c_str(), log);
    return;
  }
  for (const Skip& s : skips) {
    // One write per line: suites that ctest runs side by side append whole lines.
    std::string line = one_line(suite) + '\t' + (s.whole ? "skipped" : "partly") + '\t' + one_line(s.test_case) + '\t' +
                       one_line(s.reason) + '\n';
    if (::write(fd, line.data(), line.size()) != ssize_t(line.size()))
      std::fprintf(stderr, "%s: could not append a skip to TINYDDP_SKIP_LOG=%s\n", suite.c_str(), log);
  }
  ::close(fd);
}

}  // namespace

void record_skip(const std::string& reason, bool whole) {
  std::lock_guard<std::mutex> lock(skips_mutex);
  skips.push_back({running_test_case, reason, whole});
}

}  // namespace tinyddp::testing

DOCTEST_REGISTER_LISTENER("tinyddp_test_case_namer", 1, tinyddp::testing::TestCaseNamer);

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int result = context.run();
  if (!context.shouldExit()) tinyddp::testing::report_skips(tinyddp::testing::suite_name(argc > 0 ? argv[0] : nullptr));
  return result;
}
