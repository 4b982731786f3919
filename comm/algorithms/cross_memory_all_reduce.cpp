#include "tinyddp/comm/algorithms/cross_memory_all_reduce.h"

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "tinyddp/comm/algorithms/symmetric_all_reduce.h"
#include "tinyddp/comm/chunks.h"
#include "tinyddp/comm/symmetric/symmetric_buffer.h"
#include "tinyddp/comm/transport/shm_transport.h"
#include "tinyddp/core/error.h"
#include "tinyddp/core/process.h"

namespace tinyddp::comm {

namespace {

constexpr uint64_t kArrived = 1, kDone = 2;

// Copies `bytes` between `local` here and `remote` in process `pid` (rank `rank`): from the peer
// with process_vm_readv, to it with process_vm_writev.
enum class Direction { from_peer, to_peer };
void transfer(Direction way, int pid, int rank, std::byte* local, std::byte* remote, size_t bytes,
              const CollectiveContext& ctx) {
  while (bytes > 0) {
    iovec here{local, bytes}, theirs{remote, bytes};
    const ssize_t n = way == Direction::from_peer ? ::process_vm_readv(pid, &here, 1, &theirs, 1, 0)
                                                  : ::process_vm_writev(pid, &here, 1, &theirs, 1, 0);
    if (n > 0) {
      local += n;
      remote += n;
      bytes -= size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    const int err = n < 0 ? errno : EIO;
    // ESRCH: the peer has no memory left to reach (exited; a zombie still counts as alive).
    TINYDDP_CHECK(pid == ::getpid() || (err != ESRCH && process_alive(pid)), "shm transport: rank ", rank, " (pid ",
                  pid, ") died while rank ", ctx.rank, " was in a collective with it",
                  hint("look at rank ", rank, "'s output and exit status (killed by a signal? out of memory?)"));
    TINYDDP_FAIL(ctx.what(), ": ", way == Direction::from_peer ? "process_vm_readv from" : "process_vm_writev to",
                 " rank ", rank, " (pid ", pid, ") failed: ", std::strerror(err),
                 hint("TINYDDP_CROSS_MEMORY=0 moves ordinary tensors through the shared-memory fifos instead"));
  }
}

}  // namespace

std::string cross_memory_unreadable(int pid, const void* address, size_t bytes) {
  std::vector<std::byte> probe(bytes);
  iovec local{probe.data(), bytes}, theirs{const_cast<void*>(address), bytes};
  if (::process_vm_readv(pid, &local, 1, &theirs, 1, 0) == ssize_t(bytes)) return "";
  std::string why = std::string("process_vm_readv: ") + std::strerror(errno);
  std::ifstream yama("/proc/sys/kernel/yama/ptrace_scope");
  int scope = -1;
  if (yama >> scope)
    why += " (/proc/sys/kernel/yama/ptrace_scope is " + std::to_string(scope) + ": 0 lets a process read its peers)";
  return why;
}

void cross_memory_all_reduce(SymmetricBuffer& control, const std::vector<int>& pids, std::byte* data, size_t count,
                             ShmTransport& shm, const CollectiveContext& ctx) {
  const int n = control.parties(), me = control.position();
  const size_t elem = dtype_size(ctx.dtype);
  const uint64_t base = control.my_step();
  SymmetricCall call{
      0, count, uint32_t(ctx.dtype), uint32_t(ctx.op), ctx.sequence, uint64_t(reinterpret_cast<uintptr_t>(data))};
  control.set_call(base + kArrived, call);
  symmetric_barrier(control, base + kArrived, shm, ctx);
  check_same_call(control, call, base + kArrived, ctx);
  std::vector<std::byte*> theirs(static_cast<size_t>(n));
  for (int p = 0; p < n; ++p)
    theirs[size_t(p)] = reinterpret_cast<std::byte*>(uintptr_t(control.call_of(p, base + kArrived).address));

  // Slice `me`, a bounce buffer's worth at a time: folded x_me, x_(me+1), ... as the ring folds it,
  // then written into every peer's buffer while it is still in this core's cache. Only rank p reads
  // or writes slice p of any buffer until the done barrier, so the writes race with nothing.
  thread_local std::vector<std::byte> bounce;
  const size_t block = std::max<size_t>(1, tuning::kCrossMemoryBlockBytes / elem);
  if (bounce.size() < block * elem) bounce.resize(block * elem);
  const size_t my_begin = chunk_begin(count, n, me), my_count = chunk_count(count, n, me);
  for (size_t done = 0; done < my_count; done += block) {
    const size_t k = std::min(block, my_count - done), at = (my_begin + done) * elem;
    for (int step = 1; step < n; ++step) {
      const int q = (me + step) % n;
      transfer(Direction::from_peer, pids[size_t(q)], control.ranks()[size_t(q)], bounce.data(), theirs[size_t(q)] + at,
               k * elem, ctx);
      reduce_elements(data + at, data + at, bounce.data(), k, ctx.dtype, ctx.op);
    }
    if (ctx.op == ReduceOp::avg) finish_average(data + at, k, ctx.dtype, ctx.world_size);
    for (int step = 1; step < n; ++step) {
      const int q = (me + step) % n;
      transfer(Direction::to_peer, pids[size_t(q)], control.ranks()[size_t(q)], data + at, theirs[size_t(q)] + at,
               k * elem, ctx);
    }
  }
  symmetric_barrier(control, base + kDone, shm, ctx);
}

}  // namespace tinyddp::comm
