// docs/how-ddp-works.md stays true: every command block marked
//
//   <!-- doc-test expect="some text" -->
//   ```sh
//   ...
//   ```
//
// is run as the page tells a reader to run it (bash, from a directory laid out like the repository
// root: build/bin, scripts, data), within a time limit, and must exit 0 and print the expected text.
// A listing marked
//
//   <!-- doc-test output order="any" -->
//   ```
//   ...
//   ```
//
// after such a block is that command's whole output, and is compared with it whole, line for line,
// after masking what changes from run to run (ports, pids, host names and identities, random tags,
// client numbers); order="any" compares the lines as a multiset, for output that several processes
// interleave. Any other drift (a key renamed, a request added or gone) fails.
// Blocks are skipped, with a message, when a program they name is not built or the digits data set
// is absent. Also checked: every relative link of the page leads to a file that exists, and no
// command writes into the directory it runs from (a reader's checkout).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "test/test_skip.h"
#include "test/test_support.h"

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

// The repository root, as the build configured it (__FILE__ can be relative, e.g. under ccache's base_dir).
fs::path repository_root() { return fs::path(TINYDDP_SOURCE_DIR); }

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

struct DocCommand {
  int line = 0;                        // of the marker, for messages
  std::string expect;                  // text the output must contain
  std::string script;                  // the block's lines
  std::optional<std::string> listing;  // the whole output, as the page shows it
  bool any_order = false;              // the listing's lines in any order
};

// The lines of a ``` block that starts after the current line of `in`; false when it is never closed.
bool read_block(std::istream& in, int& number, std::string& text) {
  std::string line;
  while (std::getline(in, line)) {
    ++number;
    if (line == "```") return true;
    text += line + "\n";
  }
  return false;
}

// The marked blocks of a markdown page, in order.
std::vector<DocCommand> marked_commands(const std::string& markdown) {
  static const std::regex marker(R"re(^<!-- doc-test expect="([^"]*)" -->$)re");
  static const std::regex listing(R"re(^<!-- doc-test output( order="any")? -->$)re");
  std::vector<DocCommand> commands;
  std::istringstream in(markdown);
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    std::smatch m;
    if (std::regex_match(line, m, listing)) {
      const int at = number;
      REQUIRE_MESSAGE(!commands.empty(), "line ", at, ": an output listing before any marked command");
      std::string fence;
      std::getline(in, fence);
      ++number;
      REQUIRE_MESSAGE(fence == "```", "line ", number, ": a doc-test output marker must be followed by a ``` block");
      std::string text;
      REQUIRE_MESSAGE(read_block(in, number, text), "the listing after line ", at, " is never closed");
      commands.back().listing = text;
      commands.back().any_order = m[1].matched;
      continue;
    }
    if (!std::regex_match(line, m, marker)) continue;
    DocCommand command;
    command.line = number;
    command.expect = m[1].str();
    std::string fence;
    std::getline(in, fence);
    ++number;
    REQUIRE_MESSAGE(fence == "```sh", "line ", number, ": a doc-test marker must be followed by a ```sh block");
    REQUIRE_MESSAGE(read_block(in, number, command.script), "the block after line ", command.line, " is never closed");
    commands.push_back(command);
  }
  return commands;
}

struct ScriptOutcome {
  int exit_code = -1;
  bool timed_out = false;
  std::string output;
};

// Runs `script` with bash -e in `directory`, in a process group of its own so that whatever it
// leaves running in the background is killed with it; stdout and stderr together.
ScriptOutcome run_script(const std::string& script, const fs::path& directory, std::chrono::seconds limit) {
  ScriptOutcome outcome;
  int fds[2];
  REQUIRE(pipe2(fds, O_CLOEXEC) == 0);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    setpgid(0, 0);
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    if (chdir(directory.c_str()) != 0) _exit(126);
    // The page's commands set what they need; the test's own environment must not leak in.
    for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                             "TINYDDP_LAUNCHER_STORE", "TINYDDP_TRACE", "TINYDDP_DEBUG"})
      unsetenv(name);
    execl("/bin/bash", "bash", "-e", "-c", script.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  setpgid(pid, pid);  // also here, so the group exists before any kill below
  const auto deadline = std::chrono::steady_clock::now() + limit;
  bool exited = false;
  int status = 0;
  char buffer[4096];
  for (;;) {
    pollfd p{fds[0], POLLIN, 0};
    if (poll(&p, 1, 100) > 0) {
      ssize_t n = read(fds[0], buffer, sizeof buffer);
      if (n > 0) {
        outcome.output.append(buffer, size_t(n));
        continue;
      }
      if (exited || n == 0) break;  // EOF: everyone holding the pipe is gone
    }
    if (!exited && waitpid(pid, &status, WNOHANG) == pid) {
      exited = true;
      kill(-pid, SIGKILL);  // background leftovers of the script still hold the pipe
    }
    if (std::chrono::steady_clock::now() > deadline) {
      outcome.timed_out = !exited;
      kill(-pid, SIGKILL);
      if (!exited) waitpid(pid, &status, 0);
      exited = true;
      break;
    }
  }
  close(fds[0]);
  if (!exited) waitpid(pid, &status, 0);
  outcome.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return outcome;
}

// A scratch directory removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "tinyddp_docs_XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    path = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

// What changes from one run of a command to the next, replaced by a placeholder: ports, pids, host
// names and identities, random tags, shared-memory names, and (for interleaved output) which client
// number each process got.
std::string mask_volatile(std::string text, bool any_order) {
  static const std::vector<std::pair<std::regex, std::string>> masks = {
      {std::regex(R"re(:\d{2,5}\b)re"), ":<port>"},
      {std::regex(R"re("[^" ]+ pid \d+ #[0-9a-f]+")re"), "\"<host> pid <pid> #<tag>\""},
      {std::regex(R"re("\d+ [^"]*")re"), "\"<pid> <host identity>\""},
      {std::regex(R"re(/tinyddp-[^" ]+)re"), "/tinyddp-<segment>"},
      {std::regex(R"re(\([^ ()"]+ pid \d+\))re"), "(<host> pid <pid>)"},
      {std::regex(R"re(\bpid \d+)re"), "pid <pid>"},
      {std::regex(R"re((cross-memory/probe/\d+ = )"\d+")re"), "$1\"<address>\""},
  };
  for (const auto& [pattern, placeholder] : masks) text = std::regex_replace(text, pattern, placeholder);
  if (any_order) text = std::regex_replace(text, std::regex(R"re(\bclient \d+)re"), "client <n>");
  return text;
}

std::vector<std::string> listing_lines(const std::string& text, bool any_order) {
  std::vector<std::string> lines;
  std::istringstream in(mask_volatile(text, any_order));
  for (std::string line; std::getline(in, line);) {
    while (!line.empty() && (line.back() == ' ' || line.back() == '\r')) line.pop_back();
    lines.push_back(line);
  }
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  if (any_order) std::sort(lines.begin(), lines.end());
  return lines;
}

// The lines of `a` that `b` lacks, as a multiset difference (both sorted), for the failure message.
std::string lines_missing(std::vector<std::string> a, std::vector<std::string> b) {
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  std::vector<std::string> only;
  std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(only));
  std::string text;
  for (const std::string& line : only) text += "  " + line + "\n";
  return text.empty() ? "  (none)\n" : text;
}

// Every file under `directory`, for the check that a command writes nowhere else.
std::set<std::string> files_under(const fs::path& directory) {
  std::set<std::string> files;
  for (auto it = fs::recursive_directory_iterator(directory); it != fs::recursive_directory_iterator(); ++it) {
    if (it->is_symlink()) {
      it.disable_recursion_pending();  // build/bin, scripts, data: the reader's tree, not written here
      continue;
    }
    files.insert(fs::relative(it->path(), directory).string());
  }
  return files;
}

bool python3_available() {
  return run_script("command -v python3 > /dev/null", fs::temp_directory_path(), 10s).exit_code == 0;
}

}  // namespace

TEST_CASE("docs/how-ddp-works.md: every marked command runs and prints what the page says") {
  const fs::path root = repository_root();
  const std::string page = read_text(root / "docs/how-ddp-works.md");
  REQUIRE_MESSAGE(!page.empty(), "cannot read ", (root / "docs/how-ddp-works.md").string());
  const std::vector<DocCommand> commands = marked_commands(page);
  // The page marks its commands (store, ring, all-reduce table, buckets, trace, two failures):
  // losing the markers must not pass for success.
  CHECK(commands.size() >= 8);
  // and section 1's store listing is compared whole.
  CHECK(std::count_if(commands.begin(), commands.end(), [](const DocCommand& c) { return c.listing.has_value(); }) >=
        1);

  // A directory laid out like the repository root, as the page's commands expect.
  TempDir dir;
  fs::create_directories(dir.path / "build");
  fs::create_directory_symlink(TINYDDP_BIN_DIR, dir.path / "build/bin");
  fs::create_directory_symlink(root / "scripts", dir.path / "scripts");
  const std::string digits = tinyddp::testing::digits_data();  // ../shared/data, or data/ (make data)
  const bool have_data = !digits.empty();
  if (have_data) fs::create_directory_symlink(fs::path(digits).parent_path(), dir.path / "data");
  const bool have_python = python3_available();

  static const std::regex program(R"re(build/bin/([A-Za-z0-9_.-]+))re");
  for (const DocCommand& command : commands) {
    INFO("the block after line ", command.line, " of docs/how-ddp-works.md:\n", command.script);
    std::string missing;
    for (auto it = std::sregex_iterator(command.script.begin(), command.script.end(), program);
         it != std::sregex_iterator(); ++it)
      if (!fs::exists(fs::path(TINYDDP_BIN_DIR) / (*it)[1].str())) missing = (*it)[1].str();
    if (!missing.empty()) {
      TINYDDP_SKIP_PART("the block after line ", command.line, ": ", missing, " is not built");
      continue;
    }
    if (command.script.find("data/") != std::string::npos && !have_data) {
      TINYDDP_SKIP_PART("the block after line ", command.line, ": digits.csv.gz is absent (make data extracts it)");
      continue;
    }
    if (command.script.find("python3 ") != std::string::npos && !have_python) {
      TINYDDP_SKIP_PART("the block after line ", command.line, ": no python3 on PATH");
      continue;
    }
    const std::set<std::string> before = files_under(dir.path);
    ScriptOutcome outcome = run_script(command.script, dir.path, 60s);
    INFO("output:\n", outcome.output);
    CHECK_MESSAGE(!outcome.timed_out, "did not finish within 60 s");
    CHECK(outcome.exit_code == 0);
    CHECK_MESSAGE(outcome.output.find(command.expect) != std::string::npos, "expected \"", command.expect,
                  "\" in the output");
    // A reader runs these in a checkout: what a command writes goes to a scratch directory.
    std::string written;
    for (const std::string& file : files_under(dir.path))
      if (!before.count(file)) written += " " + file;
    CHECK_MESSAGE(written.empty(), "the command wrote into the directory it ran from:", written);
    if (command.listing) {
      const auto shown = listing_lines(*command.listing, command.any_order);
      const auto printed = listing_lines(outcome.output, command.any_order);
      CHECK_MESSAGE(shown == printed, "the page's listing differs from the output (masked, ",
                    command.any_order ? "in any order" : "line for line", ").\nOnly on the page:\n",
                    lines_missing(shown, printed), "Only in the output:\n", lines_missing(printed, shown));
    }
  }
}

TEST_CASE("docs/how-ddp-works.md: every relative link leads to a file that exists") {
  const fs::path root = repository_root();
  const fs::path page = root / "docs/how-ddp-works.md";
  const std::string text = read_text(page);
  REQUIRE(!text.empty());
  // [label](target) and ![alt](target); absolute URLs and #anchors are not files.
  static const std::regex link(R"re(\]\(([^)#\s]+)(#[^)]*)?\))re");
  int checked = 0;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), link); it != std::sregex_iterator(); ++it) {
    const std::string target = (*it)[1].str();
    if (target.find("://") != std::string::npos) continue;
    ++checked;
    CHECK_MESSAGE(fs::exists(page.parent_path() / target), "docs/how-ddp-works.md links to ", target,
                  ", which does not exist");
  }
  CHECK(checked >= 20);  // the page links each section to its code
}
