#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <thread>

#include "tinyddp/comm/launch/failure_report.h"
#include "tinyddp/comm/nccl/nccl_api.h"
#include "tinyddp/comm/store/barrier.h"
#include "tinyddp/comm/store/rendezvous.h"
#include "tinyddp/comm/store/tcp_store.h"
#include "tinyddp/core/cuda_runtime.h"
#include "tinyddp/core/error.h"
#include "tinyddp/kernels/ops.h"
#include "tinyddp/nn/data/distributed_sampler.h"
#include "tinyddp/nn/train/addons/multi_device.h"
#include "tinyddp/nn/train/addons/spawned_workers.h"
#include "tinyddp/nn/train/addons/state_manager.h"

namespace tinyddp::nn {

namespace {

// The spawner tells its workers where rank 0 should leave its final state; its presence is also
// what marks a process as a spawned worker (a launcher sets RANK but never this).
constexpr const char* kResultDirVariable = "TINYDDP_SPAWN_RESULT_DIR";
const char* const kFinalState = "final.safetensors";
const char* const kBestWeights = "best_weights.safetensors";

std::string random_hex(int bytes) {
  static const char digits[] = "0123456789abcdef";
  std::random_device device;
  std::string text;
  for (int i = 0; i < bytes; ++i) {
    unsigned byte = device() & 0xffu;
    text += digits[byte >> 4];
    text += digits[byte & 15u];
  }
  return text;
}

std::string join(const std::vector<Device>& devices) {
  std::string out;
  for (const Device& d : devices) out += (out.empty() ? "" : ", ") + d.str();
  return out;
}

// The job's store, hosted by the spawner for the whole run: on the requested port when it is free,
// else on one the system picks. Hosting it here (not in rank 0) means there is no moment between
// "this port is free" and "rank 0 binds it" for another program to take the port.
std::unique_ptr<comm::TcpStore> host_store(const std::string& init_method, const std::string& token) {
  comm::InitMethod method = comm::InitMethod::parse(init_method);
  std::string host = method.kind == comm::InitMethod::Kind::tcp ? method.host : "127.0.0.1";
  int port = method.kind == comm::InitMethod::Kind::tcp ? method.port : 0;
  comm::TcpStoreOptions options;
  options.token = token;
  options.timeout = std::chrono::seconds(30);
  if (port != 0) {
    try {
      return std::make_unique<comm::TcpStore>(host, port, true, options);
    } catch (const Error&) {
      // Taken (another job, or the previous run's socket in TIME_WAIT): use a free one instead.
    }
  }
  return std::make_unique<comm::TcpStore>(host, 0, true, options);
}

// A private temporary directory, removed with everything in it when the last handle goes.
std::shared_ptr<const std::string> make_result_dir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "tinyddp_spawn_XXXXXX").string();
  TINYDDP_CHECK(mkdtemp(pattern.data()) != nullptr, "MultiDevice: cannot create a temporary directory from ",
                pattern, ": ", std::strerror(errno), "; hint: set TMPDIR to a writable directory");
  return std::shared_ptr<const std::string>(new std::string(pattern), [](const std::string* dir) {
    std::error_code ignored;
    std::filesystem::remove_all(*dir, ignored);
    delete dir;
  });
}

std::string failure_key(int rank) { return "tinyddp/multi-device/failure/" + std::to_string(rank); }

int64_t wall_clock_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Of the workers that failed on their own, the one that started it, and its message. A worker that
// ended without reporting (a crash, a signal, an exit() in user code) cannot have been knocked over by
// a peer's error, which would have been reported: it is the root cause. Otherwise the earliest report
// wins -- the others failed afterwards, because it had gone.
std::pair<WorkerEnd, std::string> root_cause(const std::vector<WorkerEnd>& failures, comm::TcpStore& store) {
  std::optional<std::pair<int64_t, size_t>> earliest;
  std::vector<std::string> messages(failures.size());
  for (size_t i = 0; i < failures.size(); ++i) {
    if (failures[i].timed_out) return {failures[i], ""};
    std::string key = failure_key(failures[i].rank);
    bool reported = false;
    try {
      reported = store.check({key});
      if (reported) messages[i] = store.get(key);
    } catch (...) {
    }
    if (!reported) return {failures[i], ""};
    size_t space = messages[i].find(' ');
    int64_t when = std::atoll(messages[i].substr(0, space).c_str());
    messages[i] = space == std::string::npos ? std::string() : messages[i].substr(space + 1);
    if (!earliest || when < earliest->first) earliest = {when, i};
  }
  return {failures[earliest->second], messages[earliest->second]};
}

}  // namespace

const char* process_role_name(ProcessRole role) {
  switch (role) {
    case ProcessRole::single: return "single process";
    case ProcessRole::spawner: return "spawner";
    case ProcessRole::spawned_worker: return "spawned worker";
    case ProcessRole::launched_worker: return "launched worker";
  }
  return "?";
}

ProcessRole detect_process_role(size_t device_count) {
  const char* result_dir = std::getenv(kResultDirVariable);
  if (result_dir && *result_dir) return ProcessRole::spawned_worker;
  comm::LaunchEnvironment env = comm::read_launch_environment();
  // RANK and WORLD_SIZE, or a launcher's own variables for more than one task (a single-task srun
  // allocation still sets SLURM_PROCID, and should not stop us from spawning).
  bool launched = env.world_size > 1 || (std::getenv("RANK") && std::getenv("WORLD_SIZE"));
  if (launched) return ProcessRole::launched_worker;
  return device_count > 1 ? ProcessRole::spawner : ProcessRole::single;
}

std::vector<Device> all_devices(int cpu_workers) {
  TINYDDP_CHECK(cpu_workers >= 1, "all_devices: cpu_workers is ", cpu_workers, "; hint: ask for at least one worker");
  std::vector<Device> devices;
  for (int i = 0; i < cuda_device_count(); ++i) devices.push_back(Device::cuda(i));
  if (devices.empty()) devices.assign(size_t(cpu_workers), Device::cpu());
  return devices;
}

std::vector<std::string> this_program_command() {
  std::error_code error;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
  TINYDDP_CHECK(!error, "MultiDevice: cannot read /proc/self/exe: ", error.message(),
                "; hint: spawning workers needs Linux's /proc; start the ranks with tinyddp-run instead");
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> command{exe.string()};
  // NUL-separated; the first entry is argv[0], replaced by the real path (argv[0] may be a bare name
  // that was found on PATH, or anything at all).
  size_t start = raw.find('\0');
  while (start != std::string::npos && start + 1 < raw.size()) {
    size_t end = raw.find('\0', start + 1);
    command.push_back(raw.substr(start + 1, end == std::string::npos ? std::string::npos : end - start - 1));
    start = end;
  }
  return command;
}

namespace multi_device {

int launched_rank() { return comm::read_launch_environment().rank; }

JoinedJob join_job(const std::vector<Device>& devices, const MultiDeviceOptions& options) {
  const bool spawned = std::getenv(kResultDirVariable) != nullptr;  // the spawner's variables say it all
  comm::Rendezvous joined = comm::rendezvous(spawned ? "env://" : options.launched_init_method);
  JoinedJob job;
  job.rank = joined.rank;
  job.world_size = joined.world_size;
  job.local_rank = joined.local_rank;
  job.local_world_size = joined.local_world_size;
  std::string backend = options.backend;
  if (backend.empty()) backend = !devices.empty() && devices[0].is_cuda() && comm::nccl_available() ? "nccl" : "ring";
  // One device per local rank (core/device.h says how a shorter list is read), made this thread's
  // current device before anything touches CUDA: a CUDA call on a thread with no device set would
  // create a context on cuda:0, another rank's GPU.
  job.device = device_for_local_rank(devices, job.local_rank, job.local_world_size, cuda_device_count(), backend == "nccl");
  require_device(job.device);
  if (job.device.is_cuda()) cuda_set_device(job.device.index);
  if (const char* dir = std::getenv(kResultDirVariable)) job.result_dir = dir;

  if (job.device.is_cpu()) {
    // Data parallelism on CPU cores: each rank gets its share of the cores for its BLAS, so N ranks
    // do not oversubscribe the machine N times over.
    unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    kernels::set_cpu_threads(std::max(1, int(cores) / std::max(1, job.local_world_size)));
  }
  // The group is built for this rank's device: NCCL's communicator and its tensors must agree.
  comm::ProcessGroupOptions group_options;
  if (job.device.is_cuda()) group_options.device = job.device.index;
  job.group = comm::create_process_group(backend, joined.store, job.rank, job.world_size, group_options);
  job.store = joined.tcp_store;
  job.job_store = joined.store;
  return job;
}

void leave_job(const JoinedJob& job) {
  if (!job.job_store) return;
  comm::StoreBarrier(*job.job_store, job.rank, job.world_size, "multi-device/leave").arrive_and_wait();
}

void report_failure(const JoinedJob& job, const std::string& message) {
  // Under torchrun: its error file, naming the rank that failed first (comm/launch/failure_report.h).
  comm::report_failure_to_launcher(job.job_store.get(), job.rank, message);
  if (job.result_dir.empty() || !job.store) return;
  try {
    job.store->set(failure_key(job.rank), std::to_string(wall_clock_us()) + " " + message);
  } catch (...) {
    // The store is gone too: the spawner will go by exit statuses alone.
  }
}

std::shared_ptr<const std::string> spawn_workers(const std::vector<Device>& devices, const MultiDeviceOptions& options) {
  std::string token = random_hex(16);
  std::unique_ptr<comm::TcpStore> store = host_store(options.init_method, token);
  auto result_dir = make_result_dir();

  const int world = int(devices.size());
  std::vector<SpawnedWorkers::Environment> environments;
  for (int rank = 0; rank < world; ++rank)
    environments.push_back({
        {"RANK", std::to_string(rank)},
        {"LOCAL_RANK", std::to_string(rank)},
        {"WORLD_SIZE", std::to_string(world)},
        {"LOCAL_WORLD_SIZE", std::to_string(world)},
        {"MASTER_ADDR", store->host()},
        {"MASTER_PORT", std::to_string(store->port())},
        {"TINYDDP_LAUNCHER_STORE", "1"},  // the store is ours: rank 0 connects like everyone else
        {"TINYDDP_TOKEN", token},
        {"TINYDDP_RUN_ID", "multi-device"},
        {"TINYDDP_RESTART_COUNT", "0"},
        {kResultDirVariable, *result_dir},
    });
  std::vector<std::string> command = options.worker_command.empty() ? this_program_command() : options.worker_command;

  SpawnedWorkers workers(command, environments);
  std::vector<WorkerEnd> failures = workers.wait(options.timeout, options.grace);
  if (!failures.empty()) {
    auto [root, message] = root_cause(failures, *store);
    std::string what = "MultiDevice: " + root.describe() + " while training on " + std::to_string(world) +
                       " devices (" + join(devices) + "); the other workers were stopped";
    if (root.timed_out) TINYDDP_FAIL(what, "; hint: raise multi_device_options().timeout, or look for a rank stuck above");
    if (message.empty()) TINYDDP_FAIL(what, "; hint: the worker's own output is above");
    // The worker's own message ends with its own hint, which is the one that helps.
    bool has_hint = message.find("; hint: ") != std::string::npos;
    TINYDDP_FAIL(what, ". Rank ", root.rank, "'s error: ", message, has_hint ? "" : "; hint: the worker's own output is above");
  }
  TINYDDP_CHECK(checkpoint_exists(*result_dir + "/" + kFinalState), "MultiDevice: every worker exited with 0, but rank 0 left no ",
                kFinalState, "; hint: the worker program must call run() on the same trainer type as this one");
  return result_dir;
}

std::unique_ptr<DataLoader> shard_loader(DataLoader& loader, int rank, int world_size) {
  if (dynamic_cast<DistributedSampler*>(&loader.sampler())) return nullptr;
  bool known = dynamic_cast<SequentialSampler*>(&loader.sampler()) || dynamic_cast<RandomSampler*>(&loader.sampler());
  TINYDDP_CHECK(known, "MultiDevice: the loader has a custom sampler, which cannot be split among ranks automatically",
                "; hint: give the loader a DistributedSampler for this rank yourself");
  DataLoaderOptions options = loader.options();
  DistributedSamplerOptions sharding{.shuffle = options.shuffle, .seed = options.seed, .drop_last = false};
  options.shuffle = false;  // the sampler decides the order now
  auto sampler = std::make_shared<DistributedSampler>(loader.dataset().size(), world_size, rank, sharding);
  // The new loader shares the caller's dataset without owning it: the caller's loader keeps it alive
  // for as long as run() uses this one (an aliasing shared_ptr with no owner).
  std::shared_ptr<const Dataset> dataset(std::shared_ptr<const Dataset>(), &loader.dataset());
  return std::make_unique<DataLoader>(dataset, options, sampler);
}

int64_t batches_per_rank(DataLoader& loader, int world_size) {
  std::unique_ptr<DataLoader> share = shard_loader(loader, 0, world_size);
  return share ? share->size() : loader.size();
}

void save_result(const std::string& dir, Trainer& trainer) {
  save_training_state(dir + "/" + kFinalState, trainer);
  if (!trainer.best_weights().empty()) save_safetensors(dir + "/" + kBestWeights, trainer.best_weights());
}

void load_result(const std::string& dir, Trainer& trainer) {
  load_training_state(dir + "/" + kFinalState, trainer);
  std::string best = dir + "/" + kBestWeights;
  if (checkpoint_exists(best)) trainer.set_best_weights(load_model_tensors(best, trainer.model()));
}

void all_reduce_sum(comm::ProcessGroup& group, Device device, std::vector<double>& values) {
  if (values.empty()) return;
  Tensor sums = Tensor::from_vector(values).to(device);
  group.all_reduce(sums, comm::ReduceOp::sum)->wait();
  values = sums.to_vector<double>();
}

}  // namespace multi_device
}  // namespace tinyddp::nn
