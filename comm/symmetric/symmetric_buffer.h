// SymmetricBuffer: one allocation that every rank of a host maps, its own part and every peer's.
//
// NCCL's ncclMemAlloc + ncclCommWindowRegister and PyTorch's SymmetricMemory are the models: each
// rank of the host allocates the same number of bytes at the same moment (a collective call), and
// each rank maps every other rank's part, so an algorithm reads a peer's data where it lies, with
// no FIFO in between and no copy into one.
//
//   a rank's part:  [header page: who, size, its progress counter, the call it is in] [data]
//
// Where the memory comes from: memfd_create, an anonymous file that never has a name in /dev/shm,
// so nothing is left there whatever happens to the ranks (even SIGKILL between two steps). Its pages
// are reserved at once (posix_fallocate): a host short of memory fails the allocation with an error,
// not a later touch with SIGBUS. A peer maps the part through /proc/<pid>/fd/<fd> of its owner, which
// keeps the file open until every peer has (a count in the store); then only the mappings hold it.
// A part stays mapped, and readable, in its peers while they hold it, even after its owner died: a
// dead peer never makes the others fault; they notice it through the transport's liveness checks
// and fail naming it.
//
// The progress counter is each rank's: written by it alone (release), read by the peers (acquire).
// An algorithm moves it forward through the steps of every collective on the buffer
// (symmetric_all_reduce.h) and waits until every peer's counter has reached a step: a barrier that
// is one store and n-1 loads of lines that are in cache unless they changed. Every step is such a
// barrier, so while a rank waits for a step it published, no peer is more than one step ahead: the
// counter is kept in two entries, one per parity, each on its own cache line beside the call that
// step announces, and a waiter reads the one line of the step it waits for.
//
// Lifetime: the buffer belongs to the tensors over it (Storage keeps it alive). The process group
// releases the peers' parts when it ends or aborts (release_peers): from then on the buffer is
// plain memory of this rank, and the peers' memory goes back to the system once each of them lets
// go of its own part.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tinyddp/core/dtype.h"

namespace tinyddp::comm {

class Store;

// The collective a rank is in on a buffer, published before its arrival step so that every peer can
// check that all of them make the same call on the same window of the buffer.
struct SymmetricCall {
  uint64_t offset = 0;  // bytes from the start of the buffer
  uint64_t count = 0;   // elements
  uint32_t dtype = 0;
  uint32_t op = 0;
  uint64_t sequence = 0;  // the collective's number in the group
  uint64_t address = 0;   // where this rank's data lies in its own address space (cross_memory_all_reduce.h)

  bool operator==(const SymmetricCall&) const = default;
};

class SymmetricBuffer {
 public:
  struct Part;
  // Allocates this rank's part of allocation number `index` of the group and maps every peer's.
  // `local_ranks`: the ranks of this host in rank order, `rank` among them. Every one of them must
  // make the same call (same index, same bytes); the keys go under `key_prefix` in `store` (which ends
  // in "/"; its last part names the memory in /proc/<pid>/maps: "memfd:tinyddp-<part>-<index>-rank<r>").
  // Whether a peer's part can be opened the way allocate() opens it, through /proc/<pid>/fd: only when
  // this process's /proc is the one of its own pid namespace. A process in a pid namespace of its own
  // that still sees its parent's /proc (unshare --pid without remounting /proc) would look for its
  // peers' pids among the parent's processes. Every rank of a host shares the pid namespace (it is part
  // of the host's identity), so every one of them gets the same answer.
  static bool peers_openable();
  static std::shared_ptr<SymmetricBuffer> allocate(Store& store, const std::string& key_prefix, int index, int rank,
                                                   const std::vector<int>& local_ranks, size_t bytes,
                                                   std::chrono::milliseconds timeout);
  ~SymmetricBuffer();
  SymmetricBuffer(const SymmetricBuffer&) = delete;
  SymmetricBuffer& operator=(const SymmetricBuffer&) = delete;

  size_t bytes() const { return bytes_; }
  int index() const { return index_; }
  int parties() const { return int(ranks_.size()); }
  int position() const { return position_; }                // this rank's place among ranks()
  const std::vector<int>& ranks() const { return ranks_; }  // the host's ranks, in rank order
  std::byte* data() const;                                  // this rank's part
  // Rank ranks()[p]'s part, mapped here; nullptr once the peers were released.
  std::byte* data_of(int p) const;
  bool peers_mapped() const { return peers_mapped_; }
  // Unmaps the peers' parts (the process group ended or aborted); this rank's stays.
  void release_peers();

  // ---- the progress counters ----
  // This rank's counter: the steps it has finished on this buffer.
  uint64_t my_step() const { return my_step_; }
  // Publishes that this rank finished `step` (steps only grow).
  void publish(uint64_t step);
  // Writes `call` as the call this rank announces with `step`, before publish(step) announces both: a
  // peer reads them together. Not a publish itself: a second store to the step's line after a peer
  // has read it would cost another trip between the cores.
  void set_call(uint64_t step, const SymmetricCall& call);
  // Whether rank ranks()[p]'s counter has reached `step`, asked while this rank waits for a step it
  // published (then no peer is two steps ahead; see the header comment). And the call it published
  // with `step`: readable from the moment its counter reached `step` until it publishes step + 2.
  bool reached(int p, uint64_t step) const;
  SymmetricCall call_of(int p, uint64_t step) const;

 private:
  SymmetricBuffer() = default;

  int index_ = 0;
  int position_ = 0;
  size_t bytes_ = 0;
  std::vector<int> ranks_;
  std::vector<std::unique_ptr<Part>> parts_;  // by position; this rank's is the one it created
  bool peers_mapped_ = false;
  uint64_t my_step_ = 0;
};

}  // namespace tinyddp::comm
