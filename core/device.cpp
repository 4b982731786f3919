#include "tinyddp/core/device.h"

#include <algorithm>
#include <cctype>

#include "tinyddp/core/env.h"
#include "tinyddp/core/error.h"

namespace tinyddp {

Device Device::parse(const std::string& text) {
  if (text == "cpu") return cpu();
  if (text == "cuda" || text == "gpu") return cuda(0);
  for (const std::string prefix : {"cuda:", "gpu:"}) {
    if (text.rfind(prefix, 0) != 0) continue;
    std::string digits = text.substr(prefix.size());
    bool numeric = !digits.empty() && digits.size() < 6;
    for (char c : digits) numeric = numeric && std::isdigit(static_cast<unsigned char>(c));
    TINYDDP_CHECK(numeric, "bad device \"", text, "\": the part after \"", prefix, "\" must be a device number",
                  hint("write cuda:0"));
    return cuda(std::stoi(digits));
  }
  TINYDDP_FAIL("unknown device \"", text, "\"", hint("use cpu, cuda or cuda:N"));
}

std::string Device::str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }

namespace {
std::string list(const std::vector<Device>& devices) {
  std::string out;
  for (const Device& d : devices) out += (out.empty() ? "" : ", ") + d.str();
  return out;
}
}  // namespace

Device device_for_local_rank(const std::vector<Device>& devices, int local_rank, int local_world_size,
                             int visible_cuda_devices, bool one_gpu_per_rank, bool visible_devices_restricted) {
  TINYDDP_CHECK(!devices.empty(), "no devices were given for the job's ranks",
                hint("pass the GPUs to use, or CPU devices"));
  TINYDDP_CHECK(local_rank >= 0 && local_rank < std::max(local_world_size, 1), "local rank ", local_rank, " of ",
                local_world_size, " on this host is impossible",
                hint("the launcher must set LOCAL_RANK below LOCAL_WORLD_SIZE"));
  const bool cuda = devices[0].is_cuda();
  for (const Device& d : devices)
    TINYDDP_CHECK(d.is_cuda() == cuda, "the devices ", list(devices), " mix the CPU and GPUs",
                  hint("give one kind: every ", "rank of a job computes on the same kind of device"));
  if (size_t(local_rank) < devices.size()) return devices[size_t(local_rank)];
  const Device shared = devices[size_t(local_rank) % devices.size()];
  if (!cuda) return shared;
  // Fewer visible devices than ranks on this host, with CUDA_VISIBLE_DEVICES set: the launcher split
  // the GPUs among the processes. Without it, the host has fewer GPUs than ranks.
  if (visible_cuda_devices < local_world_size && visible_devices_restricted) return shared;
  TINYDDP_CHECK(!one_gpu_per_rank, "local rank ", local_rank, " has no GPU of its own: the job lists ", devices.size(),
                " device(s) (", list(devices), ") for ", local_world_size, " ranks on this host, which shows ",
                visible_cuda_devices, " GPU(s), and the nccl backend needs one GPU per rank",
                hint("start at most ", std::min<int>(int(devices.size()), visible_cuda_devices),
                     " ranks per host (tinyddp-run -n), give each rank its own GPU with CUDA_VISIBLE_DEVICES, "
                     "or use the host backend"));
  return shared;
}

int default_cuda_device(int local_rank, int rank, int visible_cuda_devices, bool visible_devices_restricted) {
  TINYDDP_CHECK(visible_cuda_devices > 0, "no CUDA device is visible to choose from",
                hint("check CUDA_VISIBLE_DEVICES"));
  const int index = local_rank >= 0 ? local_rank : rank;
  if (index < visible_cuda_devices) return index;
  if (visible_cuda_devices == 1 && visible_devices_restricted) return 0;
  TINYDDP_FAIL(local_rank >= 0 ? "local rank " : "rank ", index, " has no CUDA device of its own: this process sees ",
               visible_cuda_devices, " (cuda:0 to cuda:", visible_cuda_devices - 1, ")",
               local_rank >= 0 ? "" : " and no LOCAL_RANK was set",
               visible_devices_restricted ? "" : ", CUDA_VISIBLE_DEVICES is not set to give each rank its own",
               ", and two ranks on one GPU is what NCCL refuses",
               hint("start at most ", visible_cuda_devices, " ranks per host (tinyddp-run -n ", visible_cuda_devices,
                    "), pass the device (ProcessGroupOptions::device), or set LOCAL_RANK"));
}

bool cuda_visible_devices_restricted() { return env::text("CUDA_VISIBLE_DEVICES").has_value(); }

}  // namespace tinyddp
