#include "bench/perf/perf_job.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "tinyddp/comm/host_backend.h"
#include "tinyddp/comm/launch/failure_report.h"
#include "tinyddp/comm/store/hash_store.h"
#include "tinyddp/core/cuda_runtime.h"
#include "bench/perf/algorithm_choice.h"
#include "bench/perf/perf_collective.h"
#include "bench/perf/perf_options.h"

namespace tinyddp::bench {
namespace {

std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "CPU";
}

std::string host_name() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  return host;
}

std::string join_transports(const std::set<std::string>& names) {
  std::string joined;
  for (const auto& t : names) joined += (joined.empty() ? "" : "+") + t;
  return joined.empty() ? "none" : joined;
}

// The transports this rank's group uses, joined with '+' in name order ("" alone in the world).
std::string transports_of(comm::ProcessGroup& group) {
  if (group.backend() != "host") return group.backend();
  auto* host = dynamic_cast<comm::HostBackend*>(&group);
  std::set<std::string> used;
  for (int peer = 0; host && peer < group.size(); ++peer)
    if (peer != group.rank()) used.insert(host->transport_to(peer));
  return used.empty() ? "" : join_transports(used);
}

RankInfo describe(int rank, Device device, comm::ProcessGroup& group) {
  RankInfo info;
  info.rank = rank;
  info.pid = int(::getpid());
  info.hostname = host_name();
  info.device = device.is_cuda() ? device.index : -1;
  info.device_hex = device.str();
  info.device_info = device.is_cuda() ? "CUDA device" : cpu_model();
  info.transports = transports_of(group);
  return info;
}

nlohmann::json to_json(const RankInfo& i) {
  return {{"rank", i.rank},
          {"pid", i.pid},
          {"hostname", i.hostname},
          {"device", i.device},
          {"device_hex", i.device_hex},
          {"device_info", i.device_info},
          {"transports", i.transports}};
}

RankInfo from_json(const nlohmann::json& j) {
  return {j["rank"], j["pid"], j["hostname"], j["device"], j["device_hex"], j["device_info"], j["transports"]};
}

Device pick_device(const PerfOptions& options, int local_rank) {
  const bool wants_cuda = options.device.empty() ? options.backend == "nccl" : options.device != "cpu";
  if (!wants_cuda) return Device::cpu();
  // "cuda" (or nccl's default) is the local rank's GPU; "cuda:N" is that one.
  Device device = options.device.rfind("cuda:", 0) == 0 ? Device::parse(options.device) : Device::cuda(local_rank);
  require_device(device);
  return device;
}

}  // namespace

PerfJob PerfJob::start(const PerfOptions& options, const PerfCollective& collective) {
  PerfJob job;
  // A launcher (or tcp://) gives rank and world; alone, a world of one.
  if (options.init_method != "env://" || comm::read_launch_environment().rank >= 0) {
    job.rendezvous_ = comm::rendezvous(options.init_method);
  } else {
    job.rendezvous_.store = std::make_shared<comm::HashStore>();
  }
  job.rank_ = job.rendezvous_.rank;
  job.world_ = job.rendezvous_.world_size;
  job.device_ = pick_device(options, job.rendezvous_.local_rank);

  comm::ProcessGroupOptions group_options;
  group_options.transport = options.transport;
  group_options.device = job.device_.is_cuda() ? job.device_.index : -1;
  if (options.timeout_s > 0) group_options.timeout = std::chrono::seconds(options.timeout_s);
  apply_algorithm(options.algo, options.backend, group_options);
  job.group_ = comm::create_process_group(options.backend, job.rendezvous_.store, job.rank_, job.world_, group_options);

  // Every rank's description, through the store, so that rank 0 can print and record them all.
  auto& store = *job.rendezvous_.store;
  const std::string prefix = "tinyddp-perf/" + collective.name() + "/rank/";
  store.set(prefix + std::to_string(job.rank_), to_json(describe(job.rank_, job.device_, *job.group_)).dump());
  std::vector<std::string> keys;
  for (int r = 0; r < job.world_; ++r) keys.push_back(prefix + std::to_string(r));
  store.wait(keys, group_options.timeout);
  std::set<std::string> used;
  for (const auto& text : store.multi_get(keys)) {
    job.ranks_.push_back(from_json(nlohmann::json::parse(text)));
    std::string list = job.ranks_.back().transports;
    for (size_t at = 0; at < list.size();) {
      size_t plus = std::min(list.find('+', at), list.size());
      used.insert(list.substr(at, plus - at));
      at = plus + 1;
    }
  }
  job.transport_ = join_transports(used);
  return job;
}

int PerfJob::ranks_on_this_host() const {
  int n = 0;
  for (const auto& r : ranks_) n += r.hostname == ranks_[size_t(rank_)].hostname;
  return n;
}

bool PerfJob::first_on_this_host() const {
  for (const auto& r : ranks_)
    if (r.hostname == ranks_[size_t(rank_)].hostname) return r.rank == rank_;
  return true;
}

std::vector<double> PerfJob::all_gather(const std::vector<double>& mine) {
  Tensor local = Tensor::from_vector(mine);
  if (world_ == 1) return mine;
  Tensor in = local.to(device_);
  Tensor out = Tensor::empty({int64_t(mine.size()) * world_}, DType::f64, device_);
  group_->all_gather(out, in)->wait();
  return out.to(Device::cpu()).to_vector<double>();
}

int64_t PerfJob::sum(int64_t mine) {
  Tensor t = Tensor::from_vector(std::vector<int64_t>{mine}).to(device_);
  group_->all_reduce(t, comm::ReduceOp::sum)->wait();
  return t.to(Device::cpu()).to_vector<int64_t>()[0];
}

int64_t PerfJob::max(int64_t mine) {
  Tensor t = Tensor::from_vector(std::vector<int64_t>{mine}).to(device_);
  group_->all_reduce(t, comm::ReduceOp::max)->wait();
  return t.to(Device::cpu()).to_vector<int64_t>()[0];
}

void PerfJob::barrier() { group_->barrier()->wait(); }

void PerfJob::report_failure(const std::string& message) {
  comm::report_failure_to_launcher(rendezvous_.store.get(), rank_, message);
}

}  // namespace tinyddp::bench
