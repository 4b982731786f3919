// Recursive doubling, Rabenseifner and the hierarchical all-reduce, run on real tcp connections
// between threads, against the plain-loop reference of test_collectives_support.h: every world size
// 1-8, odd counts, every op, integer, float and 16-bit float types. The hierarchical algorithm is given host
// layouts (H hosts x L ranks) that one machine's host identity cannot show, so it is driven here
// directly rather than through a ProcessGroup.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tinyddp/comm/algorithms/hierarchical_allreduce.h"
#include "tinyddp/comm/algorithms/rabenseifner.h"
#include "tinyddp/comm/algorithms/recursive_doubling.h"
#include "tinyddp/comm/algorithms/small_message_allreduce.h"
#include "tinyddp/comm/store/hash_store.h"
#include "tinyddp/comm/transport/tcp_transport.h"
#include "test/comm/algorithms/tcp_world.h"
#include "test/comm/test_collectives_support.h"

using namespace tinyddp;
using namespace tinyddp::comm;
using namespace tinyddp::testing;

namespace {

using Algorithm =
    std::function<void(int rank, const std::byte* in, std::byte* out, size_t count, const CollectiveContext&)>;

// Runs `algorithm` on every rank (inputs from input_value) and returns every rank's result.
template <typename T>
std::vector<Tensor> run_algorithm(const TcpWorld& w, ReduceOp op, int64_t count, bool in_place,
                                  const Algorithm& algorithm) {
  const DType dtype = make_input<T>(op, 0, 1).dtype();
  std::vector<Tensor> outputs(size_t(w.size()));
  run_ranks(w.size(), [&](int r) {
    Tensor in = make_input<T>(op, r, count);
    Tensor out = in_place ? in : Tensor::empty({count}, dtype);
    algorithm(r, bytes_of(in), bytes_of(out), size_t(count), w.context(r, dtype, op));
    outputs[size_t(r)] = out;
  });
  return outputs;
}

// Every rank's result equals the reference, element for element (`#wrong` 0).
template <typename T>
void check_exact(const TcpWorld& w, ReduceOp op, int64_t count, bool in_place, const Algorithm& algorithm) {
  CAPTURE(reduce_op_name(op));
  CAPTURE(count);
  const std::vector<Tensor> outputs = run_algorithm<T>(w, op, count, in_place, algorithm);
  const std::vector<T> expected = reference_reduce<T>(op, w.size(), count);
  for (int r = 0; r < w.size(); ++r) {
    const T* got = outputs[size_t(r)].template data<T>();
    int64_t wrong = 0, first = -1;
    for (int64_t i = 0; i < count; ++i)
      if (got[i] != expected[size_t(i)]) {
        if (first < 0) first = i;
        ++wrong;
      }
    CHECK_MESSAGE(wrong == 0, "rank ", r, " of ", w.size(), ": #wrong ", wrong, " of ", count, ", first at ", first);
  }
}

// All ops, f32/f64/i32/i64, odd and even counts, in place and not.
void check_every_case(const TcpWorld& w, const Algorithm& algorithm) {
  for (int64_t count : {int64_t(1), int64_t(3), int64_t(7), int64_t(1001), int64_t(40'001)}) {
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min, ReduceOp::prod}) {
      check_exact<float>(w, op, count, true, algorithm);
      check_exact<int64_t>(w, op, count, false, algorithm);
    }
    check_exact<double>(w, ReduceOp::sum, count, false, algorithm);
    check_exact<int32_t>(w, ReduceOp::avg, count, true, algorithm);
    // 2-byte elements: chunks of odd byte counts, streams at odd positions (every sum is exact in 16 bits).
    check_exact<bfloat16>(w, ReduceOp::sum, count, true, algorithm);
    check_exact<bfloat16>(w, ReduceOp::avg, count, false, algorithm);
    check_exact<float16>(w, ReduceOp::max, count, false, algorithm);
    check_exact<float16>(w, ReduceOp::sum, count, true, algorithm);
  }
}

// Inexact float sums (0.1 steps): every rank must hold the same bits, close to the true sum.
void check_ranks_agree(const TcpWorld& w, const Algorithm& algorithm) {
  const int64_t count = 777;
  std::vector<Tensor> outputs(size_t(w.size()));
  std::vector<std::vector<float>> inputs(size_t(w.size()));
  run_ranks(w.size(), [&](int r) {
    std::vector<float> v(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) v[size_t(i)] = 0.1f * float((r + 1) * (i % 11)) + 1e-3f * float(r);
    inputs[size_t(r)] = v;
    Tensor t = Tensor::from_vector(v);
    algorithm(r, bytes_of(t), bytes_of(t), size_t(count), w.context(r, DType::f32, ReduceOp::sum));
    outputs[size_t(r)] = t;
  });
  for (int r = 1; r < w.size(); ++r)
    CHECK_MESSAGE(std::memcmp(outputs[0].raw_data(), outputs[size_t(r)].raw_data(), size_t(count) * 4) == 0, "rank ", r,
                  " differs from rank 0 in the bits of an inexact sum");
  // Against the exact sum of the very floats the ranks held (summed in double, exact for so few terms
  // of like magnitude): W - 1 float additions in any order stay within gamma(W - 1) times the sum of
  // the terms' magnitudes (Higham, 3.1), whichever rank's chunk starts where.
  const double gamma = double(w.size() - 1) * 0x1p-24 / (1 - double(w.size() - 1) * 0x1p-24);
  for (int64_t i = 0; i < count; ++i) {
    double exact = 0, magnitude = 0;
    for (int r = 0; r < w.size(); ++r) {
      const float v = inputs[size_t(r)][size_t(i)];
      exact += double(v);
      magnitude += std::fabs(double(v));
    }
    REQUIRE(std::fabs(double(outputs[0].data<float>()[i]) - exact) <= gamma * magnitude);
  }
}

}  // namespace

TEST_CASE("recursive doubling and Rabenseifner give exact all-reduces for world sizes 1-8 and odd counts") {
  for (int world = 1; world <= 8; ++world) {
    CAPTURE(world);
    TcpWorld w(world);
    Algorithm rd = [&](int r, const std::byte* in, std::byte* out, size_t count, const CollectiveContext& ctx) {
      recursive_doubling_all_reduce(w.everyone(r), in, out, count, ctx);
    };
    Algorithm rabenseifner = [&](int r, const std::byte* in, std::byte* out, size_t count,
                                 const CollectiveContext& ctx) {
      rabenseifner_all_reduce(w.everyone(r), in, out, count, ctx);
    };
    SUBCASE("recursive doubling") {
      check_every_case(w, rd);
      check_ranks_agree(w, rd);
    }
    SUBCASE("Rabenseifner") {
      check_every_case(w, rabenseifner);
      check_ranks_agree(w, rabenseifner);
    }
  }
}

// (A world of 1 never reaches these two: the process group copies the input itself.)
TEST_CASE("the ring and the direct exchange give exact all-reduces for world sizes 2-8, 16-bit floats included") {
  for (int world = 2; world <= 8; ++world) {
    CAPTURE(world);
    TcpWorld w(world);
    Algorithm ring = [&](int r, const std::byte* in, std::byte* out, size_t count, const CollectiveContext& ctx) {
      ring_group_all_reduce(w.everyone(r), in, out, count, ctx);
    };
    Algorithm direct = [&](int r, const std::byte* in, std::byte* out, size_t count, const CollectiveContext& ctx) {
      direct_all_reduce(w.all_peers(r), r, in, out, count, ctx);
    };
    SUBCASE("ring") { check_every_case(w, ring); }
    SUBCASE("direct") { check_every_case(w, direct); }
  }
}

TEST_CASE(
    "the hierarchical all-reduce is exact on every uniform layout of up to 8 ranks, with each cross-host algorithm") {
  const std::pair<int, int> layouts[] = {{1, 2}, {2, 1}, {2, 2}, {2, 3}, {3, 2}, {2, 4}, {4, 2}, {1, 3}, {3, 1}};
  const std::pair<const char*, GroupAllReduce> across[] = {{"ring", ring_group_all_reduce},
                                                           {"rd", recursive_doubling_all_reduce},
                                                           {"rabenseifner", rabenseifner_all_reduce}};
  for (auto [hosts, per_host] : layouts) {
    CAPTURE(hosts);
    CAPTURE(per_host);
    TcpWorld w(hosts * per_host);
    const HostLayout layout = HostLayout::uniform(hosts, per_host);
    for (auto [name, algorithm] : across) {
      CAPTURE(name);
      Algorithm hier = [&, algorithm = algorithm](int r, const std::byte* in, std::byte* out, size_t count,
                                                  const CollectiveContext& ctx) {
        hierarchical_all_reduce(layout, w.lookup(r), r, in, out, count, algorithm, ctx);
      };
      check_every_case(w, hier);
      check_ranks_agree(w, hier);
    }
  }
}

TEST_CASE("the hierarchical all-reduce refuses a layout with unequal ranks per host, naming it") {
  TcpWorld w(3);
  HostLayout layout = HostLayout::from_host_ids({"a", "a", "b"});
  CHECK_FALSE(layout.is_uniform());
  std::vector<std::string> errors(3);
  run_ranks(3, [&](int r) {
    float x = 1;
    try {
      hierarchical_all_reduce(layout, w.lookup(r), r, reinterpret_cast<std::byte*>(&x),
                              reinterpret_cast<std::byte*>(&x), 1, ring_group_all_reduce,
                              w.context(r, DType::f32, ReduceOp::sum));
    } catch (const std::exception& e) {
      errors[size_t(r)] = e.what();
    }
  });
  for (const std::string& e : errors) CHECK(e.find("same number of ranks on every host") != std::string::npos);
}
