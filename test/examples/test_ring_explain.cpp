// examples/ring_explain/textbook_ring.h, the ring all-reduce as a textbook writes it, gives the
// engine's exact results: the real "host" process group (the pipelined stream engine, over shared
// memory and over tcp) sums every element in the same order, so the two agree to the last bit.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tinyddp/comm/process_group.h"
#include "tinyddp/comm/store/hash_store.h"
#include "examples/ring_explain/textbook_ring.h"

using namespace tinyddp;

namespace {

// Values whose sum depends on the order they are added in: random signs and mantissas over 40
// binary orders of magnitude.
std::vector<std::vector<float>> inputs(int ranks, size_t count, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> mantissa(-1.f, 1.f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  auto buffers = std::vector<std::vector<float>>(size_t(ranks), std::vector<float>(count));
  for (auto& buffer : buffers)
    for (float& x : buffer) x = std::ldexp(mantissa(gen), exponent(gen));
  return buffers;
}

// Every rank's all_reduce through a real "host" process group, the ranks as threads of this process.
std::vector<std::vector<float>> through_engine(const std::vector<std::vector<float>>& in,
                                               const std::string& transport) {
  const int n = int(in.size());
  auto store = std::make_shared<comm::HashStore>();
  store->set_timeout(std::chrono::seconds(30));
  comm::ProcessGroupOptions options;
  options.small_message_bytes = 0;  // the ring, whatever the size
  options.transport = transport;
  options.timeout = std::chrono::seconds(30);
  options.token = "";
  std::vector<std::vector<float>> out(in.size());
  std::vector<std::string> errors(in.size());
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r)
    ranks.emplace_back([&, r] {
      try {
        auto group = comm::create_process_group("host", store, r, n, options);
        Tensor t = Tensor::from_vector(in[size_t(r)]);
        group->all_reduce(t)->wait();
        out[size_t(r)] = t.to_vector<float>();
      } catch (const std::exception& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < n; ++r) REQUIRE_MESSAGE(errors[size_t(r)].empty(), "rank ", r, ": ", errors[size_t(r)]);
  return out;
}

}  // namespace

TEST_CASE("ring_explain: the textbook ring gives the engine's results bit for bit, over shm and tcp") {
  struct Case {
    int ranks;
    size_t count;
  };
  // Counts that n does not divide, fewer elements than ranks, and one of 1.5 MiB per rank: many
  // turns of the engine's pipeline per chunk, over both transports.
  for (Case c : {Case{2, 1001}, Case{3, 2}, Case{3, 4099}, Case{4, 12345}, Case{3, 393'217}}) {
    for (const char* transport : {"shm", "tcp"}) {
      CAPTURE(c.ranks);
      CAPTURE(c.count);
      CAPTURE(transport);
      const auto in = inputs(c.ranks, c.count, uint32_t(c.ranks * 7919 + c.count));
      auto textbook = in;
      examples::textbook_ring_all_reduce(textbook);
      const auto engine = through_engine(in, transport);
      for (int r = 0; r < c.ranks; ++r) {
        CHECK(engine[size_t(r)] == textbook[size_t(r)]);
        CHECK(textbook[size_t(r)] == textbook[0]);  // every rank ends with the same sum
      }
    }
  }
}

TEST_CASE("ring_explain: the textbook ring's order of addition matters here (the check above can fail)") {
  // With three ranks or more each chunk starts its sum at a different rank, so a plain rank-order sum
  // x0 + x1 + x2 differs from the ring's in some elements: agreeing bit for bit above means the same
  // order, not merely a close sum.
  const auto in = inputs(3, 4099, 1);
  auto textbook = in;
  examples::textbook_ring_all_reduce(textbook);
  size_t differ = 0;
  for (size_t i = 0; i < in[0].size(); ++i) differ += textbook[0][i] != (in[0][i] + in[1][i]) + in[2][i] ? 1 : 0;
  CHECK(differ > 0);
  // And it is a sum: within float rounding of the double-precision sum.
  for (size_t i = 0; i < in[0].size(); ++i) {
    double exact = double(in[0][i]) + double(in[1][i]) + double(in[2][i]);
    double bound = 4 * 0x1p-24 * (std::fabs(in[0][i]) + std::fabs(in[1][i]) + std::fabs(in[2][i]));
    REQUIRE(std::fabs(double(textbook[0][i]) - exact) <= bound);
  }
}
