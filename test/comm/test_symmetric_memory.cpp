// Symmetric memory (comm/symmetric/): tensors every rank of a host maps, and the all-reduce that
// reads the peers' data where it lies (comm/algorithms/symmetric_all_reduce.h).
//
// The results are checked against the reference loop and, bit for bit, against the FIFO path on
// ordinary tensors (a second implementation that folds in the same order). The faults run as real
// processes: a rank SIGKILLed while its peers map its memory must be named by them, never fault them.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>
#include <type_traits>

#include "tinyddp/comm/host_backend.h"
#include "tinyddp/comm/store/tcp_store.h"
#include "test/comm/helpers/forked_ranks.h"
#include "test/comm/test_collectives_support.h"

using namespace tinyddp;
using namespace tinyddp::comm;
using namespace tinyddp::testing;
using namespace std::chrono_literals;

namespace {

ProcessGroupOptions shm_options(const std::string& name, std::chrono::milliseconds timeout = 30s) {
  ProcessGroupOptions options;
  options.transport = "shm";
  options.group_name = name;
  options.timeout = timeout;
  return options;
}

uint64_t symmetric_collectives(ProcessGroup& pg) { return dynamic_cast<HostBackend&>(pg).symmetric_collectives(); }

// This process's mappings of symmetric parts (/proc/self/maps names a memfd "/memfd:NAME (deleted)").
int symmetric_mappings() {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);)
    if (line.find("memfd:tinyddp-symmetric-") != std::string::npos) ++n;
  return n;
}

// Names in /dev/shm that symmetric memory could have left (it must never make any).
int symmetric_names_in_dev_shm() {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm"))
    if (entry.path().filename().string().find("sym") != std::string::npos) ++n;
  return n;
}

// What each of two ranks' groups (named `name`) said when body(rank, group) threw ("" if it did not).
std::vector<std::string> errors_of(const std::string& name, const std::function<void(int, ProcessGroup&)>& body) {
  auto groups = make_groups(2, shm_options(name));
  std::vector<std::string> errors(2);
  run_ranks(2, [&](int r) {
    try {
      body(r, *groups[size_t(r)]);
    } catch (const Error& e) {
      errors[size_t(r)] = e.what();
    }
  });
  return errors;
}

template <typename T>
void fill(Tensor& t, ReduceOp op, int rank) {
  T* p = t.data<T>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = T(input_value(op, rank, i));
}

// Every rank all-reduces `count` elements in symmetric memory and in an ordinary tensor (the FIFO
// path); both must equal the reference loop (not for the 16-bit floats, which round at every step
// of the ring: there the FIFO path is the reference), and each other bit for bit.
template <typename T>
void check_against_fifo(int world, int64_t count, ReduceOp op) {
  constexpr bool has_reference = !std::is_same_v<T, bfloat16> && !std::is_same_v<T, float16>;
  auto groups = make_groups(world, shm_options("sym-" + std::to_string(world) + "-" + std::to_string(count)));
  run_ranks(world, [&](int r) {
    ProcessGroup& pg = *groups[size_t(r)];
    Tensor sym = pg.allocate_symmetric({count}, dtype_of<T>());
    REQUIRE(pg.is_symmetric(sym));
    Tensor plain = Tensor::empty({count}, dtype_of<T>());
    CHECK_FALSE(pg.is_symmetric(plain));
    for (int round = 0; round < 2; ++round) {  // the second reuses the buffer: the counters move on
      fill<T>(sym, op, r);
      fill<T>(plain, op, r);
      pg.all_reduce(sym, op)->wait();
      pg.all_reduce(plain, op)->wait();
      if constexpr (has_reference) CHECK(sym.to_vector<T>() == reference_reduce<T>(op, world, count));
      CHECK(bitwise_equal(sym, plain));
    }
    CHECK(symmetric_collectives(pg) == 2);
  });
}

}  // namespace

TEST_CASE("an all-reduce on symmetric memory equals the reference and, bit for bit, the FIFO path") {
  for (int world : {2, 3, 4})
    for (int64_t count : {int64_t(1), int64_t(5), int64_t(1000), int64_t(300001)}) {  // one-shot and two-shot
      CAPTURE(world);
      CAPTURE(count);
      check_against_fifo<float>(world, count, ReduceOp::sum);
    }
  for (int world : {2, 3, 4}) {
    CAPTURE(world);
    check_against_fifo<float>(world, 100003, ReduceOp::avg);
    check_against_fifo<bfloat16>(world, 100003, ReduceOp::sum);
    check_against_fifo<float16>(world, 100003, ReduceOp::avg);
  }
  check_against_fifo<double>(4, 70001, ReduceOp::prod);
  check_against_fifo<int64_t>(3, 50000, ReduceOp::max);
  check_against_fifo<int32_t>(2, 9, ReduceOp::min);
}

TEST_CASE("float sums of many ranks on symmetric memory fold in the ring's order") {
  // Values whose sum depends on the order of the additions: bitwise equality with the FIFO ring
  // (above, for small integers) holds here only if the fold order is the same.
  const int world = 4;
  const int64_t count = 200000;
  auto groups = make_groups(world, shm_options("sym-order"));
  run_ranks(world, [&](int r) {
    ProcessGroup& pg = *groups[size_t(r)];
    Tensor sym = pg.allocate_symmetric({count});
    Tensor plain = Tensor::empty({count});
    for (int64_t i = 0; i < count; ++i)
      sym.data<float>()[i] = plain.data<float>()[i] = float(1.0 + 1e-7 * double((i * 7919 + r * 104729) % 1000003)) *
                                                      (r % 2 ? 1e4f : 1e-3f);
    pg.all_reduce(sym)->wait();
    pg.all_reduce(plain)->wait();
    CHECK(bitwise_equal(sym, plain));
  });
}

namespace {

// A store through which ranks report the host identity of host r / per_host: threads of one process
// then form a group of several hosts, shared memory inside each and TCP across, as on a cluster.
class HostsStore : public HashStore {
 public:
  explicit HostsStore(int per_host) : per_host_(per_host) { set_timeout(30s); }
  void set(const std::string& key, const std::string& value) override {
    const size_t at = key.rfind("/host/");
    const bool identity = at != std::string::npos && key.find('/', at + 6) == std::string::npos;
    HashStore::set(key,
                   identity ? value + "-host-" + std::to_string(std::stoi(key.substr(at + 6)) / per_host_) : value);
  }

 private:
  int per_host_;
};

}  // namespace

TEST_CASE("across hosts, the hierarchical all-reduce on symmetric memory equals, bit for bit, its FIFO version") {
  // Its in-host phases read and write the peers' parts in place; the FIFO version (ordinary tensors)
  // runs a ring reduce-scatter and all-gather over the fifos. The same parts, folded in the same order,
  // and the same cross-host step: the same bits, with floats whose sum depends on the order.
  for (auto [hosts, per_host] : {std::pair{2, 2}, std::pair{2, 3}}) {
    const int world = hosts * per_host;
    CAPTURE(hosts);
    CAPTURE(per_host);
    auto store = std::make_shared<HostsStore>(per_host);
    ProcessGroupOptions options;
    options.transport = "auto";
    options.algorithm = "hier";
    options.group_name = "sym-hier-" + std::to_string(per_host);
    std::vector<std::shared_ptr<ProcessGroup>> groups(static_cast<size_t>(world));
    run_ranks(world, [&](int r) { groups[size_t(r)] = create_process_group("host", store, r, world, options); });
    run_ranks(world, [&](int r) {
      ProcessGroup& pg = *groups[size_t(r)];
      uint64_t calls = 0;
      // 1 and 5 elements: parts of padding only; 100003: several blocks, the last part short.
      for (int64_t count : {int64_t(1), int64_t(5), int64_t(1000), int64_t(100003)}) {
        CAPTURE(count);
        Tensor sym = pg.allocate_symmetric({count});
        REQUIRE(pg.is_symmetric(sym));
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
          CAPTURE(reduce_op_name(op));
          fill<float>(sym, op, r);
          Tensor plain = sym.clone();
          pg.all_reduce(sym, op)->wait();
          pg.all_reduce(plain, op)->wait();
          ++calls;
          CHECK(sym.to_vector<float>() == reference_reduce<float>(op, world, count));
          CHECK(bitwise_equal(sym, plain));
        }
        Tensor plain = order_sensitive_input(r, count);
        sym.copy_from(plain);
        pg.all_reduce(sym)->wait();
        pg.all_reduce(plain)->wait();
        ++calls;
        CHECK(bitwise_equal(sym, plain));
      }
      Tensor half = pg.allocate_symmetric({4097}, DType::bf16);
      fill<bfloat16>(half, ReduceOp::sum, r);
      Tensor plain = half.clone();
      pg.all_reduce(half)->wait();
      pg.all_reduce(plain)->wait();
      CHECK(bitwise_equal(half, plain));
      CHECK(symmetric_collectives(pg) == calls + 1);
    });
  }
}

TEST_CASE("reduce-scatter from and all-gather into symmetric memory equal, bit for bit, the FIFO ring") {
  // ZeRO's pattern: the gradients reduce-scattered out of a symmetric staging buffer into a shard of
  // ordinary memory, the weights all-gathered from each rank's own part into every rank's buffer.
  for (int world : {2, 3, 4}) {
    CAPTURE(world);
    auto groups = make_groups(world, shm_options("sym-scatter-gather-" + std::to_string(world)));
    run_ranks(world, [&](int r) {
      ProcessGroup& pg = *groups[size_t(r)];
      uint64_t calls = 0;
      for (int64_t count : {int64_t(1), int64_t(5), int64_t(1000), int64_t(70001)}) {
        CAPTURE(count);
        Tensor sym = pg.allocate_symmetric({count * world});
        REQUIRE(pg.is_symmetric(sym));
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
          CAPTURE(reduce_op_name(op));
          fill<float>(sym, op, r);
          Tensor plain = sym.clone(), sym_out = Tensor::empty({count}), plain_out = Tensor::empty({count});
          pg.reduce_scatter(sym_out, sym, op)->wait();
          pg.reduce_scatter(plain_out, plain, op)->wait();
          ++calls;
          CHECK(bitwise_equal(sym_out, plain_out));
          CHECK(bitwise_equal(sym, plain));  // the input is left as it was
        }
        // Floats whose sum depends on the order of the additions.
        Tensor plain = order_sensitive_input(r, count * world);
        sym.copy_from(plain);
        Tensor sym_out = Tensor::empty({count}), plain_out = Tensor::empty({count});
        pg.reduce_scatter(sym_out, sym)->wait();
        pg.reduce_scatter(plain_out, plain)->wait();
        ++calls;
        CHECK(bitwise_equal(sym_out, plain_out));
        // In place: each rank's part of the output is its input.
        Tensor mine = sym.view(r * count, {count});
        fill<float>(mine, ReduceOp::max, r);
        plain = sym.clone();
        pg.all_gather(sym, mine)->wait();
        pg.all_gather(plain, plain.view(r * count, {count}))->wait();
        ++calls;
        CHECK(bitwise_equal(sym, plain));
        for (int p = 0; p < world; ++p) {
          Tensor expected = Tensor::empty({count});
          fill<float>(expected, ReduceOp::max, p);
          CHECK(bitwise_equal(sym.view(p * count, {count}), expected));
        }
        // From ordinary memory.
        Tensor input = Tensor::empty({count});
        fill<float>(input, ReduceOp::sum, r);
        pg.all_gather(sym, input)->wait();
        ++calls;
        for (int p = 0; p < world; ++p) {
          Tensor expected = Tensor::empty({count});
          fill<float>(expected, ReduceOp::sum, p);
          CHECK(bitwise_equal(sym.view(p * count, {count}), expected));
        }
      }
      CHECK(symmetric_collectives(pg) == calls);
    });
  }
}

TEST_CASE("a view into symmetric memory, all_reduce_into and all_reduce_coalesced take the symmetric path") {
  const int world = 2;
  auto groups = make_groups(world, shm_options("sym-views"));
  run_ranks(world, [&](int r) {
    ProcessGroup& pg = *groups[size_t(r)];
    Tensor whole = pg.allocate_symmetric({100000});
    Tensor a = whole.view(10, {5000}), b = whole.view(50000, {40000});
    Tensor input = make_input<float>(ReduceOp::sum, r, 40000);
    fill<float>(a, ReduceOp::sum, r);
    pg.all_reduce(a)->wait();
    pg.all_reduce_into(b, input)->wait();
    CHECK(a.to_vector<float>() == reference_reduce<float>(ReduceOp::sum, world, 5000));
    CHECK(b.to_vector<float>() == reference_reduce<float>(ReduceOp::sum, world, 40000));
    fill<float>(a, ReduceOp::sum, r);
    fill<float>(b, ReduceOp::sum, r);
    pg.all_reduce_coalesced({a, b})->wait();
    CHECK(a.to_vector<float>() == reference_reduce<float>(ReduceOp::sum, world, 5000));
    CHECK(b.to_vector<float>() == reference_reduce<float>(ReduceOp::sum, world, 40000));
    CHECK(symmetric_collectives(pg) == 4);
  });
}

TEST_CASE("ranks that disagree on a symmetric allocation or call are told who differs") {
  SUBCASE("different sizes") {
    auto errors = errors_of("sym-sizes", [](int r, ProcessGroup& pg) { pg.allocate_symmetric({r == 0 ? 10 : 12}); });
    CHECK(errors[0].find("symmetric allocation #0 (40 bytes): rank 1 allocated 48 bytes where rank 0 allocated 40") !=
          std::string::npos);
    CHECK(errors[1].find("rank 0 allocated 40 bytes where rank 1 allocated 48") != std::string::npos);
  }
  // Above the slots' sizes (small all-reduces are staged through slots, where any memory will do).
  SUBCASE("different windows of the buffer") {
    auto errors = errors_of("sym-window", [](int r, ProcessGroup& pg) {
      Tensor whole = pg.allocate_symmetric({100000});
      pg.all_reduce(whole.view(r == 0 ? 0 : 4, {50000}))->wait();
    });
    // Each rank's error describes both calls: its own finding, or the first rank's, passed on as the
    // root cause when that rank aborted first (which of the two comes is a race).
    for (const std::string& error : errors) {
      INFO(error);
      CHECK(error.find("is in collective #0 on 50000 elements of f32 at byte ") != std::string::npos);
      CHECK(error.find("at byte 16") != std::string::npos);
      CHECK(error.find("at byte 0") != std::string::npos);
      CHECK(error.find("of symmetric buffer #0") != std::string::npos);
    }
  }
  SUBCASE("one rank passes symmetric memory, the other an ordinary tensor") {
    auto groups = make_groups(2, shm_options("sym-mixed"));
    std::string error;
    run_ranks(2, [&](int r) {
      Tensor sym = groups[size_t(r)]->allocate_symmetric({50000});
      try {
        // Rank 1 waits longer, so that rank 0's timeout (the one checked) comes first.
        CallOptions call;
        call.timeout = r == 0 ? 300ms : 20s;
        groups[size_t(r)]->all_reduce(r == 0 ? sym : Tensor::zeros({50000}), ReduceOp::sum, call)->wait();
      } catch (const Error& e) {
        if (r == 0) error = e.what();
      }
    });
    CHECK(error.find("timed out after 300 ms waiting for rank(s) 1 to arrive at this collective") != std::string::npos);
    CHECK(error.find("on symmetric buffer #0") != std::string::npos);
  }
}

TEST_CASE("symmetric memory leaves no name in /dev/shm and is unmapped when the group and the tensor go") {
  const int before = symmetric_mappings();
  std::vector<Tensor> kept(3);
  {
    auto groups = make_groups(3, shm_options("sym-release"));
    run_ranks(3, [&](int r) { kept[size_t(r)] = groups[size_t(r)]->allocate_symmetric({1 << 16}); });
    CHECK(symmetric_mappings() - before == 9);  // 3 ranks (threads of this process) x 3 parts
    CHECK(symmetric_names_in_dev_shm() == 0);
  }
  CHECK(symmetric_mappings() - before == 3);  // the group is gone: each tensor keeps its own part only
  for (Tensor& t : kept) {
    t.data<float>()[0] = 5.0f;  // still this rank's memory
    CHECK(t.item<float>() == 5.0f);
  }
  kept.clear();
  CHECK(symmetric_mappings() == before);
}

TEST_CASE("groups without shared memory hand out ordinary tensors from allocate_symmetric") {
  auto groups = make_groups(2, [] {
    ProcessGroupOptions o;
    o.transport = "tcp";
    o.group_name = "sym-tcp";
    return o;
  }());
  run_ranks(2, [&](int r) {
    Tensor t = groups[size_t(r)]->allocate_symmetric({1000});
    CHECK_FALSE(groups[size_t(r)]->is_symmetric(t));
    fill<float>(t, ReduceOp::sum, r);
    groups[size_t(r)]->all_reduce(t)->wait();
    CHECK(t.to_vector<float>() == reference_reduce<float>(ReduceOp::sum, 2, 1000));
  });
}

namespace {

constexpr int kWorld = 3;
constexpr int kVictim = 1;

// One rank of the fault test: all-reduces a symmetric buffer until the victim SIGKILLs itself from
// inside the loop. A survivor exits 0 when its error names the victim as dead and, after the error,
// it maps only its own part (the peers' were released); 3 otherwise; 4 when no error came.
int symmetric_rank(int rank, int port, std::string& report) {
  TcpStoreOptions store_options;
  store_options.timeout = 20s;
  auto store = std::make_shared<TcpStore>("127.0.0.1", port, false, store_options);
  auto pg = create_process_group("host", store, rank, kWorld, shm_options("sym-fault", 120s));
  Tensor t = pg->allocate_symmetric({1 << 20});
  for (int i = 0; i < 20; ++i) pg->all_reduce(t)->wait();
  if (rank == kVictim) std::raise(SIGKILL);  // after the 20th: the others are in the 21st, reading its part
  try {
    for (int i = 0; i < 100000; ++i) pg->all_reduce(t)->wait();
    return 4;
  } catch (const std::exception& e) {
    report = e.what();
    const std::string victim = "rank " + std::to_string(kVictim) + " (pid ";
    const bool named = report.find(victim) != std::string::npos && report.find(") died") != std::string::npos;
    report += "; symmetric mappings after the error: " + std::to_string(symmetric_mappings());
    return named && symmetric_mappings() == 1 ? 0 : 3;
  }
}

}  // namespace

TEST_CASE("a rank killed while its peers map its memory is named by them, and faults nobody") {
  TINYDDP_SKIP_UNDER_TSAN();  // the ranks are spawn_child lambdas: forked, no exec
  const auto outcomes = run_forked_ranks(kWorld, symmetric_rank);
  for (int r = 0; r < kWorld; ++r) {
    const ChildOutcome& outcome = outcomes[size_t(r)];
    if (r == kVictim) {
      CHECK_MESSAGE(outcome.signal == SIGKILL, "the victim: ", outcome.describe());
    } else {
      CHECK_MESSAGE(outcome.ok(), "rank ", r, ": ", outcome.describe());  // a SIGBUS would show here
    }
  }
  CHECK(symmetric_names_in_dev_shm() == 0);
}
