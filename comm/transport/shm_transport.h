// ShmTransport: ranks on one host exchange bytes through shared memory.
//
// Two kinds of segment (shm_open + mmap):
//   the host's control table   one control block per local rank: pid, state, doorbell, fifo size.
//                              The lowest local rank creates it when the group starts; every local
//                              rank maps it, and it is unlinked once all of them have.
//   one fifo per direction     rank s's bytes for rank t: a circular byte buffer, created by s on its
//                              first send to t, and mapped by t when it first looks for bytes from s.
//
//   a fifo segment:  [header: who, capacity, opened] [written (s's counter)] [read (t's counter)] [data]
//
// So a rank maps only the fifos of the peers it talks to: the ring's two neighbours, and the few
// partners of the small-message algorithms, each of those through a small window
// (tuning::kShmWindowFifoBytes; shm_budget.h has the numbers). The receiver reads its fifo in place:
// a reduction reads the sender's bytes straight out of its segment, so a byte crosses from one core
// to the other once, through the shared cache, with no socket copies.
//
// Neither side ever waits for the other to set a fifo up, so a peer may be reached first from any
// algorithm, in any order, without a deadlock: the sender creates its fifo and writes at once; the
// receiver finds it by its name (the group, both ranks, the sender's pid from the table) once the
// sender's table entry says a new fifo is ready. The receiver then marks it opened and unlinks the
// name: both ends hold it mapped, so nothing is left in /dev/shm even when a rank is killed later.
// A fifo its receiver never opened is unlinked by whichever end closes last (only a pair killed
// both before the receiver looked leaves one behind).
//
// The counters are std::atomic with release/acquire ordering: the sender copies data and then
// publishes `written` with release; the receiver loads it with acquire and only then reads the
// data. Waiting spins briefly and then sleeps on a futex over the rank's own doorbell, which every
// peer bumps after it sends or frees room; so 4 ranks on 2 cores sleep instead of spinning.
//
// Liveness: a peer killed with SIGKILL cannot say goodbye, so a sleeping rank checks its peers'
// pids (kill(pid, 0) and /proc/<pid>/stat for zombies) between sleeps, and reads their state word
// in the table: an aborting rank writes its reason there, so everyone can name the rank that
// failed first. A peer that is gone counts as failed only once its fifo to us is empty: a rank may
// send its last bytes and exit at once, and what it sent stays readable in its segment.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tinyddp/comm/store/store.h"
#include "tinyddp/comm/transport/transport.h"

namespace tinyddp::comm {

struct ShmTransportOptions {
  // Bytes of each fifo to a ring neighbour. Large enough that a sender rarely waits for room, small
  // enough that the fifo stays in the shared cache. 0: TINYDDP_SHM_FIFO_BYTES, else
  // tuning::kShmFifoBytes. Fifos to other peers get at most tuning::kShmWindowFifoBytes.
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
  // `local_ranks`: the sorted ranks on this host, `rank` among them. Keys go under `prefix`. Throws,
  // before it maps anything, when the most these ranks could map does not fit /dev/shm or RAM.
  ShmTransport(Store& store, const std::string& prefix, int rank, const std::vector<int>& local_ranks,
               std::chrono::milliseconds timeout, ShmTransportOptions options = {});
  ~ShmTransport() override;  // tells the peers this rank closed cleanly, unmaps

  const char* name() const override { return "shm"; }
  // Any local peer, from any thread; its fifos are set up on first use (see above).
  Connection* connection(int peer) override;
  void sleep_once(std::span<const WaitFor> waits, std::chrono::microseconds max_sleep) override;
  void check_peers(std::chrono::milliseconds stalled_for, std::span<const int> awaited) override;
  void abort(const std::string& reason) override;

  // For algorithms that synchronise through counters of their own in shared memory (symmetric
  // memory, algorithms/symmetric_all_reduce.h) rather than through fifos: sleep on this rank's
  // doorbell until ready() or max_sleep; wake every local rank that sleeps on its doorbell (after a
  // counter it may wait on changed); throw naming local rank `peer` when it died, aborted, or closed
  // its group while this rank waited `stalled_for` on it.
  void sleep_until(const std::function<bool()>& ready, std::chrono::microseconds max_sleep);
  void wake_local_peers();
  void check_peer(int peer, std::chrono::milliseconds stalled_for);

  // Fifos this rank has created (to send) and mapped (to receive) so far.
  struct FifoCounts {
    int created = 0;
    int mapped = 0;
  };
  FifoCounts fifo_counts() const;

  struct Segment;
  class ShmConnection;

 private:
  void map_control_table(Store& store, const std::string& prefix, std::chrono::milliseconds timeout);
  bool ring_neighbours(int a, int b) const;
  std::string fifo_name(int sender, int receiver, int sender_pid) const;
  std::unique_ptr<Segment> create_fifo(int receiver);
  std::unique_ptr<Segment> open_fifo(int sender, size_t capacity);  // nullptr: not there yet

  int rank_;
  int position_;  // this rank's place among local_ranks_
  size_t bytes_per_turn_;
  size_t fifo_bytes_;
  std::string name_stem_;  // "/tinyddp-<group digest>", the start of every segment name of this group
  std::vector<int> local_ranks_;
  std::unique_ptr<Segment> table_;
  mutable std::mutex connections_mutex_;                     // connection() may come from any thread
  std::vector<std::unique_ptr<ShmConnection>> connections_;  // by rank, made on first use
};

}  // namespace tinyddp::comm
