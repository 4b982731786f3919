// MultiDevice: spawning workers by re-executing this test binary (each worker runs only the test case
// that spawned it), the spawner ending with rank 0's final state, epoch means over every rank's
// share, a crashing or throwing worker naming its rank, no orphans; and the pieces underneath:
// SpawnedWorkers on plain shell commands, role detection, loader sharding.
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tinyddp/nn/data/distributed_sampler.h"
#include "tinyddp/nn/train/addons/multi_device.h"
#include "tinyddp/nn/train/addons/spawned_workers.h"
#include "tinyddp/nn/train/checkpoint.h"
#include "test/nn/train/test_trainer_support.h"
#include "test/test_skip.h"

using namespace tinyddp;
using namespace tinyddp::testing;
using namespace std::chrono_literals;

namespace {

using Spawning = nn::WithAddOns<MlpTrainer, nn::MultiDevice>;

// Where the spawning test case and its workers exchange files: set by the spawner, inherited by the workers.
constexpr const char* kExchangeVariable = "TINYDDP_TEST_EXCHANGE_DIR";

bool in_spawned_worker() { return nn::detect_process_role(2) == nn::ProcessRole::spawned_worker; }

// Workers run this binary again, but only the named test case (doctest's filter), not the whole suite.
// Workers that are meant to fail report to /dev/null: the spawner's error is what the test checks,
// and doctest's "test case CRASHED" from a worker stopped on purpose would only mislead a reader.
void configure_workers(nn::MultiDeviceOptions& options, const std::string& test_case, bool quiet = false) {
  options.worker_command = {nn::this_program_command()[0], "--test-case=" + test_case, "--no-intro=true"};
  if (quiet) options.worker_command.push_back("--out=/dev/null");
  options.timeout = 120s;  // the job's bound: a hung worker fails the test instead of hanging it
  options.grace = 2s;
}

// The spawner's side of the exchange directory; the workers only read the variable.
struct Exchange {
  std::optional<TempDir> dir;
  Exchange() {
    if (in_spawned_worker()) return;
    dir.emplace();
    ::setenv(kExchangeVariable, dir->path.c_str(), 1);
  }
  ~Exchange() {
    if (dir) ::unsetenv(kExchangeVariable);
  }
  static std::string file(const std::string& name) { return std::string(std::getenv(kExchangeVariable)) + "/" + name; }
};

bool no_child_processes_left() {
  int status = 0;
  return waitpid(-1, &status, WNOHANG) == -1 && errno == ECHILD;
}

nn::DataLoader loader_for(int64_t n, uint64_t seed, bool shuffle) {
  return nn::DataLoader(three_class_data(n, seed), {.batch_size = 10, .shuffle = shuffle, .seed = 5});
}

}  // namespace

TEST_CASE("MultiDevice spawns 2 CPU workers and the spawner ends with rank 0's final weights") {
  Exchange exchange;
  Setup s(7, 1e-2);
  nn::DataLoader loader = loader_for(100, 11, true);
  Spawning trainer(*s.model, std::vector<Device>(2, Device::cpu()), *s.optimizer, s.scheduler.get(),
                   {.log_bar = false});
  configure_workers(trainer.multi_device_options(),
                    "MultiDevice spawns 2 CPU workers and the spawner ends with rank 0's final weights");
  std::vector<float> initial = flat_weights(*s.model);
  trainer.run(3, loader);

  if (in_spawned_worker()) {
    CHECK(trainer.role() == nn::ProcessRole::spawned_worker);
    CHECK_FALSE(trainer.is_main_process());
    CHECK(trainer.world_size() == 2);
    // Each rank leaves its own final weights and its epoch losses for the spawner to compare.
    nn::save_model(Exchange::file("rank" + std::to_string(trainer.rank()) + ".safetensors"), trainer.model());
    std::ofstream out(Exchange::file("rank" + std::to_string(trainer.rank()) + ".losses"));
    out.precision(17);
    for (const nn::EpochRecord& r : trainer.history()) out << r.train.at("loss") << "\n";
    return;
  }

  CHECK(trainer.role() == nn::ProcessRole::spawner);
  CHECK(trainer.is_main_process());
  CHECK(no_child_processes_left());
  // The spawner's model now holds rank 0's final weights -- and DDP kept both replicas identical.
  for (int rank : {0, 1}) {
    Setup other(1000 + rank);
    nn::load_model(Exchange::file("rank" + std::to_string(rank) + ".safetensors"), *other.model);
    CHECK_MESSAGE(flat_weights(*other.model) == flat_weights(*s.model), "rank ", rank);
  }
  CHECK(flat_weights(*s.model) != initial);
  // And the rest of rank 0's state: optimizer, scheduler, history.
  CHECK(trainer.epochs_done() == 3);
  CHECK(trainer.global_step() == 3 * 5);  // 100 samples, 50 per rank, batches of 10
  CHECK(s.optimizer->step_count() == 3 * 5);
  CHECK(s.scheduler->last_step() == 3);
  REQUIRE(trainer.history().size() == 3);
  CHECK(trainer.best_epoch().has_value());
  CHECK(trainer.best_weights().size() == 4);
  // Epoch means are over every rank's samples: both ranks logged the same numbers.
  for (int rank : {0, 1}) {
    std::ifstream in(Exchange::file("rank" + std::to_string(rank) + ".losses"));
    for (const nn::EpochRecord& r : trainer.history()) {
      double loss = 0;
      REQUIRE(static_cast<bool>(in >> loss));
      CHECK(loss == doctest::Approx(r.train.at("loss")).epsilon(1e-12));
    }
  }
}

TEST_CASE("MultiDevice epoch means cover both ranks' halves: with lr 0 they equal the loss over the whole set") {
  Exchange exchange;
  Setup s(3, /*lr=*/0.0);
  // On a grid where the forward pass is exact (exact_forward), in the spawner and in each worker: the
  // ranks' batches of 10 and the whole set give every row the same logits, and so the same loss.
  exact_forward(*s.model);
  nn::DataLoader loader = nn::DataLoader(three_class_data(100, 21, true),
                                         {.batch_size = 10, .shuffle = false, .seed = 5});
  Spawning trainer(*s.model, std::vector<Device>(2, Device::cpu()), *s.optimizer, nullptr, {.log_bar = false});
  configure_workers(
      trainer.multi_device_options(),
      "MultiDevice epoch means cover both ranks' halves: with lr 0 they equal the loss over the whole set");
  trainer.run(1, loader);
  if (in_spawned_worker()) return;

  nn::CrossEntropyLoss loss_fn;
  auto data = three_class_data(100, 21, true);
  double whole = loss_fn.evaluate(s.model->forward(data->features()), data->targets());
  REQUIRE(trainer.history().size() == 1);
  // The row losses being equal, only the means round differently: each batch's mean is rounded to
  // float once (relative error <= u = 2^-24), and so is the whole set's; the sums (on each rank and
  // across them) and divisions in double add at most about a hundred times 2^-53 = u / 2^29 more. The
  // weighted mean of the batch means is the whole mean L: they differ by at most 2u L plus those.
  CHECK(std::fabs(trainer.history()[0].train.at("loss") - whole) <= 3 * 0x1p-24 * std::fabs(whole));
}

TEST_CASE("MultiDevice uses a free port when the init_method's port is taken") {
  // Hold tcp://localhost:12355 (the seed's default) on every loopback address, as another job would.
  std::vector<int> holders;
  if (!in_spawned_worker()) {
    for (int family : {AF_INET, AF_INET6}) {
      int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) continue;
      int one = 1;
      if (family == AF_INET6) ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
      sockaddr_storage address{};
      socklen_t length = 0;
      if (family == AF_INET) {
        auto* a = reinterpret_cast<sockaddr_in*>(&address);
        a->sin_family = AF_INET;
        a->sin_port = htons(12355);
        a->sin_addr.s_addr = htonl(INADDR_ANY);
        length = sizeof *a;
      } else {
        auto* a = reinterpret_cast<sockaddr_in6*>(&address);
        a->sin6_family = AF_INET6;
        a->sin6_port = htons(12355);
        a->sin6_addr = in6addr_any;
        length = sizeof *a;
      }
      if (::bind(fd, reinterpret_cast<sockaddr*>(&address), length) == 0 && ::listen(fd, 1) == 0)
        holders.push_back(fd);
      else
        ::close(fd);
    }
  }
  Setup s;
  nn::DataLoader loader = loader_for(40, 11, false);
  Spawning trainer(*s.model, std::vector<Device>(2, Device::cpu()), *s.optimizer, nullptr, {.log_bar = false});
  CHECK(trainer.multi_device_options().init_method == "tcp://localhost:12355");
  configure_workers(trainer.multi_device_options(),
                    "MultiDevice uses a free port when the init_method's port is taken");
  trainer.run(1, loader);
  for (int fd : holders) ::close(fd);
  if (in_spawned_worker()) return;
  CHECK(trainer.epochs_done() == 1);
}

TEST_CASE("MultiDevice a worker that crashes makes run fail naming its rank and no worker is left") {
  class CrashingTrainer : public MlpTrainer {
   public:
    using MlpTrainer::MlpTrainer;
    nn::StepOutput train_step(const nn::Batch& batch) override {
      if (rank() == 1 && global_step() == 2) std::_Exit(7);  // dies mid-epoch, without a word
      return MlpTrainer::train_step(batch);
    }
  };
  using Crashing = nn::WithAddOns<CrashingTrainer, nn::MultiDevice>;
  Setup s;
  nn::DataLoader loader = loader_for(100, 11, true);
  Crashing trainer(*s.model, std::vector<Device>(2, Device::cpu()), *s.optimizer, nullptr, {.log_bar = false});
  configure_workers(trainer.multi_device_options(),
                    "MultiDevice a worker that crashes makes run fail naming its rank and no worker is left", true);
  if (in_spawned_worker()) {
    // Rank 0 fails too (its all-reduce loses its peer); leave quietly, the spawner tells the story.
    try {
      trainer.run(3, loader);
    } catch (...) {
      std::_Exit(3);
    }
    return;
  }
  std::string error;
  try {
    trainer.run(3, loader);
  } catch (const Error& e) {
    error = e.what();
  }
  MESSAGE(error);
  CHECK(error.find("rank 1 (pid ") != std::string::npos);
  CHECK(error.find("exited with code 7") != std::string::npos);
  CHECK(error.find("the other workers were stopped") != std::string::npos);
  CHECK(no_child_processes_left());
  CHECK(trainer.epochs_done() == 0);  // nothing was loaded back
}

TEST_CASE("MultiDevice a worker that throws is named with its own error message") {
  class ThrowingTrainer : public MlpTrainer {
   public:
    using MlpTrainer::MlpTrainer;
    nn::StepOutput train_step(const nn::Batch& batch) override {
      if (rank() == 1 && global_step() == 3) TINYDDP_FAIL("injected failure in train_step", hint("none"));
      return MlpTrainer::train_step(batch);
    }
  };
  using Throwing = nn::WithAddOns<ThrowingTrainer, nn::MultiDevice>;
  Setup s;
  nn::DataLoader loader = loader_for(100, 11, true);
  Throwing trainer(*s.model, std::vector<Device>(2, Device::cpu()), *s.optimizer, nullptr, {.log_bar = false});
  configure_workers(trainer.multi_device_options(),
                    "MultiDevice a worker that throws is named with its own error message", true);
  if (in_spawned_worker()) {
    try {
      trainer.run(3, loader);
    } catch (...) {
      std::_Exit(3);
    }
    return;
  }
  std::string error;
  try {
    trainer.run(3, loader);
  } catch (const Error& e) {
    error = e.what();
  }
  MESSAGE(error);
  // Rank 0 fails as well, later, because rank 1 is gone: the earlier report is the root cause.
  CHECK(error.find("rank 1 (pid ") != std::string::npos);
  CHECK(error.find("injected failure in train_step") != std::string::npos);
  CHECK(no_child_processes_left());
}

TEST_CASE("SpawnedWorkers: all succeed; a failure stops the rest; signals, timeouts and bad programs are reported") {
  const std::vector<std::string> sh = {"/bin/sh", "-c", "eval \"$WORKER_SCRIPT\""};
  using Env = nn::SpawnedWorkers::Environment;
  {
    nn::SpawnedWorkers workers(sh, {Env{{"WORKER_SCRIPT", "exit 0"}},
                                    Env{{"WORKER_SCRIPT", "test \"$RANK_ENV\" = x"}, {"RANK_ENV", "x"}}});
    CHECK(workers.wait(20s).empty());
  }
  {
    // Rank 0 would sleep for a minute; rank 1 fails at once and rank 0 is stopped, well within 20 s.
    nn::SpawnedWorkers workers(sh, {Env{{"WORKER_SCRIPT", "exec sleep 60"}}, Env{{"WORKER_SCRIPT", "exit 3"}}});
    std::vector<nn::WorkerEnd> failures = workers.wait(20s, 2s);
    REQUIRE(failures.size() == 1);
    CHECK(failures[0].rank == 1);
    CHECK(failures[0].exit_code == 3);
    CHECK_FALSE(failures[0].timed_out);
    CHECK(failures[0].describe().find("rank 1 (pid " + std::to_string(workers.pids()[1]) + ") exited with code 3") ==
          0);
    for (pid_t pid : workers.pids()) CHECK((kill(pid, 0) == -1 && errno == ESRCH));
  }
  {
    nn::SpawnedWorkers workers(sh, {Env{{"WORKER_SCRIPT", "kill -SEGV $$"}}});
    std::vector<nn::WorkerEnd> failures = workers.wait(20s);
    REQUIRE(failures.size() == 1);
    CHECK(failures[0].signal == SIGSEGV);
    CHECK(failures[0].describe().find("killed by signal 11") != std::string::npos);
  }
  {
    // A worker that ignores SIGTERM is killed after the grace period.
    nn::SpawnedWorkers workers(sh, {Env{{"WORKER_SCRIPT", "trap '' TERM; while :; do sleep 0.1; done"}}});
    std::vector<nn::WorkerEnd> failures = workers.wait(300ms, 300ms);
    REQUIRE(failures.size() == 1);
    CHECK(failures[0].timed_out);
    CHECK(failures[0].describe().find("still running when the time limit passed") != std::string::npos);
    CHECK(kill(workers.pids()[0], 0) == -1);
  }
  CHECK_THROWS_WITH(nn::SpawnedWorkers({"/nonexistent/program"}, {Env{}}),
                    doctest::Contains("cannot execute /nonexistent/program: No such file or directory"));
  CHECK(no_child_processes_left() == true);
}

namespace {

// Each of `n` spawned workers' allowed CPUs, by rank, as the worker's own /proc/self/status says.
std::vector<std::set<int>> spawned_cpus(int n, bool bind_cpus) {
  TempDir dir;
  const std::vector<std::string> sh = {"/bin/sh", "-c", "grep Cpus_allowed_list /proc/self/status > \"$OUT\""};
  std::vector<nn::SpawnedWorkers::Environment> environments;
  for (int rank = 0; rank < n; ++rank)
    environments.push_back({{"OUT", (dir.path / ("rank" + std::to_string(rank))).string()}});
  nn::SpawnedWorkers workers(sh, environments, bind_cpus);
  REQUIRE(workers.wait(20s).empty());
  std::vector<std::set<int>> cpus;
  for (int rank = 0; rank < n; ++rank) {
    std::ifstream in(dir.path / ("rank" + std::to_string(rank)));
    std::string line;
    REQUIRE(std::getline(in, line));
    cpus.push_back(cpu_list(line.substr(line.find('\t') + 1)));
  }
  return cpus;
}

}  // namespace

TEST_CASE("SpawnedWorkers bind each worker to its own share of the CPUs, as tinyddp-run does; unbound, all of them") {
  cpu_set_t mine;
  REQUIRE(sched_getaffinity(0, sizeof mine, &mine) == 0);
  std::set<int> allowed;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &mine)) allowed.insert(c);
  for (const std::set<int>& cpus : spawned_cpus(2, false)) CHECK(cpus == allowed);
  if (allowed.size() < 2) TINYDDP_SKIP("one CPU: nothing to share out");
  // Shares: not empty, disjoint and in rank order, and all of them together.
  std::vector<std::set<int>> shares = spawned_cpus(2, true);
  std::set<int> all;
  for (const std::set<int>& cpus : shares) {
    CHECK_FALSE(cpus.empty());
    all.insert(cpus.begin(), cpus.end());
  }
  CHECK(all == allowed);
  CHECK(*shares[0].rbegin() < *shares[1].begin());
  // More workers than CPUs: nothing is bound.
  for (const std::set<int>& cpus : spawned_cpus(int(allowed.size()) + 1, true)) CHECK(cpus == allowed);
}

TEST_CASE("the process role comes from the environment: spawned, launched, spawner or single") {
  if (in_spawned_worker() || std::getenv("RANK") || std::getenv("WORLD_SIZE")) {
    TINYDDP_SKIP("this process was itself started with launcher variables");
  }
  CHECK(nn::detect_process_role(1) == nn::ProcessRole::single);
  CHECK(nn::detect_process_role(2) == nn::ProcessRole::spawner);
  ::setenv("RANK", "1", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  CHECK(nn::detect_process_role(2) == nn::ProcessRole::launched_worker);
  CHECK(nn::detect_process_role(1) == nn::ProcessRole::launched_worker);
  CHECK(nn::multi_device::launched_rank() == 1);
  ::setenv("TINYDDP_SPAWN_RESULT_DIR", "/tmp", 1);
  CHECK(nn::detect_process_role(2) == nn::ProcessRole::spawned_worker);
  ::unsetenv("TINYDDP_SPAWN_RESULT_DIR");
  ::unsetenv("RANK");
  ::unsetenv("WORLD_SIZE");
  CHECK(nn::detect_process_role(2) == nn::ProcessRole::spawner);
  CHECK(std::string(nn::process_role_name(nn::ProcessRole::launched_worker)) == "launched worker");

  std::vector<Device> devices = nn::all_devices(3);
  REQUIRE_FALSE(devices.empty());
  if (devices[0].is_cpu()) CHECK(devices == std::vector<Device>(3, Device::cpu()));
  std::vector<std::string> command = nn::this_program_command();
  REQUIRE(command.size() >= 1);
  CHECK(command[0] == std::filesystem::read_symlink("/proc/self/exe").string());
}

TEST_CASE("shard_loader deals the loader's samples out among ranks: rank r gets r, r+W, ...") {
  auto dataset = three_class_data(10, 1);
  nn::DataLoader plain(dataset, {.batch_size = 2});
  std::vector<int64_t> seen;
  for (int rank = 0; rank < 3; ++rank) {
    auto shard = nn::multi_device::shard_loader(plain, rank, 3);
    REQUIRE(shard != nullptr);
    auto* sampler = dynamic_cast<nn::DistributedSampler*>(&shard->sampler());
    REQUIRE(sampler != nullptr);
    CHECK_FALSE(sampler->options().shuffle);
    CHECK(shard->size() == 2);  // ceil(10 / 3) = 4 samples, batches of 2
    CHECK(sampler->indices() == std::vector<int64_t>{rank, rank + 3, rank + 6, (rank + 9) % 10});
  }
  nn::DataLoader shuffled(dataset, {.batch_size = 2, .shuffle = true, .seed = 9});
  auto shard = nn::multi_device::shard_loader(shuffled, 1, 2);
  auto* sampler = dynamic_cast<nn::DistributedSampler*>(&shard->sampler());
  REQUIRE(sampler != nullptr);
  CHECK(sampler->options().shuffle);
  CHECK(sampler->options().seed == 9);
  // A loader that already deals out its samples is used as it is.
  nn::DataLoader already(dataset, {.batch_size = 2}, std::make_shared<nn::DistributedSampler>(10, 2, 0));
  CHECK(nn::multi_device::shard_loader(already, 0, 2) == nullptr);
}

// ---- what a user's program sees of the job, from the spawner ----

namespace {

// A user's trainer with a member of its own (batches it trained on), handed on as its extra state.
class CountingClassifier : public MlpTrainer {
 public:
  using MlpTrainer::MlpTrainer;
  int64_t batches_seen = 0;
  nn::StepOutput train_step(const nn::Batch& batch) override {
    ++batches_seen;
    return MlpTrainer::train_step(batch);
  }
  Metadata get_extra_state() const override { return {{"batches_seen", std::to_string(batches_seen)}}; }
  void set_extra_state(const Metadata& state) override { batches_seen = std::stoll(state.at("batches_seen")); }
};

}  // namespace

TEST_CASE("MultiDevice refuses a per-batch cosine sized over the whole loader, before any worker starts") {
  Setup s;
  nn::DataLoader loader = loader_for(100, 11, true);  // 10 batches; 5 on each of 2 ranks
  // What a PyTorch user writes: epochs * len(loader). Each rank steps it 3 * 5 times only.
  nn::CosineAnnealing schedule(*s.optimizer, 3 * loader.size());
  Spawning trainer(*s.model, std::vector<Device>(2, Device::cpu()), *s.optimizer, &schedule,
                   {.log_bar = false, .scheduler_step_on_batch = true});
  configure_workers(trainer.multi_device_options(), "no worker may start");
  CHECK_THROWS_WITH_AS(trainer.run(3, loader),
                       doctest::Contains("has total_iters 30 but this run steps it 15 times (3 epochs of 5 batches: "
                                         "each of the 2 ranks trains on its own share of the loader), so the learning "
                                         "rate would end at 0.005 instead of 0"),
                       Error);
  CHECK_THROWS_WITH_AS(trainer.run(3, loader), doctest::Contains("nn::length_of_run"), Error);
  CHECK(no_child_processes_left());
}

TEST_CASE(
    "MultiDevice: a length_of_run schedule ends at 0 and the spawner gets world_size and the trainer's own state") {
  Setup s;
  nn::DataLoader loader = loader_for(100, 11, true);
  nn::CosineAnnealing schedule(*s.optimizer, nn::length_of_run);
  nn::WithAddOns<CountingClassifier, nn::MultiDevice> trainer(*s.model, std::vector<Device>(2, Device::cpu()),
                                                              *s.optimizer, &schedule,
                                                              {.log_bar = false, .scheduler_step_on_batch = true});
  configure_workers(
      trainer.multi_device_options(),
      "MultiDevice: a length_of_run schedule ends at 0 and the spawner gets world_size and the trainer's own state");
  trainer.run(3, loader);
  if (in_spawned_worker()) return;

  CHECK(trainer.world_size() == 2);
  CHECK(trainer.rank() == 0);
  CHECK(schedule.total_iters() == 3 * 5);
  CHECK(schedule.last_step() == 3 * 5);
  CHECK(s.optimizer->lr() == 0.0);
  CHECK(trainer.batches_seen == 3 * 5);  // rank 0's count, carried back; the spawner trained nothing
}
