#include "tinyddp/comm/algorithms/cost_model.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>

#include "tinyddp/core/env.h"
#include "tinyddp/core/error.h"

namespace tinyddp::comm {

namespace {

constexpr std::pair<AllReduceAlgorithm, const char*> kNames[] = {
    {AllReduceAlgorithm::automatic, "auto"},
    {AllReduceAlgorithm::ring, "ring"},
    {AllReduceAlgorithm::direct, "direct"},
    {AllReduceAlgorithm::recursive_doubling, "rd"},
    {AllReduceAlgorithm::rabenseifner, "rabenseifner"},
    {AllReduceAlgorithm::hierarchical, "hier"},
};

// Accumulates the traffic of a schedule. Groups that run the same algorithm at once (the
// hierarchical algorithm's L cross-host all-reduces) add their messages to one step.
class Schedule {
 public:
  explicit Schedule(const HostLayout& layout) : layout_(layout), messages_(size_t(layout.world()), 0) {
    traffic.host_egress_bytes.assign(size_t(layout.hosts()), 0.0);
    traffic.in_host_bytes.assign(size_t(layout.world()), 0.0);
  }
  void send(int src, int dst, double bytes) {
    if (bytes <= 0) return;
    most_messages_ = std::max(most_messages_, ++messages_[size_t(src)]);
    const int from = layout_.host_of[size_t(src)];
    if (from != layout_.host_of[size_t(dst)]) {
      traffic.host_egress_bytes[size_t(from)] += bytes;
      crossed_ = true;
    } else {
      traffic.in_host_bytes[size_t(src)] += bytes;
    }
  }
  // Ends `count` steps that each carried what was sent since the last end_steps (each send() of a
  // rank then stands for one message in each of those steps).
  void end_steps(int count = 1) {
    (crossed_ ? traffic.network_steps : traffic.in_host_steps) += count;
    (crossed_ ? traffic.network_messages : traffic.in_host_messages) += count * most_messages_;
    crossed_ = false;
    std::fill(messages_.begin(), messages_.end(), 0);
    most_messages_ = 0;
  }
  Traffic traffic;

 private:
  const HostLayout& layout_;
  bool crossed_ = false;
  std::vector<int> messages_;  // by rank: its messages since the last end_steps
  int most_messages_ = 0;
};

using Groups = std::vector<std::vector<int>>;  // world ranks by group index, one list per group

// Reduce-scatter half (or all-gather half) of a ring: L-1 steps, (L-1)/L of the bytes each.
void ring_half(Schedule& s, const Groups& groups, double bytes) {
  const int n = int(groups[0].size());
  if (n < 2) return;
  for (const auto& g : groups)
    for (int i = 0; i < n; ++i) s.send(g[size_t(i)], g[size_t((i + 1) % n)], bytes * (n - 1) / n);
  s.end_steps(n - 1);
}

// One step of a power-of-two algorithm: core rank c sends bytes(d) to c ^ d.
template <typename Bytes>
void butterfly_step(Schedule& s, const Groups& groups, int distance, Bytes&& bytes) {
  for (const auto& g : groups) {
    const int n = int(g.size());
    const int p = int(std::bit_floor(unsigned(n))), extra = n - p;
    auto member = [&](int c) { return g[size_t(c < extra ? 2 * c + 1 : c + extra)]; };
    for (int c = 0; c < p; ++c) s.send(member(c), member(c ^ distance), bytes(distance, p));
  }
  s.end_steps();
}

// The extra ranks' fold in (to_core) or the result's way back out.
void fold_step(Schedule& s, const Groups& groups, double bytes, bool to_core) {
  const int extra = int(groups[0].size()) - int(std::bit_floor(unsigned(groups[0].size())));
  if (extra == 0) return;
  for (const auto& g : groups)
    for (int i = 0; i < extra; ++i)
      to_core ? s.send(g[size_t(2 * i)], g[size_t(2 * i + 1)], bytes)
              : s.send(g[size_t(2 * i + 1)], g[size_t(2 * i)], bytes);
  s.end_steps();
}

// The flat algorithms over `groups` (all the same size) at once; returns the bytes a rank reduces.
double flat_schedule(Schedule& s, AllReduceAlgorithm algorithm, const Groups& groups, double bytes) {
  const int n = int(groups[0].size());
  if (n < 2) return 0;
  const int p = int(std::bit_floor(unsigned(n))), log_p = std::countr_zero(unsigned(p));
  const double folded = n > p ? bytes : 0.0;
  switch (algorithm) {
    case AllReduceAlgorithm::ring:
      for (const auto& g : groups)
        for (int i = 0; i < n; ++i) s.send(g[size_t(i)], g[size_t((i + 1) % n)], 2.0 * bytes * (n - 1) / n);
      s.end_steps(2 * (n - 1));
      return bytes * (n - 1) / n;
    case AllReduceAlgorithm::direct:
      for (const auto& g : groups)
        for (int a : g)
          for (int b : g)
            if (a != b) s.send(a, b, bytes);
      s.end_steps();
      return bytes * (n - 1);
    case AllReduceAlgorithm::recursive_doubling:
      fold_step(s, groups, bytes, true);
      for (int d = 1; d < p; d *= 2) butterfly_step(s, groups, d, [&](int, int) { return bytes; });
      fold_step(s, groups, bytes, false);
      return bytes * log_p + folded;
    case AllReduceAlgorithm::rabenseifner:
      fold_step(s, groups, bytes, true);
      for (int d = p / 2; d >= 1; d /= 2) butterfly_step(s, groups, d, [&](int dd, int pp) { return bytes * dd / pp; });
      for (int d = 1; d < p; d *= 2) butterfly_step(s, groups, d, [&](int dd, int pp) { return bytes * dd / pp; });
      fold_step(s, groups, bytes, false);
      return bytes * (p - 1) / p + folded;
    default: TINYDDP_FAIL("flat_schedule: ", algorithm_name(algorithm), " is not a flat algorithm");
  }
}

// A rate or a per-message cost must be positive; a per-call cost may be 0 (`zero_allowed`).
double parse_number(const std::string& word, bool zero_allowed, const std::string& where, int line) {
  try {
    size_t used = 0;
    double v = std::stod(word, &used);
    if (used == word.size() && std::isfinite(v) && (v > 0 || (zero_allowed && v == 0))) return v;
  } catch (const std::exception&) {}
  TINYDDP_FAIL(where, " line ", line, ": '", word, "' is not a ", zero_allowed ? "non-negative" : "positive", " number",
               hint("write 'key value', e.g. 'network_gbit_per_s 1'"));
}

}  // namespace

const char* algorithm_name(AllReduceAlgorithm algorithm) {
  for (auto [a, name] : kNames)
    if (a == algorithm) return name;
  return "?";
}

AllReduceAlgorithm algorithm_from_name(const std::string& name, const std::string& where) {
  std::string list;
  for (auto [a, n] : kNames) {
    if (name == n) return a;
    if (!list.empty()) list += '|';
    list += n;
  }
  TINYDDP_FAIL(where, ": unknown all-reduce algorithm '", name, "'", hint("use one of ", list));
}

CostModel CostModel::parse(const std::string& text, const std::string& where) {
  CostModel m;
  const std::map<std::string, std::pair<double*, double>> keys = {
      {"alpha_network_us", {&m.alpha_network_s, 1e-6}},     {"network_gbit_per_s", {&m.network_bytes_per_s, 1e9 / 8}},
      {"alpha_in_host_us", {&m.alpha_in_host_s, 1e-6}},     {"in_host_gbyte_per_s", {&m.in_host_bytes_per_s, 1e9}},
      {"reduce_gbyte_per_s", {&m.reduce_bytes_per_s, 1e9}}, {"call_us", {&m.call_s, 1e-6}},
  };
  std::istringstream lines(text);
  std::string line;
  for (int number = 1; std::getline(lines, line); ++number) {
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    std::string key, value, rest;
    if (!(words >> key)) continue;
    auto it = keys.find(key);
    std::string known;
    for (const auto& [k, unused] : keys) known += (known.empty() ? "" : ", ") + k;
    TINYDDP_CHECK(it != keys.end(), where, " line ", number, ": unknown key '", key, "'", hint("the keys are ", known));
    TINYDDP_CHECK(bool(words >> value) && !(words >> rest), where, " line ", number, ": '", key,
                  "' needs exactly one value", hint("write 'key value'"));
    *it->second.first = parse_number(value, key == "call_us", where, number) * it->second.second;
  }
  return m;
}

bool CostModel::probe_requested() {
  auto value = env::text("TINYDDP_COST_MODEL");
  return value && *value == "probe";
}

CostModel CostModel::from_environment() {
  auto path = env::text("TINYDDP_COST_MODEL");
  if (!path || *path == "probe" || *path == "builtin") return CostModel{};
  std::ifstream file(*path);
  TINYDDP_CHECK(
      file.good(), "TINYDDP_COST_MODEL: cannot read '", *path, "'",
      hint("name a file of 'key value' lines "
           "(see comm/algorithms/cost_model.h), 'builtin' for the defaults, or unset it to measure the links"));
  std::stringstream text;
  text << file.rdbuf();
  return parse(text.str(), "TINYDDP_COST_MODEL file '" + *path + "'");
}

std::string CostModel::to_text() const {
  std::ostringstream out;
  out.precision(17);
  out << "alpha_network_us " << alpha_network_s * 1e6 << "\nnetwork_gbit_per_s " << network_bytes_per_s * 8 / 1e9
      << "\nalpha_in_host_us " << alpha_in_host_s * 1e6 << "\nin_host_gbyte_per_s " << in_host_bytes_per_s / 1e9
      << "\nreduce_gbyte_per_s " << reduce_bytes_per_s / 1e9 << "\ncall_us " << call_s * 1e6 << "\n";
  return out.str();
}

double Traffic::max_host_egress() const {
  return host_egress_bytes.empty() ? 0.0 : *std::max_element(host_egress_bytes.begin(), host_egress_bytes.end());
}

double Traffic::total_cross_host_bytes() const {
  return std::accumulate(host_egress_bytes.begin(), host_egress_bytes.end(), 0.0);
}

Traffic all_reduce_traffic(AllReduceAlgorithm algorithm, const HostLayout& layout, double bytes,
                           AllReduceAlgorithm across) {
  Schedule s(layout);
  if (algorithm != AllReduceAlgorithm::hierarchical) {
    std::vector<int> everyone(size_t(layout.world()));
    std::iota(everyone.begin(), everyone.end(), 0);
    s.traffic.reduced_bytes = flat_schedule(s, algorithm, {everyone}, bytes);
    return s.traffic;
  }
  TINYDDP_CHECK(layout.is_uniform(),
                "all_reduce_traffic: the hierarchical algorithm needs the same number of ranks on every host");
  const int L = layout.per_host();
  Groups cross(static_cast<size_t>(L));
  for (int j = 0; j < L; ++j)
    for (const auto& on : layout.ranks_on) cross[size_t(j)].push_back(on[size_t(j)]);
  ring_half(s, layout.ranks_on, bytes);
  s.traffic.reduced_bytes = bytes * (L - 1) / L + flat_schedule(s, across, cross, bytes / L);
  ring_half(s, layout.ranks_on, bytes);
  return s.traffic;
}

double predicted_seconds(const CostModel& model, const Traffic& t) { return model.call_s + transfer_seconds(model, t); }

double transfer_seconds(const CostModel& model, const Traffic& t) {
  const double in_host = t.in_host_bytes.empty() ? 0.0
                                                 : *std::max_element(t.in_host_bytes.begin(), t.in_host_bytes.end());
  return t.network_messages * model.alpha_network_s + t.in_host_messages * model.alpha_in_host_s +
         t.max_host_egress() / model.network_bytes_per_s + in_host / model.in_host_bytes_per_s +
         t.reduced_bytes / model.reduce_bytes_per_s;
}

}  // namespace tinyddp::comm
