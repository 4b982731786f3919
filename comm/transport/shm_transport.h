// ShmTransport: ranks on one host exchange bytes through shared memory.
//
// Each rank creates one segment (shm_open + mmap) holding a control block and one fifo (a circular
// byte buffer) per local peer, for the bytes it sends to that peer. Peers map it and read their
// fifo in place: a reduction reads the sender's bytes straight out of its segment, so a byte
// crosses from one core to the other once, through the shared cache, with no socket copies.
//
//   rank r's segment:  [control: pid, state, doorbell] [fifo r->a] [fifo r->b] ...
//   a fifo:            written (sender's counter)  read (receiver's counter)  data[capacity]
//
// The counters are std::atomic with release/acquire ordering: the sender copies data and then
// publishes `written` with release; the receiver loads it with acquire and only then reads the
// data. Waiting spins briefly and then sleeps on a futex over the rank's own doorbell, which every
// peer bumps after it sends or frees room; so 4 ranks on 2 cores sleep instead of spinning.
//
// Liveness: a peer killed with SIGKILL cannot say goodbye, so a sleeping rank checks every peer's
// pid (kill(pid, 0) and /proc/<pid>/stat for zombies) between sleeps, and reads the peer's state
// word: an aborting rank writes its reason there, so everyone can name the rank that failed first.
// A peer that is gone counts as failed only once its fifo to us is empty: a rank may send its last
// bytes and exit at once, and what it sent stays readable in its (still mapped) segment.
// The segments are unlinked as soon as every rank has mapped them: nothing is left in /dev/shm
// even when a rank is killed.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "tinyddp/comm/store/store.h"
#include "tinyddp/comm/transport/transport.h"

namespace tinyddp::comm {

struct ShmTransportOptions {
  // Bytes of each fifo. Large enough that a sender rarely waits for room, small enough that the
  // fifo stays in the shared cache. 0: TINYDDP_SHM_FIFO_BYTES, else tuning::kShmFifoBytes.
  size_t fifo_bytes = 0;
  // The most bytes the algorithms move per turn on these connections (Connection::bytes_per_turn).
  size_t bytes_per_turn = tuning::kBytesPerTurn;
};

// What identifies "the same host" for shared memory: the boot id (one kernel), and the /dev/shm
// and pid namespaces (containers on one kernel that cannot see each other's segments or pids are
// different hosts for this purpose). Ranks with equal identities can use ShmTransport.
std::string host_identity();

class ShmTransport : public Transport {
 public:
  // `local_ranks`: the sorted ranks on this host, `rank` among them. Keys go under `prefix`.
  ShmTransport(Store& store, const std::string& prefix, int rank, const std::vector<int>& local_ranks,
               std::chrono::milliseconds timeout, ShmTransportOptions options = {});
  ~ShmTransport() override;  // tells the peers this rank closed cleanly, unmaps

  const char* name() const override { return "shm"; }
  Connection* connection(int peer) override;
  void sleep_once(std::span<const WaitFor> waits, std::chrono::microseconds max_sleep) override;
  void check_peers(std::chrono::milliseconds stalled_for) override;
  void abort(const std::string& reason) override;

  struct Segment;
  class ShmConnection;

 private:
  void create_own_segment(const std::string& prefix, size_t fifo_bytes);
  void map_peer_segments(Store& store, const std::string& prefix, std::chrono::milliseconds timeout);

  int rank_;
  size_t bytes_per_turn_;
  std::vector<int> local_ranks_;
  std::unique_ptr<Segment> own_;
  std::vector<std::unique_ptr<Segment>> mapped_;           // peers' segments, by position in local_ranks_
  std::vector<std::unique_ptr<ShmConnection>> connections_;  // by rank (nullptr: not local)
};

}  // namespace tinyddp::comm
