#include "test/support/fake_cuda.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "tinyddp/core/allocator.h"
#include "tinyddp/core/env.h"
#include "tinyddp/core/error.h"
#include "tinyddp/core/log.h"
#include "tinyddp/core/philox.h"

namespace tinyddp {

namespace {

constexpr size_t kAlignment = 256;  // what cudaMalloc guarantees
constexpr const char* kEnvironment = "TINYDDP_FAKE_CUDA_DEVICES";

// The calling thread's current device, per FakeCuda instance (a test may install a new one; the
// instance number tells a thread's choice for an earlier one from a choice for this one).
struct ThreadDevice {
  uint64_t owner = 0;
  int device = -1;
};
thread_local ThreadDevice t_device;
std::atomic<uint64_t> g_instances{0};

std::atomic<FakeCuda*> g_installed{nullptr};

FakeCuda* from_environment() {
  std::optional<uint64_t> count = env::unsigned_integer(kEnvironment, 1, 64);
  if (!count) return nullptr;
  const long devices = long(*count);
  return new FakeCuda({.devices = int(devices)});  // never destroyed: tensors in statics may outlive main
}

std::string thread_name() {
  const long tid = long(::syscall(SYS_gettid));
  return tid == long(::getpid()) ? "the main thread" : "thread " + std::to_string(tid);
}

struct FakeEvent {
  int device;
  std::shared_ptr<FakeEventState> state = std::make_shared<FakeEventState>();
};
struct FakeStream {
  int device;
  std::unique_ptr<FakeStreamQueue> queue;
};

}  // namespace

FakeCuda::FakeCuda(FakeCudaOptions options)
    : options_(options), instance_(++g_instances), bytes_in_use_(size_t(std::max(0, options.devices)), 0) {
  TINYDDP_CHECK(options.devices >= 1, "FakeCuda: ", options.devices, " devices", hint("ask for at least one"));
  default_streams_.resize(size_t(options.devices));
}

// A stream's thread has its stream's device as its current one, as the GPU runs a stream's work in
// that device's context.
std::unique_ptr<FakeStreamQueue> FakeCuda::make_queue(int device) {
  const uint64_t instance = instance_;
  return std::make_unique<FakeStreamQueue>(device, options_.launch_delay, [instance, device] {
    t_device = {instance, device};
  });
}

FakeStreamQueue& FakeCuda::default_stream(int device) {
  check_device(device, "the default stream");
  std::lock_guard<std::mutex> lock(streams_mutex_);
  auto& queue = default_streams_[size_t(device)];
  if (!queue) queue = make_queue(device);
  return *queue;
}

FakeStreamQueue& FakeCuda::queue_of(CudaStream stream) {
  return stream ? *static_cast<FakeStream*>(stream)->queue : default_stream(thread_device());
}

void FakeCuda::launch(CudaStream stream, std::string what, std::vector<WrittenRange> writes,
                      std::function<void()> work) {
  queue_of(stream).enqueue(std::move(what), std::move(writes), std::move(work));
}

void FakeCuda::launch_on_device(int device, std::string what, std::vector<WrittenRange> writes,
                                std::function<void()> work) {
  select(device, what + " on cuda:" + std::to_string(device));
  default_stream(device).enqueue(std::move(what), std::move(writes), std::move(work));
}

void FakeCuda::synchronize_default_stream(int device) { default_stream(device).drain(); }

FakeCuda::~FakeCuda() {
  default_streams_.clear();  // their threads finish what is queued while the memory still exists
  for (auto& [ptr, block] : blocks_) std::free(const_cast<char*>(ptr));
}

std::string FakeCuda::describe() const { return std::to_string(options_.devices) + " fake CUDA devices"; }

bool FakeCuda::thread_chose_device() const { return t_device.owner == instance_ && t_device.device >= 0; }
int FakeCuda::thread_device() const { return thread_chose_device() ? t_device.device : 0; }

void FakeCuda::check_device(int device, const char* call) const {
  TINYDDP_CHECK(device >= 0 && device < options_.devices, call, ": cuda:", device, " does not exist (", describe(), ")",
                hint("use cuda:0 to cuda:", options_.devices - 1));
}

void FakeCuda::check_range(const void* ptr, size_t bytes, int device, const char* call, const char* role) const {
  if (bytes == 0) return;
  const int found = device_of(ptr, bytes);
  TINYDDP_CHECK(found == device, call, ": the ", role, " (", bytes, " bytes at ", ptr,
                ") was passed as memory of cuda:", device, " but is ",
                found < 0 ? std::string("not device memory") : "memory of cuda:" + std::to_string(found),
                hint("a GPU would fault or corrupt memory here: pass memory of the device the call is for"));
}

void FakeCuda::touch_locked(int device, const std::string& operation) {
  if (contexts_.count(device)) return;
  if (options_.one_device_per_process && !contexts_.empty()) {
    const auto& [first, origin] = *contexts_.begin();
    TINYDDP_FAIL("fake CUDA (one device per process): this process already has a context on cuda:", first,
                 " (created by ", origin, "), and ", operation, " would create a second one on cuda:", device,
                 ". On a GPU that costs hundreds of MB of the other device's memory, and fails outright in "
                 "exclusive-process mode",
                 hint("select the rank's device on every thread before its first CUDA call, and "
                      "touch no other device"));
  }
  contexts_.emplace(device, operation + " on " + thread_name());
}

void FakeCuda::touch(int device, const std::string& operation) {
  check_device(device, operation.c_str());
  std::lock_guard<std::mutex> lock(mutex_);
  touch_locked(device, operation);
}

void FakeCuda::set_device(int device) { select(device, "cudaSetDevice(" + std::to_string(device) + ")"); }

// What the real half does before most calls: make `device` current (creating its context), here
// recorded under the name of the call that needed it.
void FakeCuda::select(int device, const std::string& operation) {
  check_device(device, operation.c_str());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    touch_locked(device, operation);
  }
  t_device = {instance_, device};
}

int FakeCuda::current_device() { return thread_device(); }
int FakeCuda::thread_selected_device() { return thread_chose_device() ? t_device.device : -1; }

void* FakeCuda::malloc(size_t bytes, int device) {
  select(device, "cudaMalloc of " + std::to_string(bytes) + " bytes on cuda:" + std::to_string(device));
  const size_t rounded = (std::max<size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
  std::lock_guard<std::mutex> lock(mutex_);
  if (options_.memory_per_device && bytes_in_use_[size_t(device)] + rounded > options_.memory_per_device)
    return nullptr;
  char* ptr = static_cast<char*>(std::aligned_alloc(kAlignment, rounded));
  TINYDDP_CHECK(ptr != nullptr, "fake CUDA: the host is out of memory backing ", rounded, " bytes of cuda:", device);
  blocks_.emplace(ptr, Block{rounded, device});
  bytes_in_use_[size_t(device)] += rounded;
  return ptr;
}

void FakeCuda::free(void* ptr, int device) {
  select(device, "cudaFree on cuda:" + std::to_string(device));
  synchronize(device);  // cudaFree waits for the device's work, which may still use the block
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = blocks_.find(static_cast<const char*>(ptr));
  TINYDDP_CHECK(it != blocks_.end() && it->second.device == device, "fake CUDA: cudaFree(", ptr, ") on cuda:", device,
                ": not the start of an allocation of that device",
                hint("free what malloc returned, on its own device"));
  bytes_in_use_[size_t(device)] -= it->second.bytes;
  std::free(const_cast<char*>(it->first));
  blocks_.erase(it);
}

void* FakeCuda::host_alloc_pinned(size_t bytes) {
  const int device = thread_device();
  const bool chosen = thread_chose_device();
  std::lock_guard<std::mutex> lock(mutex_);
  touch_locked(device, chosen ? "cudaHostAlloc"
                              : "cudaHostAlloc on a thread that never selected a device (CUDA then uses cuda:0)");
  const size_t rounded = (std::max<size_t>(bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
  char* ptr = static_cast<char*>(std::aligned_alloc(kAlignment, rounded));
  TINYDDP_CHECK(ptr != nullptr, "fake CUDA: out of host memory allocating ", bytes, " pinned bytes");
  blocks_.emplace(ptr, Block{rounded, -1});
  ++pinned_made_;
  return ptr;
}

void FakeCuda::host_free_pinned(void* ptr) {
  const int device = thread_device();
  const bool chosen = thread_chose_device();
  std::lock_guard<std::mutex> lock(mutex_);
  touch_locked(device, chosen ? "cudaFreeHost"
                              : "cudaFreeHost on a thread that never selected a device (CUDA then uses cuda:0)");
  TINYDDP_CHECK(host_free_error_.empty(), "fake CUDA: cudaFreeHost(", ptr, ") failed: ", host_free_error_);
  auto it = blocks_.find(static_cast<const char*>(ptr));
  TINYDDP_CHECK(it != blocks_.end() && it->second.device == -1, "fake CUDA: cudaFreeHost(", ptr,
                "): not pinned memory from cudaHostAlloc",
                hint("free pinned blocks with cudaFreeHost, device memory with cudaFree"));
  std::free(const_cast<char*>(it->first));
  blocks_.erase(it);
}

void FakeCuda::memcpy(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  // As the real half does: the copy runs on the device of the GPU side (the destination's, if both).
  const int device = dst_device.is_cuda() ? dst_device.index : src_device.index;
  select(device,
         "cudaMemcpy of " + std::to_string(bytes) + " bytes to " + dst_device.str() + " from " + src_device.str());
  if (dst_device.is_cuda()) check_range(dst, bytes, dst_device.index, "cudaMemcpy", "destination");
  if (src_device.is_cuda()) check_range(src, bytes, src_device.index, "cudaMemcpy", "source");
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memmove(dst, src, bytes);
    return;
  }
  // A copy on the legacy default stream, in order with the kernels there. One with the host on either
  // side returns when it is done; device to device, cudaMemcpy only queues it.
  FakeStreamQueue& stream = default_stream(device);
  std::vector<WrittenRange> writes;
  if (dst_device.is_cuda()) writes.push_back({dst, bytes});
  stream.enqueue("cudaMemcpy", std::move(writes), [dst, src, bytes] { std::memmove(dst, src, bytes); });
  if (dst_device.is_cpu() || src_device.is_cpu()) stream.drain();
}

void FakeCuda::memset_zero(void* ptr, size_t bytes, int device) {
  select(device, "cudaMemset on cuda:" + std::to_string(device));
  check_range(ptr, bytes, device, "cudaMemset", "destination");
  default_stream(device).enqueue("cudaMemset", {{ptr, bytes}}, [ptr, bytes] { std::memset(ptr, 0, bytes); });
}

void FakeCuda::synchronize(int device) {
  select(device, "cudaDeviceSynchronize on cuda:" + std::to_string(device));
  default_stream(device).drain();
  std::vector<FakeStreamQueue*> others;
  {
    std::lock_guard<std::mutex> lock(streams_mutex_);
    for (FakeStreamQueue* q : streams_)
      if (q->device() == device) others.push_back(q);
  }
  for (FakeStreamQueue* q : others) q->drain();
}

// Without a memory limit a fake device reports the host's memory as its total, all of it free but
// what the fake's own allocations hold.
void FakeCuda::memory_info(int device, size_t* free_bytes, size_t* total_bytes) {
  // cudaMemGetInfo answers for the current device, creating its context: the caller selects it.
  select(device, "cudaMemGetInfo on cuda:" + std::to_string(device));
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t used = bytes_in_use_[size_t(device)];
  const size_t total = options_.memory_per_device ? options_.memory_per_device : size_t(-1) / 2;
  *total_bytes = total;
  *free_bytes = total > used ? total - used : 0;
}

CudaStream FakeCuda::create_stream(int device) {
  select(device, "cudaStreamCreate on cuda:" + std::to_string(device));
  auto* stream = new FakeStream{device, make_queue(device)};
  std::lock_guard<std::mutex> lock(streams_mutex_);
  streams_.push_back(stream->queue.get());
  return stream;
}
// Runs what is queued first (cudaStreamDestroy returns at once and lets it finish).
void FakeCuda::destroy_stream(CudaStream handle) {
  auto* stream = static_cast<FakeStream*>(handle);
  {
    std::lock_guard<std::mutex> lock(streams_mutex_);
    std::erase(streams_, stream->queue.get());
  }
  delete stream;
}
CudaEvent FakeCuda::create_event(int device) {
  select(device, "cudaEventCreate on cuda:" + std::to_string(device));
  return new FakeEvent{device};
}
void FakeCuda::destroy_event(CudaEvent event) { delete static_cast<FakeEvent*>(event); }

// An event completes when its stream reaches it; one is used on the device it was made for. Recording
// on the default stream is a call in the current device's context (creating it on a thread that never
// selected a device), as cudaEventRecord is; querying one is a call in its device's context.
void FakeCuda::record_event(CudaEvent handle, CudaStream stream) {
  auto* event = static_cast<FakeEvent*>(handle);
  const int device = stream ? static_cast<FakeStream*>(stream)->device : thread_device();
  if (!stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    touch_locked(device, thread_chose_device()
                             ? "cudaEventRecord"
                             : "cudaEventRecord on a thread that never selected a device (CUDA then uses cuda:0)");
  }
  TINYDDP_CHECK(event->device == device, "fake CUDA: cudaEventRecord: an event of cuda:", event->device,
                " recorded on a stream of cuda:", device,
                hint("record events on streams of the device they were created on"));
  queue_of(stream).record(event->state);
}
void FakeCuda::stream_wait_event(CudaStream stream, CudaEvent handle) {
  auto* event = static_cast<FakeEvent*>(handle);
  queue_of(stream).wait_for(event->state);
}
int FakeCuda::stream_device(CudaStream stream) const {
  return stream ? static_cast<FakeStream*>(stream)->device : thread_device();
}
CudaEventState FakeCuda::query_event(CudaEvent handle, std::string*) {
  auto* event = static_cast<FakeEvent*>(handle);
  touch(event->device, "cudaEventQuery");
  std::lock_guard<std::mutex> lock(event->state->mutex);
  return event->state->completed >= event->state->recorded ? CudaEventState::done : CudaEventState::pending;
}

void FakeCuda::fill_uniform(float* out, int64_t n, uint64_t seed, uint64_t offset, float lo, float hi, int device) {
  select(device, "a fill_uniform kernel on cuda:" + std::to_string(device));
  check_range(out, size_t(n) * sizeof(float), device, "fill_uniform", "output");
  default_stream(device).enqueue("fill_uniform", {{out, size_t(n) * sizeof(float)}}, [=] {
    for (int64_t i = 0; i < n; ++i) out[i] = philox::uniform(seed, offset, uint64_t(i), lo, hi);
  });
}

int FakeCuda::device_of(const void* ptr, size_t bytes) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const char* p = static_cast<const char*>(ptr);
  auto it = blocks_.upper_bound(p);
  if (it == blocks_.begin()) return -1;
  --it;
  const bool inside = p >= it->first && p + bytes <= it->first + it->second.bytes;
  return inside ? it->second.device : -1;
}

bool FakeCuda::has_context(int device) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return contexts_.count(device) > 0;
}

std::vector<int> FakeCuda::devices_with_context() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<int> devices;
  for (const auto& [device, origin] : contexts_) devices.push_back(device);
  return devices;
}

std::string FakeCuda::context_origin(int device) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = contexts_.find(device);
  return it == contexts_.end() ? "" : it->second;
}

size_t FakeCuda::live_device_allocations() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return size_t(std::count_if(blocks_.begin(), blocks_.end(), [](const auto& b) { return b.second.device >= 0; }));
}

size_t FakeCuda::live_pinned_allocations() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return size_t(std::count_if(blocks_.begin(), blocks_.end(), [](const auto& b) { return b.second.device < 0; }));
}

void FakeCuda::fail_host_frees(std::string error) {
  std::lock_guard<std::mutex> lock(mutex_);
  host_free_error_ = std::move(error);
}

size_t FakeCuda::pinned_allocations_made() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return pinned_made_;
}

FakeCuda* active_fake_cuda() {
  if (FakeCuda* installed = g_installed.load(std::memory_order_acquire)) return installed;
  static FakeCuda* const environment = from_environment();
  return environment;
}

namespace {
// A program linked with this library has its fake devices found by core from the start.
[[maybe_unused]] const bool g_finder_registered =
    (set_cuda_stand_in_finder([]() -> CudaStandIn* { return active_fake_cuda(); }), true);
}  // namespace

FakeCudaDevices::FakeCudaDevices(FakeCudaOptions options) : fake_(std::make_unique<FakeCuda>(options)) {
  FakeCuda* expected = nullptr;
  TINYDDP_CHECK(g_installed.compare_exchange_strong(expected, fake_.get()),
                "FakeCudaDevices: fake devices are already installed", hint("one FakeCudaDevices at a time"));
  if (const char* previous = std::getenv(kEnvironment)) {
    had_environment_ = true;
    previous_environment_ = previous;
  }
  ::setenv(kEnvironment, std::to_string(options.devices).c_str(), 1);
}

FakeCudaDevices::~FakeCudaDevices() {
  // The caching allocators keep freed blocks; those are fake memory and must go back to the fake.
  try {
    cuda_cache_release();
    cpu_cache_release();
  } catch (const std::exception& e) {
    log_line(LogLevel::warn, "fake-cuda", std::string("releasing cached blocks: ") + e.what());
  }
  disable_pinned_cpu_memory();
  const size_t left = fake_->live_device_allocations() + fake_->live_pinned_allocations();
  if (left > 0)
    log_line(LogLevel::warn, "fake-cuda",
             std::to_string(left) +
                 " fake CUDA allocation(s) outlive their FakeCudaDevices; "
                 "the tensors holding them must be gone before it is");
  g_installed.store(nullptr, std::memory_order_release);
  if (had_environment_)
    ::setenv(kEnvironment, previous_environment_.c_str(), 1);
  else
    ::unsetenv(kEnvironment);
  if (left > 0) (void)fake_.release();  // leaked on purpose: a tensor may still free into it
}

}  // namespace tinyddp
