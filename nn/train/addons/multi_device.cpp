#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <thread>

#include "tinyddp/comm/cpu_binding.h"
#include "tinyddp/comm/launch/failure_report.h"
#include "tinyddp/comm/store/barrier.h"
#include "tinyddp/comm/store/rendezvous.h"
#include "tinyddp/comm/store/tcp_store.h"
#include "tinyddp/core/cuda_runtime.h"
#include "tinyddp/core/env.h"
#include "tinyddp/core/error.h"
#include "tinyddp/core/log.h"
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
// else (options.port_may_move) on one the system picks. Hosting it here (not in rank 0) means there is
// no moment between "this port is free" and "rank 0 binds it" for another program to take the port.
std::unique_ptr<comm::TcpStore> host_store(const MultiDeviceOptions& multi_device, const std::string& token) {
  comm::InitMethod method = comm::InitMethod::parse(multi_device.init_method);
  std::string host = method.kind == comm::InitMethod::Kind::tcp ? method.host : "127.0.0.1";
  int port = method.kind == comm::InitMethod::Kind::tcp ? method.port : 0;
  comm::TcpStoreOptions options;
  options.token = token;
  options.timeout = std::chrono::seconds(30);
  if (port != 0) {
    try {
      return std::make_unique<comm::TcpStore>(host, port, true, options);
    } catch (const Error& e) {
      // Taken (another job, or the previous run's socket in TIME_WAIT): a default moves to a free port.
      if (!multi_device.port_may_move)
        TINYDDP_FAIL("MultiDevice: the init method ", multi_device.init_method, " cannot be used: ", e.message());
    }
  }
  return std::make_unique<comm::TcpStore>(host, 0, true, options);
}

// The spawner's temporary directories are named after its pid: tinyddp_spawn_<pid>_XXXXXX. One whose
// spawner no longer runs was left by a spawner killed with SIGKILL (which nothing can catch): removed
// here, by the next one.
constexpr const char* kResultDirPrefix = "tinyddp_spawn_";

void remove_stale_result_dirs(const std::filesystem::path& tmp) {
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(tmp, error)) {
    const std::string name = entry.path().filename().string();
    if (!name.starts_with(kResultDirPrefix)) continue;
    const std::string rest = name.substr(std::strlen(kResultDirPrefix));
    const size_t underscore = rest.find('_');
    if (underscore == std::string::npos || underscore == 0) continue;  // not a name this code made
    const pid_t pid = pid_t(std::atol(rest.substr(0, underscore).c_str()));
    if (pid <= 0 || kill(pid, 0) == 0 || errno != ESRCH) continue;  // its spawner may still run
    std::error_code ignored;
    std::filesystem::remove_all(entry.path(), ignored);
  }
}

// A private temporary directory, removed with everything in it when the last handle goes.
std::shared_ptr<const std::string> make_result_dir() {
  const std::filesystem::path tmp = std::filesystem::temp_directory_path();
  remove_stale_result_dirs(tmp);
  std::string pattern = (tmp / (std::string(kResultDirPrefix) + std::to_string(getpid()) + "_XXXXXX")).string();
  TINYDDP_CHECK(mkdtemp(pattern.data()) != nullptr, "MultiDevice: cannot create a temporary directory from ", pattern,
                ": ", std::strerror(errno), hint("set TMPDIR to a writable directory"));
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

// What one rank reported through the store before it failed: when (wall clock, us), what failed and
// its hint, stored as "<when> <problem>\x1f<hint>" (the unit separator is in no message).
struct Report {
  int64_t when_us = 0;
  std::string problem;
  std::string hint;
};
constexpr char kHintSeparator = '\x1f';

std::optional<Report> read_report(comm::TcpStore& store, int rank) {
  try {
    const std::string key = failure_key(rank);
    if (!store.check({key})) return std::nullopt;
    const std::string text = store.get(key);
    const size_t space = text.find(' ');
    const std::string message = space == std::string::npos ? "" : text.substr(space + 1);
    const size_t separator = message.find(kHintSeparator);
    return Report{std::atoll(text.substr(0, space).c_str()), message.substr(0, separator),
                  separator == std::string::npos ? "" : message.substr(separator + 1)};
  } catch (...) {
    return std::nullopt;  // the store is gone too: go by the exit statuses alone
  }
}

// Of the workers that failed on their own, the one that started it. A worker that ended without
// reporting (a crash, a signal, an exit() in user code) cannot have been knocked over by a peer's
// error, which would have been reported: it is the root cause. Otherwise the earliest report wins --
// the others failed afterwards, because it had gone.
size_t root_cause(const std::vector<WorkerEnd>& failures, const std::vector<std::optional<Report>>& reports) {
  std::optional<size_t> earliest;
  for (size_t i = 0; i < failures.size(); ++i) {
    const std::optional<Report>& report = reports[size_t(failures[i].rank)];
    if (failures[i].timed_out || !report) return i;
    if (!earliest || report->when_us < reports[size_t(failures[*earliest].rank)]->when_us) earliest = i;
  }
  return *earliest;
}

// The job's failure, said once: the root cause with its own message and hint, then one line for every
// rank that reported an error, as it reported it (so a rank that failed because its peer had gone
// is seen as that, after the cause).
std::string failure_text(const std::vector<WorkerEnd>& failures, comm::TcpStore& store,
                         const std::vector<Device>& devices) {
  std::vector<std::optional<Report>> reports;
  for (size_t rank = 0; rank < devices.size(); ++rank) reports.push_back(read_report(store, int(rank)));
  const WorkerEnd& root = failures[root_cause(failures, reports)];
  std::string text = "MultiDevice: " + root.describe() + " while training on " + std::to_string(devices.size()) +
                     " devices (" + join(devices) + "); the other workers were stopped";
  const std::optional<Report>& own = reports[size_t(root.rank)];
  if (root.timed_out) {
    text += "; hint: raise multi_device_options().timeout, or look for a rank stuck above";
  } else if (!own && root.signal == SIGKILL) {
    // SIGKILL leaves no last words: whoever sent it is outside the job.
    text +=
        "; hint: something outside the job killed it: the kernel's out-of-memory killer (dmesg | grep -i oom "
        "says) or a person or program";
  } else if (!own) {
    text += "; hint: the worker's own output is above";
  } else {
    // The worker's own hint is the one that helps.
    text += ". Rank " + std::to_string(root.rank) + "'s error: " + own->problem +
            "; hint: " + (own->hint.empty() ? "the worker's own output is above" : own->hint);
  }
  // Their hints are the root cause's, or beside the point: each line stops before its own.
  for (size_t rank = 0; rank < reports.size(); ++rank)
    if (reports[rank] && int(rank) != root.rank)
      text += "\n  then rank " + std::to_string(rank) + ": " + reports[rank]->problem;
  return text;
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
  if (env::text(kResultDirVariable)) return ProcessRole::spawned_worker;
  comm::LaunchEnvironment env = comm::read_launch_environment();
  // RANK and WORLD_SIZE, or a launcher's own variables for more than one task (a single-task srun
  // allocation still sets SLURM_PROCID, and should not stop us from spawning).
  bool launched = env.world_size > 1 || (env::text("RANK") && env::text("WORLD_SIZE"));
  if (launched) return ProcessRole::launched_worker;
  return device_count > 1 ? ProcessRole::spawner : ProcessRole::single;
}

std::vector<Device> all_devices(int cpu_workers) {
  TINYDDP_CHECK(cpu_workers >= 1, "all_devices: cpu_workers is ", cpu_workers, hint("ask for at least one worker"));
  std::vector<Device> devices;
  for (int i = 0; i < cuda_device_count(); ++i) devices.push_back(Device::cuda(i));
  if (devices.empty()) devices.assign(size_t(cpu_workers), Device::cpu());
  return devices;
}

std::vector<std::string> this_program_command() {
  std::error_code error;
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
  TINYDDP_CHECK(!error, "MultiDevice: cannot read /proc/self/exe: ", error.message(),
                hint("spawning workers needs Linux's /proc; start the ranks with tinyddp-run instead"));
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
  const bool spawned = env::text(kResultDirVariable).has_value();  // the spawner's variables say it all
  comm::Rendezvous joined = comm::rendezvous(spawned ? "env://" : options.launched_init_method);
  JoinedJob job;
  job.rank = joined.rank;
  job.world_size = joined.world_size;
  job.local_rank = joined.local_rank;
  job.local_world_size = joined.local_world_size;
  std::string backend = options.backend;
  if (backend.empty()) {
    const bool on_gpus = !devices.empty() && devices[0].is_cuda();
    const std::string nccl_problem = on_gpus ? comm::backend_unavailable_reason("nccl") : "";
    backend = on_gpus && nccl_problem.empty() ? "nccl" : "host";
    if (on_gpus && !nccl_problem.empty() && job.rank == 0)
      log_line(LogLevel::warn, "multi-device",
               "CUDA devices, but the nccl backend is unavailable (" + nccl_problem +
                   "): using the host backend, which stages CUDA tensors through host memory");
  }
  // One device per local rank (core/device.h says how a shorter list is read), made this thread's
  // current device before anything touches CUDA: a CUDA call on a thread with no device set would
  // create a context on cuda:0, another rank's GPU.
  job.device = device_for_local_rank(devices, job.local_rank, job.local_world_size, cuda_device_count(),
                                     backend == "nccl", cuda_visible_devices_restricted());
  require_device(job.device);
  if (job.device.is_cuda()) cuda_set_device(job.device.index);
  job.result_dir = env::text(kResultDirVariable).value_or("");

  if (job.device.is_cpu()) {
    // Data parallelism on CPU cores: each rank gets its share of the cores for its BLAS, so N ranks
    // do not oversubscribe the machine N times over; a rank a launcher bound to its own CPUs uses those.
    const int online = int(std::max(1u, std::thread::hardware_concurrency()));
    kernels::set_cpu_threads(comm::compute_threads(comm::allowed_cpu_count(), online, job.local_world_size));
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

void report_failure(const JoinedJob& job, const std::string& problem, const std::string& advice) {
  // Under torchrun: its error file, naming the rank that failed first (comm/launch/failure_report.h).
  const std::string message = advice.empty() ? problem : problem + "; hint: " + advice;
  comm::report_failure_to_launcher(job.job_store.get(), job.rank, message);
  if (job.result_dir.empty() || !job.store) return;
  try {
    job.store->set(failure_key(job.rank), std::to_string(wall_clock_us()) + " " + problem + kHintSeparator + advice);
  } catch (...) {
    return;  // the store is gone too: the spawner will go by exit statuses alone, and this worker's own words count
  }
  // The spawner prints this message, once, beside every other rank's: the worker's main() printing it
  // too (every example does) would say it again, once per rank. Its output so far stays as it was.
  std::fflush(stderr);
  const int null = open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (null >= 0) {
    dup2(null, STDERR_FILENO);
    close(null);
  }
}

std::shared_ptr<const std::string> spawn_workers(const std::vector<Device>& devices,
                                                 const MultiDeviceOptions& options) {
  std::string token = random_hex(16);
  StopSignals stop_signals;  // first made, last gone: a signal stops the workers, then everything below is cleaned up
  std::unique_ptr<comm::TcpStore> store = host_store(options, token);
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

  SpawnedWorkers workers(command, environments, options.bind_cpus);
  std::vector<WorkerEnd> failures = workers.wait(options.timeout, options.grace);
  if (!failures.empty()) TINYDDP_FAIL(failure_text(failures, *store, devices));
  TINYDDP_CHECK(checkpoint_exists(*result_dir + "/" + kFinalState),
                "MultiDevice: every worker exited with 0, but rank 0 left no ", kFinalState,
                hint("the worker program must call run() on the same trainer type as this one"));
  return result_dir;
}

std::unique_ptr<DataLoader> shard_loader(DataLoader& loader, int rank, int world_size) {
  if (dynamic_cast<DistributedSampler*>(&loader.sampler())) return nullptr;
  bool known = dynamic_cast<SequentialSampler*>(&loader.sampler()) || dynamic_cast<RandomSampler*>(&loader.sampler());
  TINYDDP_CHECK(known, "MultiDevice: the loader has a custom sampler, which cannot be split among ranks automatically",
                hint("give the loader a DistributedSampler for this rank yourself"));
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

void check_zero_options(const MultiDeviceOptions& options, const TrainerOptions&) {
  TINYDDP_CHECK(options.zero_stage == 0 || options.zero_stage == 1, "MultiDevice: zero_stage is ", options.zero_stage,
                hint("use 0 (plain DDP) or 1 (ZeRO-1: sharded optimizer state); stages 2 and 3 are not implemented"));
}

void check_comm_hook(const MultiDeviceOptions& options) {
  if (options.comm_hook.empty()) return;
  comm_hooks::by_name(options.comm_hook);  // throws for an unknown name, listing the valid ones
  TINYDDP_CHECK(options.zero_stage == 0 || options.comm_hook == "allreduce", "MultiDevice: comm_hook ",
                options.comm_hook, " with zero_stage ", options.zero_stage,
                ": ZeRO-1 reduces the buckets with its own hook (a "
                "reduce-scatter), and DDP takes one hook",
                hint("use zero_stage 0 with a compressing hook"));
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
