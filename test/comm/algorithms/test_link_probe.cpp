// The link probe: how it turns the ranks' measurements into one model (closed forms), and the probe
// itself over real tcp connections between threads, given host layouts: every rank ends with the
// same model, measured where the layout lets it measure and the defaults elsewhere.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "tinyddp/comm/algorithms/link_probe.h"
#include "tinyddp/comm/store/hash_store.h"
#include "test/comm/algorithms/tcp_world.h"

using namespace tinyddp;
using namespace tinyddp::comm;
using namespace tinyddp::testing;

namespace {

LinkMeasurement measured(double alpha, std::array<double, 3> begin, std::array<double, 3> end, double in_host,
                         double reduce) {
  static_assert(kProbeRounds == 3, "the rounds below are written for 3");
  LinkMeasurement m;
  m.alpha_network_s = alpha;
  m.network_begin = begin;
  m.network_end = end;
  m.in_host_bytes_per_s = in_host;
  m.reduce_bytes_per_s = reduce;
  return m;
}

}  // namespace

TEST_CASE("the probe's model: per host, its ranks' bytes over their common span; elsewhere the median") {
  const HostLayout layout = HostLayout::uniform(2, 2);
  std::vector<LinkMeasurement> m = {
      // Host 0: the three rounds span 10.00 - 10.16 s; α 1 ms.
      measured(0.001, {10.00, 10.05, 10.10}, {10.05, 10.10, 10.15}, 1e9, 8e9),
      measured(0.001, {10.01, 10.06, 10.11}, {10.06, 10.12, 10.16}, 3e9, 6e9),
      // Host 1: 20.0 - 20.3 s; α 1 and 3 ms (the median of two: the lower).
      measured(0.001, {20.0, 20.1, 20.2}, {20.1, 20.2, 20.3}, 2e9, 7e9),
      measured(0.003, {20.0, 20.1, 20.2}, {20.1, 20.25, 20.3}, 0, 9e9),
  };
  m[0].alpha_in_host_s = 4e-6, m[1].alpha_in_host_s = 2e-6, m[2].alpha_in_host_s = 3e-6;
  const CostModel defaults;
  const CostModel model = model_from_measurements(m, layout, defaults);
  const double bytes = 2.0 * 3.0 * double(kProbeBytes);  // the host's 2 ranks, 3 rounds
  const double host0 = bytes / (10.16 - 10.00 - 3 * 0.001), host1 = bytes / (20.3 - 20.0 - 3 * 0.001);
  CHECK(model.network_bytes_per_s == doctest::Approx(std::min(host0, host1)));
  CHECK(model_from_measurements({m[0], m[1], m[0], m[1]}, layout, defaults).network_bytes_per_s ==
        doctest::Approx(host0));
  CHECK(model.alpha_network_s == doctest::Approx(0.001));
  CHECK(model.alpha_in_host_s == doctest::Approx(3e-6));
  CHECK(model.in_host_bytes_per_s == doctest::Approx(2e9));  // rank 3 measured none
  CHECK(model.reduce_bytes_per_s == doctest::Approx(7e9));

  // Nothing measured in host: the defaults stay, exactly.
  for (auto& one : m) one.alpha_in_host_s = one.in_host_bytes_per_s = 0;
  const CostModel no_in_host = model_from_measurements(m, layout, defaults);
  CHECK(no_in_host.alpha_in_host_s == defaults.alpha_in_host_s);
  CHECK(no_in_host.in_host_bytes_per_s == defaults.in_host_bytes_per_s);
}

TEST_CASE("a rank's measurement survives the store's text, and a foreign one is refused") {
  const LinkMeasurement m = measured(1.5e-5, {12.25, 12.5, 12.75}, {12.5, 12.75, 13.0}, 3.5e9, 1.25e10);
  const LinkMeasurement back = LinkMeasurement::parse(m.to_text(), "test");
  CHECK(back.alpha_network_s == m.alpha_network_s);
  CHECK(back.network_begin == m.network_begin);
  CHECK(back.network_end == m.network_end);
  CHECK(back.reduce_bytes_per_s == m.reduce_bytes_per_s);
  CHECK_THROWS_WITH(LinkMeasurement::parse("1 2 3", "rank 3's link probe"),
                    doctest::Contains("rank 3's link probe: '1 2 3' is not a link measurement"));
}

TEST_CASE("the probe over tcp: every rank gets the same model, measured where the layout allows") {
  struct Case {
    int hosts, per_host;
  };
  for (Case c : {Case{2, 2}, Case{3, 1}}) {
    CAPTURE(c.hosts);
    CAPTURE(c.per_host);
    const int world = c.hosts * c.per_host;
    TcpWorld w(world);
    HashStore store;
    store.set_timeout(std::chrono::seconds(20));
    const HostLayout layout = HostLayout::uniform(c.hosts, c.per_host);
    const CostModel defaults;
    std::vector<std::string> models(static_cast<size_t>(world));
    run_ranks(world, [&](int r) {
      models[size_t(r)] = probe_cost_model(store, "probe-test/", layout, w.lookup(r), r,
                                           w.context(r, DType::f32, ReduceOp::sum), defaults)
                              .to_text();
    });
    for (int r = 1; r < world; ++r) CHECK(models[size_t(r)] == models[0]);
    const CostModel model = CostModel::parse(models[0], "rank 0's model");
    CHECK(model.network_bytes_per_s != defaults.network_bytes_per_s);
    CHECK(model.alpha_network_s != defaults.alpha_network_s);
    CHECK(model.alpha_network_s < 1.0);
    CHECK(model.network_bytes_per_s > 1e6);
    CHECK(model.reduce_bytes_per_s != defaults.reduce_bytes_per_s);
    if (c.per_host > 1) {
      CHECK(model.in_host_bytes_per_s != defaults.in_host_bytes_per_s);
    } else {  // no rank has a neighbour on its host
      CHECK(model.in_host_bytes_per_s == doctest::Approx(defaults.in_host_bytes_per_s));
      CHECK(model.alpha_in_host_s == doctest::Approx(defaults.alpha_in_host_s));
    }
  }
}
