#include "tinyddp/comm/launch/launcher_address.h"

#include <charconv>
#include <cstdio>

#include "tinyddp/core/error.h"

namespace tinyddp::comm {

namespace {

// Ports derived from a job id fall in [kFirstDerivedPort, kFirstDerivedPort + kDerivedPorts): above
// the well-known and registered services most clusters run, below Linux's ephemeral range (32768+),
// from which outgoing connections take their ports.
constexpr int kFirstDerivedPort = 15000;
constexpr int kDerivedPorts = 17000;

std::optional<long long> parse_number(const std::string& text) {
  long long value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

// Splits at the commas outside brackets: "a[1,2],b" -> "a[1,2]" "b".
std::vector<std::string> split_top_level(const std::string& text, const std::string& whole) {
  std::vector<std::string> parts;
  int depth = 0;
  std::string current;
  for (char c : text) {
    if (c == '[') depth++;
    if (c == ']') depth--;
    TINYDDP_CHECK(depth >= 0 && depth <= 1, "hostlist '", whole, "': unbalanced or nested brackets",
                  hint("Slurm writes lists as prefix[1-3,7]suffix"));
    if (c == ',' && depth == 0) {
      parts.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  TINYDDP_CHECK(depth == 0, "hostlist '", whole, "': a '[' is never closed",
                hint("Slurm writes lists as prefix[1-3,7]"));
  parts.push_back(current);
  return parts;
}

// "01-03,7" -> 01 02 03 7 (each number keeps the width its lower bound was written with).
std::vector<std::string> expand_ranges(const std::string& ranges, const std::string& whole) {
  std::vector<std::string> values;
  for (const std::string& range : split_top_level(ranges, whole)) {
    auto dash = range.find('-');
    std::string low = range.substr(0, dash), high = dash == std::string::npos ? low : range.substr(dash + 1);
    auto from = parse_number(low), to = parse_number(high);
    TINYDDP_CHECK(from && to && *from >= 0 && *from <= *to && *to - *from < 1000000, "hostlist '", whole, "': '", range,
                  "' is not a range of numbers", hint("write it as low-high with low <= high, e.g. 01-16"));
    for (long long v = *from; v <= *to; ++v) {
      char digits[32];
      std::snprintf(digits, sizeof digits, "%0*lld", int(low.size()), v);
      values.push_back(digits);
    }
  }
  return values;
}

std::vector<std::string> expand_item(const std::string& item, const std::string& whole) {
  auto open = item.find('[');
  if (open == std::string::npos) return {item};
  auto close = item.find(']', open);
  std::vector<std::string> hosts;
  std::vector<std::string> tails = expand_item(item.substr(close + 1), whole);
  for (const std::string& middle : expand_ranges(item.substr(open + 1, close - open - 1), whole))
    for (const std::string& tail : tails) hosts.push_back(item.substr(0, open) + middle + tail);
  return hosts;
}

std::optional<std::string> first_of(const EnvironmentLookup& lookup, std::initializer_list<const char*> names,
                                    std::string* which = nullptr) {
  for (const char* name : names)
    if (auto value = lookup(name); value && !value->empty()) {
      if (which) *which = name;
      return value;
    }
  return std::nullopt;
}

int derived_port(long long id) {
  return kFirstDerivedPort + int(((id % kDerivedPorts) + kDerivedPorts) % kDerivedPorts);
}

std::optional<DerivedStoreAddress> from_slurm(const EnvironmentLookup& lookup, std::string& why) {
  std::string list_name;
  auto nodes = first_of(lookup, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}, &list_name);
  auto job = first_of(lookup, {"SLURM_JOB_ID", "SLURM_JOBID"});
  if (!nodes || !job || !parse_number(*job)) {
    why = "Slurm set no SLURM_STEP_NODELIST/SLURM_JOB_NODELIST or no numeric SLURM_JOB_ID";
    return std::nullopt;
  }
  // Steps started by srun are numbered 0, 1, ...; the batch script's own "step" has none.
  long long step = parse_number(first_of(lookup, {"SLURM_STEP_ID", "SLURM_STEPID"}).value_or("0")).value_or(0);
  DerivedStoreAddress address;
  address.host = expand_hostlist(*nodes).at(0);
  address.port = derived_port(*parse_number(*job) * 16 + step);
  address.how = "the first host of " + list_name + " (" + *nodes + ") and a port from SLURM_JOB_ID " + *job +
                " and step " + std::to_string(step);
  return address;
}

// Open MPI 5 runs its jobs under PRRTE, which names every job "prterun-<mpirun's host>-<its pid>@<job>"
// and gives each process that name in PMIX_NAMESPACE: the host, and a number no other mpirun on that
// host shares at the same time (its pid, with the job).
std::optional<DerivedStoreAddress> from_prrte_namespace(const std::string& name, std::string& why) {
  const std::string prefix = "prterun-";
  const size_t at = name.rfind('@');
  const size_t dash = at == std::string::npos ? std::string::npos : name.rfind('-', at);
  const auto pid = dash == std::string::npos ? std::nullopt : parse_number(name.substr(dash + 1, at - dash - 1));
  const auto job = at == std::string::npos ? std::nullopt : parse_number(name.substr(at + 1));
  if (name.rfind(prefix, 0) != 0 || !pid || !job || dash <= prefix.size()) {
    why = "PMIX_NAMESPACE ('" + name +
          "') is not PRRTE's prterun-<host>-<pid>@<job>, and Open MPI set no "
          "OMPI_MCA_orte_hnp_uri";
    return std::nullopt;
  }
  DerivedStoreAddress address;
  address.host = name.substr(prefix.size(), dash - prefix.size());
  address.port = derived_port(*pid * 16 + *job);
  address.how = "mpirun's host and a port from its pid and job, both from PMIX_NAMESPACE " + name + " (Open MPI 5)";
  return address;
}

std::optional<DerivedStoreAddress> from_open_mpi(const EnvironmentLookup& lookup, std::string& why) {
  auto uri = lookup("OMPI_MCA_orte_hnp_uri");
  if (!uri) {
    if (auto name = lookup("PMIX_NAMESPACE"); name && !name->empty()) return from_prrte_namespace(*name, why);
  }
  std::vector<std::string> addresses = uri ? hnp_uri_addresses(*uri) : std::vector<std::string>{};
  // The application's job id (the URI leads with mpirun's own, one less).
  auto job = parse_number(lookup("OMPI_MCA_ess_base_jobid").value_or(""));
  if (!job && uri) job = parse_number(uri->substr(0, uri->find_first_of(".;")));
  if (addresses.empty() || !job) {
    why = uri ? "OMPI_MCA_orte_hnp_uri ('" + *uri + "') names no IPv4 address and job id"
              : "Open MPI set neither OMPI_MCA_orte_hnp_uri (Open MPI 4) nor PMIX_NAMESPACE (Open MPI 5)";
    return std::nullopt;
  }
  DerivedStoreAddress address;
  address.host = addresses.front();
  address.port = derived_port(*job);
  address.how = "mpirun's host from OMPI_MCA_orte_hnp_uri and a port from its job id " + std::to_string(*job);
  return address;
}

}  // namespace

std::vector<std::string> expand_hostlist(const std::string& hostlist) {
  std::vector<std::string> hosts;
  for (const std::string& item : split_top_level(hostlist, hostlist)) {
    if (item.empty()) continue;
    for (std::string& host : expand_item(item, hostlist)) hosts.push_back(std::move(host));
  }
  TINYDDP_CHECK(!hosts.empty(), "hostlist '", hostlist, "' names no host", hint("check SLURM_JOB_NODELIST"));
  return hosts;
}

std::vector<int> expand_tasks_per_node(const std::string& text) {
  std::vector<int> tasks;
  for (const std::string& item : split_top_level(text, text)) {
    auto open = item.find("(x");
    auto count = parse_number(item.substr(0, open));
    auto repeat = open == std::string::npos ? std::optional<long long>(1)
                                            : parse_number(item.substr(open + 2, item.size() - open - 3));
    TINYDDP_CHECK(count && repeat && *count >= 0 && *repeat >= 1 && *repeat <= 1000000 &&
                      (open == std::string::npos || item.back() == ')'),
                  "SLURM_TASKS_PER_NODE='", text, "': '", item, "' is neither N nor N(xM)",
                  hint("Slurm writes e.g. 2(x3),1"));
    tasks.insert(tasks.end(), size_t(*repeat), int(*count));
  }
  return tasks;
}

std::vector<std::string> hnp_uri_addresses(const std::string& uri) {
  std::vector<std::string> addresses;
  const std::string scheme = "tcp://";
  for (size_t at = uri.find(scheme); at != std::string::npos; at = uri.find(scheme, at + 1)) {
    size_t start = at + scheme.size();
    size_t end = uri.find(';', start);
    std::string list = uri.substr(start, end == std::string::npos ? std::string::npos : end - start);
    list = list.substr(0, list.rfind(':'));  // the port
    for (const std::string& address : split_top_level(list, uri))
      if (!address.empty()) addresses.push_back(address);
  }
  return addresses;
}

std::optional<DerivedStoreAddress> derive_store_address(const std::string& family, const EnvironmentLookup& lookup,
                                                        std::string& why) {
  if (family == "slurm") return from_slurm(lookup, why);
  if (family == "ompi") return from_open_mpi(lookup, why);
  why = "this launcher says nothing about where rank 0 runs";
  return std::nullopt;
}

}  // namespace tinyddp::comm
