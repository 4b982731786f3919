// bf16 and f16 in the collectives: how one reduction step rounds (reduce_elements), how far a 16-bit
// ring may drift (a closed-form bound), and the single-rounding all-reduce and reduce-scatter, whose
// every bit is checked against the arithmetic they promise, computed here independently; and the ring
// reduce-scatter and all-gather on 2-byte elements beyond the 4 ranks test_collectives.cpp runs.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "tinyddp/comm/algorithms/peer_group.h"
#include "tinyddp/comm/algorithms/single_rounding.h"
#include "tinyddp/comm/reduce_op.h"
#include "test/comm/algorithms/tcp_world.h"
#include "test/half_precision_reference.h"

using namespace tinyddp;
using namespace tinyddp::comm;
using namespace tinyddp::testing;

namespace {

template <typename Half>
constexpr Format format_of() {
  return std::is_same_v<Half, bfloat16> ? kBf16 : kF16;
}

// Gradient-like values: both signs, magnitudes over `decades` powers of ten below 1, already 16-bit.
template <typename Half>
std::vector<Half> gradient_like(size_t n, uint64_t seed, double decades = 4) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> exponent(-decades, 0), unit(0, 1);
  std::vector<Half> v(n);
  for (Half& x : v) x = Half(float((unit(rng) < 0.5 ? -1 : 1) * std::pow(10.0, exponent(rng))));
  return v;
}

// The promised arithmetic of the single-rounding collectives, written out: every rank's 16-bit value
// of element i widened to f32, summed in rank order in f32, (avg: divided by n in f32,) then
// rounded once to the 16-bit format by the independent reference.
template <typename Half>
double single_rounding_reference(const std::vector<std::vector<Half>>& inputs, size_t i, bool average) {
  float sum = float(inputs[0][i]);
  for (size_t r = 1; r < inputs.size(); ++r) sum += float(inputs[r][i]);
  if (average) sum /= float(inputs.size());
  return round_to_format(double(sum), format_of<Half>());
}

template <typename Half>
void check_single_rounding_all_reduce(const TcpWorld& w, size_t count, ReduceOp op) {
  CAPTURE(count);
  CAPTURE(reduce_op_name(op));
  const int n = w.size();
  std::vector<std::vector<Half>> inputs(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) inputs[size_t(r)] = gradient_like<Half>(count, 1000 + uint64_t(r));
  std::vector<Tensor> outputs(static_cast<size_t>(n));
  run_ranks(n, [&](int r) {
    Tensor t = Tensor::from_vector(inputs[size_t(r)], {int64_t(count)});
    PeerGroup group = w.everyone(r);
    single_rounding_all_reduce(w.all_peers(r), group.ring(), bytes_of(t), bytes_of(t), count,
                               w.context(r, dtype_of<Half>(), op));
    outputs[size_t(r)] = t;
  });
  for (int r = 0; r < n; ++r) {
    const Half* got = outputs[size_t(r)].data<Half>();
    size_t wrong = 0;
    for (size_t i = 0; i < count; ++i) {
      const double want = single_rounding_reference(inputs, i, op == ReduceOp::avg);
      if (!(double(float(got[i])) == want && std::signbit(float(got[i])) == std::signbit(want))) ++wrong;
    }
    CHECK_MESSAGE(wrong == 0, ("rank " + std::to_string(r) + " of " + std::to_string(n) + ": " + std::to_string(wrong) +
                               " of " + std::to_string(count) + " elements differ from the single-rounding reference"));
  }
}

}  // namespace

TEST_CASE("one reduction step on bf16 or f16 is the exact result of the op, rounded once to nearest even") {
  for (bool bf16 : {true, false}) {
    CAPTURE(bf16);
    const size_t n = 100'000;
    // Values of 16 bits whose exact sums and products f32 holds, so the one rounding is the only one.
    std::vector<uint16_t> a(n), b(n + 1), out(n);
    auto fill = [&](std::vector<uint16_t>& v, uint64_t seed) {
      if (bf16) {
        auto values = gradient_like<bfloat16>(v.size(), seed, 6);
        for (size_t i = 0; i < v.size(); ++i) v[i] = values[i].bits;
      } else {
        auto values = gradient_like<float16>(v.size(), seed, 3);
        for (size_t i = 0; i < v.size(); ++i) v[i] = values[i].bits;
      }
    };
    fill(a, 1);
    fill(b, 2);
    const DType dtype = bf16 ? DType::bf16 : DType::f16;
    double (*decode)(uint16_t) = bf16 ? decode_bf16 : decode_f16;
    const Format format = bf16 ? kBf16 : kF16;
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::max, ReduceOp::min}) {
      CAPTURE(reduce_op_name(op));
      // The incoming side one byte off its alignment, as it may lie in a transport's buffer.
      std::vector<std::byte> odd(2 * n + 1);
      std::memcpy(odd.data() + 1, b.data(), 2 * n);
      reduce_elements(out.data(), a.data(), odd.data() + 1, n, dtype, op);
      size_t wrong = 0;
      for (size_t i = 0; i < n; ++i) {
        const double x = decode(a[i]), y = decode(b[i]);
        double exact = 0;
        switch (op) {
          case ReduceOp::sum: exact = x + y; break;
          case ReduceOp::prod: exact = x * y; break;
          case ReduceOp::max: exact = x < y ? y : x; break;
          default: exact = y < x ? y : x; break;
        }
        if (decode(out[i]) != round_to_format(exact, format)) ++wrong;
      }
      CHECK_MESSAGE(wrong == 0, (std::to_string(wrong) + " of " + std::to_string(n) + " elements"));
    }
    // avg divides once, at the end, in f32: 3 / 3 is 1, where the 16-bit 1/3 would not give it back.
    std::vector<uint16_t> three(5, bf16 ? bfloat16(3.f).bits : float16(3.f).bits);
    finish_average(three.data(), three.size(), dtype, 3);
    for (uint16_t h : three) CHECK(decode(h) == 1.0);
    // A world of 257 ranks: 257 is no bf16 value (8 bits of precision), the division still uses 257.
    std::vector<uint16_t> big(1, bf16 ? bfloat16(257.f).bits : float16(257.f).bits);
    finish_average(big.data(), 1, dtype, 257);
    CHECK(decode(big[0]) ==
          round_to_format(double(float(decode(bf16 ? bfloat16(257.f).bits : float16(257.f).bits)) / 257.f), format));
  }
}

TEST_CASE("a bf16 ring's error stays inside the bound for n - 1 roundings, and every rank holds the same bits") {
  // Summing n values with a rounding after each of the n - 1 additions errs by at most
  // gamma(n-1) * sum |x_i|, gamma(k) = k u / (1 - k u), u = 2^-8 for bf16 (Higham, Accuracy and
  // Stability of Numerical Algorithms, eq. 4.4). The values start as bf16, so they are exact.
  for (int world : {2, 3, 5, 8}) {
    CAPTURE(world);
    TcpWorld w(world);
    const size_t count = 30'011;
    std::vector<std::vector<bfloat16>> inputs(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) inputs[size_t(r)] = gradient_like<bfloat16>(count, 77 + uint64_t(r));
    std::vector<Tensor> outputs(static_cast<size_t>(world));
    run_ranks(world, [&](int r) {
      Tensor t = Tensor::from_vector(inputs[size_t(r)], {int64_t(count)});
      ring_group_all_reduce(w.everyone(r), bytes_of(t), bytes_of(t), count, w.context(r, DType::bf16, ReduceOp::sum));
      outputs[size_t(r)] = t;
    });
    const double u = std::ldexp(1.0, -8), k = double(world - 1), gamma = k * u / (1 - k * u);
    size_t outside = 0;
    for (size_t i = 0; i < count; ++i) {
      double exact = 0, magnitude = 0;
      for (int r = 0; r < world; ++r) {
        exact += double(float(inputs[size_t(r)][i]));
        magnitude += std::fabs(double(float(inputs[size_t(r)][i])));
      }
      if (std::fabs(double(float(outputs[0].data<bfloat16>()[i])) - exact) > gamma * magnitude) ++outside;
    }
    CHECK(outside == 0);
    for (int r = 1; r < world; ++r)
      CHECK(std::memcmp(outputs[0].raw_data(), outputs[size_t(r)].raw_data(), count * 2) == 0);
  }
}

TEST_CASE(
    "the single-rounding all-reduce equals the f32 sum in rank order rounded once, bit for bit, world sizes 1-8") {
  for (int world = 1; world <= 8; ++world) {
    CAPTURE(world);
    TcpWorld w(world);
    for (size_t count : {size_t(1), size_t(7), size_t(1001), size_t(40'003)}) {
      check_single_rounding_all_reduce<bfloat16>(w, count, ReduceOp::sum);
      check_single_rounding_all_reduce<float16>(w, count, ReduceOp::sum);
    }
    check_single_rounding_all_reduce<bfloat16>(w, 999, ReduceOp::avg);
    check_single_rounding_all_reduce<float16>(w, 999, ReduceOp::avg);
  }
}

TEST_CASE("the process group's single-rounding all-reduce and reduce-scatter, and what they refuse") {
  const int world = 3;
  for (std::string transport : {"shm", "tcp"}) {
    CAPTURE(transport);
    ProcessGroupOptions options;
    options.transport = transport;
    options.timeout = std::chrono::seconds(30);
    options.group_name = "single-rounding-" + transport;
    auto groups = make_groups(world, options);
    const int64_t per_rank = 3'335;  // reduce-scatter: 3 parts of an odd count each
    std::vector<std::vector<bfloat16>> inputs(world);
    for (int r = 0; r < world; ++r)
      inputs[size_t(r)] = gradient_like<bfloat16>(size_t(per_rank * world), 50 + uint64_t(r));
    std::vector<Tensor> reduced(world), parts(world);
    run_ranks(world, [&](int r) {
      ProcessGroup& pg = *groups[size_t(r)];
      reduced[size_t(r)] = Tensor::from_vector(inputs[size_t(r)], {per_rank * world});
      pg.all_reduce_single_rounding(reduced[size_t(r)])->wait();
      parts[size_t(r)] = Tensor::empty({per_rank}, DType::bf16);
      pg.reduce_scatter_single_rounding(parts[size_t(r)], Tensor::from_vector(inputs[size_t(r)], {per_rank * world}),
                                        ReduceOp::avg)
          ->wait();
    });
    for (int r = 0; r < world; ++r)
      for (int64_t i = 0; i < per_rank * world; i += 97) {
        CHECK(double(float(reduced[size_t(r)].data<bfloat16>()[i])) ==
              single_rounding_reference(inputs, size_t(i), false));
        if (i < per_rank)
          CHECK(double(float(parts[size_t(r)].data<bfloat16>()[i])) ==
                single_rounding_reference(inputs, size_t(r * per_rank + i), true));
      }
    // The plain collectives on 16-bit tensors through the group: coalesced and into another tensor.
    std::vector<std::vector<bfloat16>> coalesced(static_cast<size_t>(world));
    std::vector<std::vector<float16>> into(static_cast<size_t>(world));
    run_ranks(world, [&](int r) {
      ProcessGroup& pg = *groups[size_t(r)];
      std::vector<Tensor> several{make_input<bfloat16>(ReduceOp::sum, r, 5),
                                  make_input<bfloat16>(ReduceOp::sum, r, 1003)};
      pg.all_reduce_coalesced(several)->wait();
      coalesced[size_t(r)] = several[1].to_vector<bfloat16>();
      Tensor out = Tensor::empty({777}, DType::f16);
      pg.all_reduce_into(out, make_input<float16>(ReduceOp::avg, r, 777), ReduceOp::avg)->wait();
      into[size_t(r)] = out.to_vector<float16>();
    });
    for (int r = 0; r < world; ++r) {
      CHECK(coalesced[size_t(r)] == reference_reduce<bfloat16>(ReduceOp::sum, world, 1003));
      CHECK(into[size_t(r)] == reference_reduce<float16>(ReduceOp::avg, world, 777));
    }
    ProcessGroup& pg = *groups[0];
    CHECK_THROWS_WITH_AS(pg.all_reduce_single_rounding(Tensor::zeros({4})),
                         doctest::Contains("takes bf16 or f16 with sum or avg, got f32[4]"), Error);
    CHECK_THROWS_WITH_AS(pg.all_reduce_single_rounding(Tensor::zeros({4}, DType::bf16), ReduceOp::max),
                         doctest::Contains("or call all_reduce for other dtypes and ops"), Error);
    CHECK_THROWS_WITH_AS(pg.reduce_scatter_single_rounding(Tensor::zeros({4}, DType::bf16),
                                                           Tensor::zeros({4}, DType::bf16)),
                         doctest::Contains("must hold world size (3) x output"), Error);
    run_ranks(world, [&](int r) { groups[size_t(r)]->barrier()->wait(); });
  }
}

TEST_CASE("the ring reduce-scatter and all-gather move 2-byte elements exactly at world sizes 5-8, odd counts") {
  for (int world = 5; world <= 8; ++world) {
    CAPTURE(world);
    TcpWorld w(world);
    for (int64_t per_rank : {int64_t(1), int64_t(3), int64_t(1001)}) {
      CAPTURE(per_rank);
      std::vector<Tensor> parts(static_cast<size_t>(world)), gathered(static_cast<size_t>(world));
      run_ranks(world, [&](int r) {
        const PeerGroup group = w.everyone(r);
        Tensor in = make_input<bfloat16>(ReduceOp::sum, r, per_rank * world);
        parts[size_t(r)] = Tensor::empty({per_rank}, DType::bf16);
        ring_reduce_scatter(group.ring(), bytes_of(in), bytes_of(parts[size_t(r)]), size_t(per_rank),
                            w.context(r, DType::bf16, ReduceOp::sum));
        Tensor mine = make_input<float16>(ReduceOp::max, r, per_rank);
        gathered[size_t(r)] = Tensor::empty({per_rank * world}, DType::f16);
        ring_all_gather(group.ring(), bytes_of(mine), bytes_of(gathered[size_t(r)]), size_t(per_rank),
                        w.context(r, DType::f16, ReduceOp::sum));
      });
      const std::vector<bfloat16> sums = reference_reduce<bfloat16>(ReduceOp::sum, world, per_rank * world);
      for (int r = 0; r < world; ++r) {
        CHECK(parts[size_t(r)].to_vector<bfloat16>() ==
              std::vector<bfloat16>(sums.begin() + r * per_rank, sums.begin() + (r + 1) * per_rank));
        std::vector<float16> want;
        for (int p = 0; p < world; ++p) {
          const std::vector<float16> v = make_input<float16>(ReduceOp::max, p, per_rank).to_vector<float16>();
          want.insert(want.end(), v.begin(), v.end());
        }
        CHECK(gathered[size_t(r)].to_vector<float16>() == want);
      }
    }
  }
}
