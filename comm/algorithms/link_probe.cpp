#include "tinyddp/comm/algorithms/link_probe.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <sstream>
#include <vector>

#include "tinyddp/comm/algorithms/algorithm_selection.h"
#include "tinyddp/comm/store/barrier.h"
#include "tinyddp/core/error.h"

namespace tinyddp::comm {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kSmallRounds = 16;  // α: the median of these
constexpr size_t kSmallBytes = 8;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

double median(std::vector<double> values) {
  auto middle = values.begin() + std::ptrdiff_t((values.size() - 1) / 2);
  std::nth_element(values.begin(), middle, values.end());
  return *middle;
}

double steady_seconds() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

struct PairTimes {
  double alpha_s;                               // one small exchange
  double bytes_s;                               // a large exchange's time beyond α, averaged over the timed rounds
  std::array<double, kProbeRounds> begin, end;  // steady_seconds() around each timed large exchange
};

// Small then large exchanges with `peer`, which runs the same at the same time. The buffers live
// only as long as the probe: it runs once, on the thread that builds the group.
PairTimes time_exchanges(Connection* peer, const CollectiveContext& ctx) {
  std::vector<std::byte> send(kProbeBytes, std::byte{1}), recv(kProbeBytes);
  std::vector<double> small;
  for (int i = 0; i < kSmallRounds; ++i) {
    const auto start = Clock::now();
    exchange(peer, send.data(), kSmallBytes, recv.data(), kSmallBytes, ctx);
    small.push_back(seconds_since(start));
  }
  exchange(peer, send.data(), kProbeBytes, recv.data(), kProbeBytes, ctx);
  PairTimes t{median(small), 0, {}, {}};
  for (int i = 0; i < kProbeRounds; ++i) {
    t.begin[size_t(i)] = steady_seconds();
    exchange(peer, send.data(), kProbeBytes, recv.data(), kProbeBytes, ctx);
    t.end[size_t(i)] = steady_seconds();
  }
  // Averaged over the rounds, as host_network_rate does and for the same reason. Noise can make α
  // look as long as a round; the bytes took at least half of it.
  const double round = (t.end.back() - t.begin.front()) / kProbeRounds;
  t.bytes_s = std::max(round - t.alpha_s, round / 2);
  return t;
}

// This rank's partner on the paired host (same local index), or -1.
int network_partner(const HostLayout& layout, int rank) {
  const int other = layout.host_of[size_t(rank)] ^ 1;
  if (other >= layout.hosts()) return -1;
  const auto& theirs = layout.ranks_on[size_t(other)];
  const size_t index = size_t(layout.local_index(rank));
  return index < theirs.size() ? theirs[index] : -1;
}

// One host's link rate: all its ranks' timed bytes over the span from the first one's first start
// to the last one's last end, less α per round; 0 when none of its ranks measured. The whole span,
// not the fastest round: an exchange's round can end early on bytes its peer sent while a round
// ahead, so a single round can look far faster than the link.
double host_network_rate(const std::vector<LinkMeasurement>& measured, const std::vector<int>& ranks) {
  double begin = std::numeric_limits<double>::infinity(), end = 0;
  std::vector<double> alphas;
  for (int r : ranks) {
    const LinkMeasurement& m = measured[size_t(r)];
    if (m.network_end[0] <= 0) continue;
    begin = std::min(begin, m.network_begin.front());
    end = std::max(end, m.network_end.back());
    alphas.push_back(m.alpha_network_s);
  }
  if (alphas.empty()) return 0;
  const double bytes = double(alphas.size()) * kProbeRounds * double(kProbeBytes), span = end - begin;
  return bytes / std::max(span - kProbeRounds * median(alphas), span / 2);
}

// This rank's neighbour on its own host (local index i ^ 1), or -1.
int in_host_partner(const HostLayout& layout, int rank) {
  const auto& mine = layout.ranks_on[size_t(layout.host_of[size_t(rank)])];
  const size_t other = size_t(layout.local_index(rank) ^ 1);
  return other < mine.size() ? mine[other] : -1;
}

double reduce_rate() {
  const size_t count = kProbeBytes / sizeof(float);
  std::vector<float> into(count, 1.0f), from(count, 0.5f);
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < 3; ++i) {
    const auto start = Clock::now();
    reduce_elements(reinterpret_cast<std::byte*>(into.data()), reinterpret_cast<const std::byte*>(into.data()),
                    reinterpret_cast<const std::byte*>(from.data()), count, DType::f32, ReduceOp::sum);
    best = std::min(best, seconds_since(start));
  }
  return double(kProbeBytes) / std::max(best, 1e-9);
}

}  // namespace

std::string LinkMeasurement::to_text() const {
  std::ostringstream out;
  out.precision(17);
  out << alpha_network_s;
  for (size_t k = 0; k < size_t(kProbeRounds); ++k) out << ' ' << network_begin[k] << ' ' << network_end[k];
  out << ' ' << alpha_in_host_s << ' ' << in_host_bytes_per_s << ' ' << reduce_bytes_per_s;
  return out.str();
}

LinkMeasurement LinkMeasurement::parse(const std::string& text, const std::string& where) {
  LinkMeasurement m;
  std::istringstream in(text);
  bool ok = bool(in >> m.alpha_network_s);
  for (size_t k = 0; k < size_t(kProbeRounds); ++k) ok = ok && bool(in >> m.network_begin[k] >> m.network_end[k]);
  std::string rest;
  ok = ok && bool(in >> m.alpha_in_host_s >> m.in_host_bytes_per_s >> m.reduce_bytes_per_s) && !(in >> rest);
  TINYDDP_CHECK(ok, where, ": '", text, "' is not a link measurement (", 4 + 2 * kProbeRounds, " numbers)",
                hint("every rank of a group must run the same tinyddp"));
  return m;
}

LinkMeasurement measure_links(const HostLayout& layout, const ConnectionLookup& connection_to, int rank,
                              const CollectiveContext& ctx, const std::function<void()>& line_up) {
  LinkMeasurement m;
  line_up();
  if (const int across = network_partner(layout, rank); across >= 0) {
    const PairTimes t = time_exchanges(connection_to(across), ctx);
    m.alpha_network_s = t.alpha_s;
    m.network_begin = t.begin;
    m.network_end = t.end;
  }
  if (const int local = in_host_partner(layout, rank); local >= 0) {
    const PairTimes t = time_exchanges(connection_to(local), ctx);
    m.alpha_in_host_s = t.alpha_s;
    m.in_host_bytes_per_s = double(kProbeBytes) / t.bytes_s;
  }
  m.reduce_bytes_per_s = reduce_rate();
  return m;
}

CostModel model_from_measurements(const std::vector<LinkMeasurement>& measured, const HostLayout& layout,
                                  const CostModel& defaults) {
  CostModel model = defaults;
  auto take = [](std::vector<double> values, double& into) {
    std::erase_if(values, [](double v) { return !(v > 0) || !std::isfinite(v); });
    if (!values.empty()) into = median(values);
  };
  auto field = [&](double LinkMeasurement::*f) {
    std::vector<double> values;
    for (const LinkMeasurement& m : measured) values.push_back(m.*f);
    return values;
  };
  std::vector<double> host_rates;
  for (const auto& ranks : layout.ranks_on) host_rates.push_back(host_network_rate(measured, ranks));
  take(field(&LinkMeasurement::alpha_network_s), model.alpha_network_s);
  take(host_rates, model.network_bytes_per_s);
  take(field(&LinkMeasurement::alpha_in_host_s), model.alpha_in_host_s);
  take(field(&LinkMeasurement::in_host_bytes_per_s), model.in_host_bytes_per_s);
  take(field(&LinkMeasurement::reduce_bytes_per_s), model.reduce_bytes_per_s);
  return model;
}

CostModel probe_cost_model(Store& store, const std::string& key, const HostLayout& layout,
                           const ConnectionLookup& connection_to, int rank, const CollectiveContext& ctx,
                           const CostModel& defaults) {
  StoreBarrier barrier(store, rank, layout.world(), key + "line_up");
  const LinkMeasurement mine = measure_links(layout, connection_to, rank, ctx,
                                             [&] { barrier.arrive_and_wait(ctx.timeout); });
  store.set(key + "probe/" + std::to_string(rank), mine.to_text());
  CostModel model = defaults;
  if (rank == 0) {
    std::vector<std::string> keys;
    for (int r = 0; r < layout.world(); ++r) keys.push_back(key + "probe/" + std::to_string(r));
    store.wait(keys, ctx.timeout);
    std::vector<LinkMeasurement> all;
    const std::vector<std::string> texts = store.multi_get(keys);
    for (size_t r = 0; r < texts.size(); ++r)
      all.push_back(LinkMeasurement::parse(texts[r], "rank " + std::to_string(r) + "'s link probe"));
    model = model_from_measurements(all, layout, defaults);
  }
  return agree_on_model(store, key + "model", rank, model, ctx.timeout);
}

}  // namespace tinyddp::comm
