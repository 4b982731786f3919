// The hierarchical all-gather and the host-ordered broadcast against the flat ring's results and
// the closed form (every rank's own values, in rank order), on host layouts of 1-4 ranks per host
// driven over real tcp connections between threads.
#include <doctest/doctest.h>

#include <numeric>
#include <string>
#include <vector>

#include "tinyddp/comm/algorithms/hierarchical_all_gather.h"
#include "tinyddp/comm/algorithms/host_ordered_broadcast.h"
#include "test/comm/algorithms/tcp_world.h"

using namespace tinyddp;
using namespace tinyddp::comm;
using namespace tinyddp::testing;

namespace {

int32_t value_of(int rank, size_t i) { return int32_t(rank * 100'000 + int(i)); }

// Every rank's all-gather output of `count` int32 per rank, by `gather`.
template <typename Gather>
std::vector<std::vector<int32_t>> gather_on_every_rank(const TcpWorld& w, size_t count, Gather&& gather) {
  std::vector<std::vector<int32_t>> outputs(static_cast<size_t>(w.size()));
  run_ranks(w.size(), [&](int r) {
    std::vector<int32_t> in(count);
    for (size_t i = 0; i < count; ++i) in[i] = value_of(r, i);
    outputs[size_t(r)].assign(count * size_t(w.size()), -1);
    gather(r, reinterpret_cast<const std::byte*>(in.data()), reinterpret_cast<std::byte*>(outputs[size_t(r)].data()),
           w.context(r, DType::i32, ReduceOp::sum));
  });
  return outputs;
}

}  // namespace

TEST_CASE("the hierarchical all-gather equals the flat ring's, in rank order, for 2-4 ranks per host") {
  struct Case {
    int hosts, per_host;
  };
  for (Case c : {Case{2, 2}, Case{2, 3}, Case{2, 4}, Case{3, 2}}) {
    CAPTURE(c.hosts);
    CAPTURE(c.per_host);
    const int world = c.hosts * c.per_host;
    TcpWorld w(world);
    const HostLayout layout = HostLayout::uniform(c.hosts, c.per_host);
    REQUIRE(hierarchical_all_gather_applies(layout));
    for (size_t count : {size_t(1), size_t(7), size_t(10'001)}) {
      CAPTURE(count);
      auto hier = gather_on_every_rank(w, count,
                                       [&](int r, const std::byte* in, std::byte* out, const CollectiveContext& ctx) {
                                         hierarchical_all_gather(layout, w.lookup(r), r, in, out, count, ctx);
                                       });
      auto flat = gather_on_every_rank(w, count,
                                       [&](int r, const std::byte* in, std::byte* out, const CollectiveContext& ctx) {
                                         ring_all_gather(w.everyone(r).ring(), in, out, count, ctx);
                                       });
      for (int r = 0; r < world; ++r) {
        CHECK(hier[size_t(r)] == flat[size_t(r)]);
        for (int owner = 0; owner < world; ++owner)
          CHECK(hier[size_t(r)][size_t(owner) * count + count - 1] == value_of(owner, count - 1));
      }
    }
  }
  CHECK_FALSE(hierarchical_all_gather_applies(HostLayout::uniform(4, 1)));
  CHECK_FALSE(hierarchical_all_gather_applies(HostLayout::uniform(1, 4)));
  CHECK_FALSE(hierarchical_all_gather_applies(HostLayout::from_host_ids({"a", "a", "b"})));
}

TEST_CASE(
    "the host-ordered broadcast reaches every rank from every root, host-major or round-robin, 1-4 ranks per host") {
  std::vector<HostLayout> layouts;
  for (int per_host = 1; per_host <= 4; ++per_host) layouts.push_back(HostLayout::uniform(2, per_host));
  layouts.push_back(HostLayout::from_host_ids({"a", "b", "a", "b", "a", "b"}));  // round-robin placement
  layouts.push_back(HostLayout::from_host_ids({"a", "b", "c", "a", "a"}));       // uneven hosts
  for (const HostLayout& layout : layouts) {
    const int world = layout.world();
    CAPTURE(world);
    TcpWorld w(world);
    for (int root = 0; root < world; ++root) {
      CAPTURE(root);
      const size_t bytes = 100'003;
      std::vector<std::vector<std::byte>> bufs(static_cast<size_t>(world));
      run_ranks(world, [&](int r) {
        auto& buf = bufs[size_t(r)];
        buf.assign(bytes, std::byte(r == root ? 0 : 0xEE));
        if (r == root)
          for (size_t i = 0; i < bytes; ++i) buf[i] = std::byte(i * 7 + 3);
        host_ordered_broadcast(layout, w.lookup(r), r, buf.data(), bytes, root, w.context(r, DType::u8, ReduceOp::sum));
      });
      for (int r = 0; r < world; ++r) CHECK(bufs[size_t(r)] == bufs[size_t(root)]);
      CHECK(bufs[0][bytes - 1] == std::byte((bytes - 1) * 7 + 3));
    }
  }
}
