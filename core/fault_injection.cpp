#include "tinyddp/core/fault_injection.h"

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tinyddp/core/env.h"
#include "tinyddp/core/error.h"

namespace tinyddp::fault {

namespace {

constexpr const char* kVariable = "TINYDDP_FAULT";
const char* const kPoints[] = {"forward", "backward", "allreduce", "checkpoint_write"};

struct Fault {
  std::string point;
  int64_t count = 0;
};

// The faults aimed at this process, and how often each point has been passed so far.
struct Plan {
  std::vector<Fault> faults;
  std::map<std::string, int64_t, std::less<>> passes;
  std::mutex mutex;  // points may be passed from more than one thread
  int rank = 0, attempt = 0;
};

int64_t parse_number(std::string_view text, std::string_view what, std::string_view entry) {
  int64_t value = -1;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  TINYDDP_CHECK(error == std::errc() && end == text.data() + text.size() && value >= 0, kVariable, ": the ", what,
                " in \"", entry, "\" is not a number", hint("write point:count[:rank[:attempt]], e.g. backward:3:1"));
  return value;
}

// The first of these variables that is set (0 when none is).
int env_number_of(std::initializer_list<const char*> names) {
  for (const char* name : names)
    if (std::optional<uint64_t> value = env::unsigned_integer(name, 0, 1 << 24)) return int(*value);
  return 0;
}

Plan* load_plan() {
  const std::optional<std::string> variable = env::text(kVariable);
  if (!variable) return nullptr;
  const char* text = variable->c_str();
  auto plan = std::make_unique<Plan>();
  // The rank and the attempt as whichever launcher started the process says them.
  plan->rank = env_number_of({"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK"});
  plan->attempt = env::restart_count();
  std::string_view all(text);
  while (!all.empty()) {
    std::string_view entry = all.substr(0, all.find(','));
    all.remove_prefix(std::min(all.size(), entry.size() + 1));
    std::vector<std::string_view> fields;
    for (std::string_view rest = entry;;) {
      size_t colon = rest.find(':');
      fields.push_back(rest.substr(0, colon));
      if (colon == std::string_view::npos) break;
      rest.remove_prefix(colon + 1);
    }
    TINYDDP_CHECK(fields.size() >= 2 && fields.size() <= 4, kVariable, ": \"", entry, "\" is not point:count",
                  "[:rank[:attempt]]", hint("e.g. TINYDDP_FAULT=backward:3 or TINYDDP_FAULT=allreduce:5:1"));
    bool known = false;
    for (const char* p : kPoints) known |= fields[0] == p;
    TINYDDP_CHECK(known, kVariable, ": unknown fault point \"", fields[0], "\"",
                  hint("the points are forward, backward, allreduce and checkpoint_write"));
    Fault fault{std::string(fields[0]), parse_number(fields[1], "count", entry)};
    TINYDDP_CHECK(fault.count >= 1, kVariable, ": the count in \"", entry, "\" is 0",
                  hint("passes are counted from 1"));
    int64_t rank = fields.size() > 2 ? parse_number(fields[2], "rank", entry) : 0;
    int64_t attempt = fields.size() > 3 ? parse_number(fields[3], "attempt", entry) : 0;
    if (rank == plan->rank && attempt == plan->attempt) plan->faults.push_back(std::move(fault));
  }
  if (plan->faults.empty()) return nullptr;
  return plan.release();  // lives as long as the process: a point may be passed until the very end
}

Plan* plan() {
  static Plan* const loaded = load_plan();
  return loaded;
}

void say(std::string_view point, const char* how) {
  Plan* p = plan();
  std::string line = "tinyddp fault injection: SIGKILL " + std::string(how) + " " + std::string(point) + " (rank " +
                     std::to_string(p ? p->rank : 0) + ", attempt " + std::to_string(p ? p->attempt : 0) + ", " +
                     kVariable + "=" + std::getenv(kVariable) + ")\n";
  ssize_t ignored = ::write(2, line.data(), line.size());
  (void)ignored;
}

void on_file_size_limit(int) { ::kill(::getpid(), SIGKILL); }

}  // namespace

bool armed() { return plan() != nullptr; }

bool due(std::string_view point) {
  Plan* p = plan();
  if (!p) return false;
  std::lock_guard lock(p->mutex);
  auto it = p->passes.find(point);
  if (it == p->passes.end()) it = p->passes.emplace(std::string(point), 0).first;
  int64_t pass = ++it->second;
  for (const Fault& f : p->faults)
    if (f.point == point && f.count == pass) return true;
  return false;
}

void kill_self(std::string_view point) {
  say(point, "at");
  ::kill(::getpid(), SIGKILL);
  std::abort();  // not reached: SIGKILL cannot be caught
}

void kill_when_file_exceeds(uint64_t bytes, std::string_view point) {
  say(point, "in the middle of");
  struct sigaction action {};
  action.sa_handler = on_file_size_limit;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGXFSZ, &action, nullptr);
  rlimit limit{};
  ::getrlimit(RLIMIT_FSIZE, &limit);
  limit.rlim_cur = rlim_t(bytes);
  TINYDDP_CHECK(::setrlimit(RLIMIT_FSIZE, &limit) == 0, "fault injection: setrlimit(RLIMIT_FSIZE, ", bytes,
                ") failed: ", std::strerror(errno), hint("the hard limit is lower; raise it (ulimit -Hf)"));
}

}  // namespace tinyddp::fault
