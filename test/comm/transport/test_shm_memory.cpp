// Shared memory that grows with the peers a rank talks to, not with the square of the world size:
// a ring maps one fifo per direction it uses, the small-message exchange maps small windows, a
// peer's fifo is set up from either side first without a wait, and a job too large for the host is
// refused, with the numbers, before anything is mapped or spawned.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include "tinyddp/comm/store/hash_store.h"
#include "tinyddp/comm/transport/shm_budget.h"
#include "tinyddp/comm/transport/shm_transport.h"
#include "tinyddp/comm/tuning.h"
#include "tinyddp/core/error.h"
#include "test/comm/helpers/child_process.h"
#include "test/comm/test_collectives_support.h"
#include "test/test_support.h"

using namespace tinyddp;
using namespace tinyddp::comm;
using namespace std::chrono_literals;
using tinyddp::testing::finish_child;
using tinyddp::testing::make_input;
using tinyddp::testing::reference_reduce;
using tinyddp::testing::run_ranks;
using tinyddp::testing::spawn_program;

namespace {

// The fifo segments this process has mapped, as the kernel lists them: name -> bytes. Every rank of
// these tests is a thread of this process, so a fifo mapped by both its ends is listed twice under
// one name.
std::map<std::string, size_t> mapped_fifos(const std::map<std::string, size_t>& before = {}) {
  std::map<std::string, size_t> fifos;
  std::ifstream maps("/proc/self/maps");
  const std::regex fifo(R"(([0-9a-f]+)-([0-9a-f]+) .* /dev/shm/(tinyddp-[0-9a-f]+-\d+to\d+-\d+))");
  std::string line;
  std::smatch m;
  while (std::getline(maps, line))
    if (std::regex_search(line, m, fifo))
      if (!before.count(m[3].str()))
        fifos[m[3].str()] = size_t(std::stoull(m[2].str(), nullptr, 16) - std::stoull(m[1].str(), nullptr, 16));
  return fifos;
}

// The fifos themselves are what these tests look at: ordinary tensors stay on them instead of going
// through the slots (slot_all_reduce.h), the staging (staged_all_reduce.h) or process_vm_readv.
std::vector<std::shared_ptr<ProcessGroup>> shm_groups(int world, const std::string& name) {
  tinyddp::testing::ScopedEnv no_cross_memory("TINYDDP_CROSS_MEMORY", "0");
  tinyddp::testing::ScopedEnv no_slots("TINYDDP_SLOTS", "0");
  tinyddp::testing::ScopedEnv no_staging("TINYDDP_STAGING", "0");
  ProcessGroupOptions o;
  o.transport = "shm";
  o.group_name = name;
  o.timeout = 30s;
  o.shm_fifo_bytes = 1 << 20;
  return tinyddp::testing::make_groups(world, o);
}

void all_reduce_everywhere(std::vector<std::shared_ptr<ProcessGroup>>& groups, int64_t count) {
  const int world = int(groups.size());
  std::vector<std::string> failures(static_cast<size_t>(world), std::string());
  run_ranks(world, [&](int r) {
    Tensor t = make_input<float>(ReduceOp::sum, r, count);
    groups[size_t(r)]->all_reduce(t)->wait();
    if (t.to_vector<float>() != reference_reduce<float>(ReduceOp::sum, world, count)) failures[size_t(r)] = "differs";
  });
  for (int r = 0; r < world; ++r)
    CHECK_MESSAGE(failures[size_t(r)].empty(), "rank ", r, " x", count, " ", failures[size_t(r)]);
}

}  // namespace

TEST_CASE("shm: a group maps no fifo before it talks, the ring one per direction, the small exchange windows") {
  constexpr int kWorld = 6;
  const auto before = mapped_fifos();  // other tests' groups, if any are still up
  auto groups = shm_groups(kWorld, "lazy-fifos");
  CHECK(mapped_fifos(before).empty());

  // A large all-reduce takes the ring: rank r sends only to r+1, so 6 fifos of the full size.
  all_reduce_everywhere(groups, 300000);
  auto fifos = mapped_fifos(before);
  CHECK(fifos.size() == size_t(kWorld));
  for (int r = 0; r < kWorld; ++r) {
    const std::string direction = "-" + std::to_string(r) + "to" + std::to_string((r + 1) % kWorld) + "-";
    bool found = false;
    for (auto& [name, bytes] : fifos)
      if (name.find(direction) != std::string::npos) {
        found = true;
        CHECK(bytes == 4096 + (size_t(1) << 20));
      }
    CHECK_MESSAGE(found, "no fifo ", direction);
  }

  // A small one takes the direct exchange: every rank sends to every other, through windows to
  // those that are not its ring neighbours.
  all_reduce_everywhere(groups, 100);
  fifos = mapped_fifos(before);
  CHECK(fifos.size() == size_t(kWorld * (kWorld - 1)));
  size_t windows = 0;
  for (auto& [name, bytes] : fifos) windows += bytes == 4096 + tuning::kShmWindowFifoBytes ? 1 : 0;
  CHECK(windows == size_t(kWorld * (kWorld - 3)));  // all but the two neighbours of each rank

  groups.clear();
  CHECK(mapped_fifos(before).empty());
}

TEST_CASE("shm: a peer's fifo is set up from either side first, in any order, with no wait") {
  // Rank 0 sends to rank 3 before rank 3 has asked for the connection, and rank 3 sends to rank 1
  // while rank 1 looks at nobody: neither side blocks, and the bytes arrive once the other side looks.
  auto store = std::make_shared<HashStore>();
  const std::vector<int> local = {0, 1, 2, 3};
  std::vector<std::unique_ptr<ShmTransport>> t(4);
  run_ranks(4, [&](int r) { t[size_t(r)] = std::make_unique<ShmTransport>(*store, "any-order/", r, local, 20s); });
  const std::string hello = "from 0", reply = "from 3";
  CHECK(t[0]->connection(3)->try_send(hello.data(), hello.size(), 1) == hello.size());
  CHECK(t[3]->connection(1)->try_send(reply.data(), reply.size(), 1) == reply.size());
  std::string got(hello.size(), '?');
  CHECK(t[3]->connection(0)->try_recv(got.data(), got.size()) == got.size());
  CHECK(got == hello);
  got.assign(reply.size(), '?');
  CHECK(t[1]->connection(3)->try_recv(got.data(), got.size()) == got.size());
  CHECK(got == reply);
  // Fifos exist only where bytes went; rank 2 was never reached.
  CHECK(t[0]->fifo_counts().created == 1);
  CHECK(t[3]->fifo_counts().created == 1);
  CHECK(t[3]->fifo_counts().mapped == 1);
  CHECK(t[2]->fifo_counts().created == 0);
  CHECK(t[2]->connection(2) == nullptr);
  CHECK(t[2]->connection(7) == nullptr);
}

TEST_CASE("shm budget: the estimate is the closed form, and a job that does not fit is told why") {
  const size_t mib = size_t(1) << 20, page = 4096, window = tuning::kShmWindowFifoBytes;
  // Two ranks: one fifo each way. Three: both peers are neighbours. 64: two fifos and 61 windows.
  CHECK(shm_bytes_per_rank(1, mib) == 0);
  CHECK(shm_bytes_per_rank(2, mib) == mib + page);
  CHECK(shm_bytes_per_rank(3, mib) == 2 * (mib + page));
  CHECK(shm_bytes_per_rank(64, mib) == 2 * (mib + page) + 61 * (window + page));
  CHECK(shm_bytes_per_rank(64, 16 * page) == 63 * (16 * page + page));  // a fifo smaller than the window
  const JobEstimate job = estimate_job(64, mib, 16 * mib);
  CHECK(job.shm_bytes == 64 * shm_bytes_per_rank(64, mib));
  CHECK(job.ram_bytes == 64 * 16 * mib + job.shm_bytes);

  HostCapacity roomy{size_t(8) << 30, size_t(16) << 30, 2};
  CHECK(job_does_not_fit(job, roomy).empty());
  HostCapacity small_shm{64 * mib, size_t(16) << 30, 2};
  const std::string why = job_does_not_fit(job, small_shm);
  CHECK(why.find("64 workers on 2 core(s)") != std::string::npos);
  CHECK(why.find("/dev/shm") != std::string::npos);
  CHECK(why.find("(64 MiB free there)") != std::string::npos);
  CHECK(why.find("--shm-size") != std::string::npos);
  HostCapacity small_ram{size_t(8) << 30, 512 * mib, 2};
  CHECK(job_does_not_fit(job, small_ram).find("MemAvailable: 512 MiB") != std::string::npos);
}

TEST_CASE("shm: a transport whose ranks cannot fit the host is refused before it maps anything") {
  std::vector<int> local(100000);
  for (int r = 0; r < int(local.size()); ++r) local[size_t(r)] = r;
  HashStore store;
  CHECK_THROWS_WITH_AS(ShmTransport(store, "too-many/", 0, local, 1s), doctest::Contains("100000 workers on"), Error);
  CHECK(store.num_keys() == 0);  // it never got as far as the store
}

TEST_CASE("tinyddp-run: a job that cannot fit the host is refused before any worker starts") {
  const std::string run = std::string(TINYDDP_BIN_DIR) + "/tinyddp-run";
  const auto marker = std::filesystem::temp_directory_path() / ("tinyddp-refused-" + std::to_string(::getpid()));
  std::filesystem::remove(marker);
  // The most workers -n accepts: their fifos alone would need about 1 TiB of /dev/shm.
  auto outcome = finish_child(spawn_program({run, "-n", "4096", "--", "/bin/sh", "-c", "touch " + marker.string()}),
                              30s);
  CHECK(outcome.exit_code == 1);
  CHECK_MESSAGE(outcome.report.find("tinyddp-run: 4096 workers on ") != std::string::npos, outcome.report);
  CHECK_MESSAGE(outcome.report.find("MemAvailable") != std::string::npos, outcome.report);
  CHECK_FALSE(std::filesystem::exists(marker));
}
