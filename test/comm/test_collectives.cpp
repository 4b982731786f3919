// Every collective x dtype (f32, f64, bf16, f16, i32, i64) x op x world size 1-4 x awkward counts, over both
// transports, with threads acting as ranks. Results are checked against a plain loop over every rank's input
// (test_collectives_support.h), never against the library itself.
#include <doctest/doctest.h>

#include <sstream>

#include "tinyddp/comm/host_backend.h"
#include "test/comm/test_collectives_support.h"

using namespace tinyddp;
using namespace tinyddp::comm;
using tinyddp::testing::make_groups;
using tinyddp::testing::make_input;
using tinyddp::testing::reference_reduce;
using tinyddp::testing::run_ranks;

namespace {

constexpr ReduceOp kOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min, ReduceOp::prod};
// 0, 1, odd, not divisible by 2, 3 or 4, and two sizes above the small-message crossover (the ring).
constexpr int64_t kCounts[] = {0, 1, 7, 13, 1001, 20011, 100003};

ProcessGroupOptions options_for(const std::string& transport) {
  ProcessGroupOptions options;
  options.transport = transport;
  options.timeout = std::chrono::seconds(30);
  options.group_name = "matrix-" + transport;
  return options;
}

// Collects the first few mismatches of one rank as text (assertions stay on the main thread).
struct Failures {
  std::vector<std::string> lines;
  size_t compared = 0;  // elements checked, so a test that silently checks nothing fails
  template <typename T>
  void compare(const std::string& what, const std::vector<T>& got, const std::vector<T>& want) {
    compared += want.size();
    if (got.size() != want.size()) {
      lines.push_back(what + ": " + std::to_string(got.size()) + " values, expected " + std::to_string(want.size()));
      return;
    }
    for (size_t i = 0; i < got.size(); ++i) {
      if (!(got[i] == want[i])) {
        std::ostringstream line;
        line << what << "[" << i << "] = " << got[i] << ", expected " << want[i];
        lines.push_back(line.str());
        return;
      }
    }
  }
};

template <typename T>
void check_reductions(ProcessGroup& pg, Failures& failures) {
  const int r = pg.rank(), world = pg.size();
  for (ReduceOp op : kOps) {
    for (int64_t count : kCounts) {
      std::string where = std::string(dtype_name(dtype_of<T>())) + " " + reduce_op_name(op) + " x" +
                          std::to_string(count) + " world " + std::to_string(world) + " rank " + std::to_string(r);
      auto want = reference_reduce<T>(op, world, count);

      Tensor t = make_input<T>(op, r, count);
      pg.all_reduce(t, op)->wait();
      failures.compare("all_reduce " + where, t.to_vector<T>(), want);

      Tensor in = make_input<T>(op, r, count), out = Tensor::zeros({count}, dtype_of<T>());
      pg.all_reduce_into(out, in, op)->wait();
      failures.compare("all_reduce_into " + where, out.to_vector<T>(), want);
      failures.compare("all_reduce_into input untouched " + where, in.to_vector<T>(),
                       make_input<T>(op, r, count).template to_vector<T>());

      // reduce_scatter: every rank contributes world parts of `count`; part k of the reference
      // is the reduction of every rank's part k.
      Tensor big = make_input<T>(op, r, count * world), part = Tensor::zeros({count}, dtype_of<T>());
      pg.reduce_scatter(part, big, op)->wait();
      auto whole = reference_reduce<T>(op, world, count * world);
      failures.compare("reduce_scatter " + where, part.to_vector<T>(),
                       std::vector<T>(whole.begin() + r * count, whole.begin() + (r + 1) * count));
    }
  }
  for (int64_t count : kCounts) {
    std::string where = std::string(dtype_name(dtype_of<T>())) + " x" + std::to_string(count) + " world " +
                        std::to_string(world) + " rank " + std::to_string(r);
    Tensor mine = make_input<T>(ReduceOp::max, r, count), gathered = Tensor::zeros({count * world}, dtype_of<T>());
    pg.all_gather(gathered, mine)->wait();
    std::vector<T> want;
    for (int p = 0; p < world; ++p) {
      auto v = make_input<T>(ReduceOp::max, p, count).template to_vector<T>();
      want.insert(want.end(), v.begin(), v.end());
    }
    failures.compare("all_gather " + where, gathered.to_vector<T>(), want);

    for (int root = 0; root < world; ++root) {
      Tensor b = make_input<T>(ReduceOp::max, r, count);
      pg.broadcast(b, root)->wait();
      failures.compare("broadcast root " + std::to_string(root) + " " + where, b.to_vector<T>(),
                       make_input<T>(ReduceOp::max, root, count).template to_vector<T>());
    }
  }
}

void run_matrix(const std::string& transport, int world) {
  auto groups = make_groups(world, options_for(transport));
  std::vector<Failures> failures(static_cast<size_t>(world));
  run_ranks(world, [&](int r) {
    ProcessGroup& pg = *groups[size_t(r)];
    check_reductions<float>(pg, failures[size_t(r)]);
    check_reductions<double>(pg, failures[size_t(r)]);
    check_reductions<int32_t>(pg, failures[size_t(r)]);
    check_reductions<int64_t>(pg, failures[size_t(r)]);
    // The inputs are small integers whose every partial sum, product, maximum and average is exact in
    // bf16 and f16 too, so the 16-bit results must equal the reference exactly as well.
    check_reductions<bfloat16>(pg, failures[size_t(r)]);
    check_reductions<float16>(pg, failures[size_t(r)]);
    pg.barrier()->wait();
  });
  for (auto& f : failures) {
    CHECK(f.compared > 100000);
    for (auto& line : f.lines) FAIL_CHECK(line);
  }
}

}  // namespace

TEST_CASE("every collective, dtype, op and awkward count agrees with the reference loop") {
  for (std::string transport : {"shm", "tcp"}) {
    for (int world = 1; world <= 4; ++world) {
      CAPTURE(transport);
      CAPTURE(world);
      run_matrix(transport, world);
    }
  }
}

TEST_CASE("a 64 MiB all-reduce is exact over each transport") {
  const int world = 2;
  const int64_t count = int64_t(64) << 18;  // 64 MiB of f32
  for (std::string transport : {"shm", "tcp"}) {
    CAPTURE(transport);
    auto groups = make_groups(world, options_for(transport));
    std::vector<std::string> errors(world);
    run_ranks(world, [&](int r) {
      // Values whose sum is exact in f32: i mod 1024 on rank 0, 2*(i mod 1024)+1 on rank 1.
      std::vector<float> values(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) values[size_t(i)] = float(r == 0 ? i % 1024 : 2 * (i % 1024) + 1);
      Tensor t = Tensor::from_vector(values);
      groups[size_t(r)]->all_reduce(t)->wait();
      const float* p = t.data<float>();
      for (int64_t i = 0; i < count; ++i) {
        if (p[i] != float(3 * (i % 1024) + 1)) {
          errors[size_t(r)] = "rank " + std::to_string(r) + " element " + std::to_string(i) + " = " +
                              std::to_string(p[i]);
          break;
        }
      }
    });
    for (auto& e : errors) CHECK_MESSAGE(e.empty(), e);
  }
}

TEST_CASE("tcp: copies straight into the caller's buffer (posted receives) mix with inbox bytes and stay exact") {
  // Over tcp the receiver thread puts a large copy region (an all-gather's or a broadcast's, the
  // all-gather half of an all-reduce) straight into place once it is posted, while the bytes that
  // arrived before the post wait in its inbox. An all-reduce posts its all-gather half ahead, while
  // it still reduces. Sizes from 1 to 10 MiB, with small collectives in between so the posts start
  // at every kind of position (after an odd number of words, f64 elements straddle the inbox's end
  // in the reduction before a posted region), every element checked.
  auto groups = make_groups(2, options_for("tcp"));
  std::vector<std::string> errors(2);
  run_ranks(2, [&](int r) {
    ProcessGroup& pg = *groups[size_t(r)];
    std::string& error = errors[size_t(r)];
    for (int round = 0; round < 48 && error.empty(); ++round) {
      const int64_t count = (int64_t(1) << 18) + int64_t(round % 12) * 200003;  // 1 MiB and up, f32
      std::vector<float> mine(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) mine[size_t(i)] = float((i * 7 + round) % 1000 + 1000 * r);
      Tensor gathered = Tensor::empty({2 * count}, DType::f32);
      pg.all_gather(gathered, Tensor::from_vector(mine))->wait();
      Tensor sum = Tensor::from_vector(mine);
      pg.all_reduce(sum)->wait();
      std::vector<double> wide(mine.begin(), mine.end());
      Tensor wide_sum = Tensor::from_vector(wide);
      pg.all_reduce(wide_sum)->wait();
      Tensor cast = Tensor::from_vector(mine);
      pg.broadcast(cast, round % 2)->wait();
      Tensor small = Tensor::from_vector(std::vector<int32_t>(size_t(round % 5 + 1), r));
      pg.all_reduce(small)->wait();  // moves the stream by an odd number of words
      for (int64_t i = 0; i < count && error.empty(); ++i) {
        const float base = float((i * 7 + round) % 1000);
        if (gathered.data<float>()[i] != base || gathered.data<float>()[count + i] != base + 1000.f)
          error = "all_gather round " + std::to_string(round) + " element " + std::to_string(i);
        else if (sum.data<float>()[i] != 2 * base + 1000.f)
          error = "all_reduce round " + std::to_string(round) + " element " + std::to_string(i);
        else if (wide_sum.data<double>()[i] != 2.0 * base + 1000.0)
          error = "f64 all_reduce round " + std::to_string(round) + " element " + std::to_string(i);
        else if (cast.data<float>()[i] != base + 1000.f * float(round % 2))
          error = "broadcast round " + std::to_string(round) + " element " + std::to_string(i);
      }
    }
  });
  for (auto& e : errors) CHECK_MESSAGE(e.empty(), e);
}

TEST_CASE("the auto transport uses shared memory between threads of one host") {
  auto groups = make_groups(2, options_for("auto"));
  auto* ring = dynamic_cast<HostBackend*>(groups[0].get());
  REQUIRE(ring != nullptr);
  CHECK(ring->transport_to(1) == "shm");
  CHECK(ring->transport_to(0) == "self");
}
