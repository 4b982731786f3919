#include "tinyddp/comm/transport/shm_transport.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <new>

#include "tinyddp/core/env.h"
#include "tinyddp/core/error.h"
#include "tinyddp/core/hash.h"
#include "tinyddp/core/process.h"

namespace tinyddp::comm {

namespace {

constexpr uint64_t kMagic = 0x4d48535044445454ull;  // "TTDDPSHM"
constexpr uint32_t kVersion = 1;
constexpr uint32_t kOpen = 0, kClosed = 1, kAborted = 2;
constexpr size_t kPage = 4096;
// Fifos smaller than this keep every byte (see align_send).
constexpr size_t kMinAlignedFifo = 16 * kPage;
// How long a rank may wait on a peer that closed cleanly before that counts as a failure.
constexpr auto kClosedGrace = std::chrono::milliseconds(1000);

struct ControlBlock {
  uint64_t magic;
  uint32_t version;
  int32_t rank;
  int32_t pid;
  uint32_t fifos;
  uint64_t fifo_bytes;
  alignas(64) std::atomic<uint32_t> doorbell;  // bumped by a peer after it sent to us or freed room
  alignas(64) std::atomic<uint32_t> sleepers;  // > 0 while this rank sleeps on the doorbell
  std::atomic<uint32_t> state;                 // kOpen, kClosed, kAborted
  char reason[1024];                           // why it aborted
};

// The two counters live on separate cache lines: each is written by one side only.
struct FifoHeader {
  alignas(64) std::atomic<uint64_t> written;  // bytes ever sent (the sender's)
  alignas(64) std::atomic<uint64_t> read;     // bytes ever consumed (the receiver's)
};

static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free,
              "shared-memory atomics must be lock-free to work across processes");

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Futexes on MAP_SHARED memory work across processes (no FUTEX_PRIVATE_FLAG).
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::microseconds timeout) {
  timespec ts{time_t(timeout.count() / 1000000), long(timeout.count() % 1000000) * 1000};
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}
void futex_wake_all(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// Wakes `control`'s rank if it sleeps, after this rank changed a counter it may wait on. Only a
// sleeper needs the doorbell (and the system call): a rank that spins sees the counter itself, and
// bumping a line the other core reads on every send would cost a cache miss per message. The
// fence orders the counter's store before the look at `sleepers`; sleep_once orders its
// announcement before its last look at the counters the same way, so one of the two always sees
// the other (a sleeper that missed the counter is woken, a waker that missed the sleeper is seen).
void wake(ControlBlock* control) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (control->sleepers.load(std::memory_order_relaxed) == 0) return;
  control->doorbell.fetch_add(1, std::memory_order_seq_cst);
  futex_wake_all(&control->doorbell);
}

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace

std::string host_identity() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  struct stat shm {};
  ::stat("/dev/shm", &shm);
  char pid_ns[128] = {};
  ssize_t n = ::readlink("/proc/self/ns/pid", pid_ns, sizeof pid_ns - 1);
  if (n < 0) pid_ns[0] = 0;
  return std::string(host) + "/" + read_first_line("/proc/sys/kernel/random/boot_id") + "/" + std::to_string(shm.st_dev) +
         ":" + std::to_string(shm.st_ino) + "/" + pid_ns;
}

// One mapped segment: this rank's own, or a peer's.
struct ShmTransport::Segment {
  std::string name;
  void* base = nullptr;
  size_t bytes = 0;

  ~Segment() {
    if (base) ::munmap(base, bytes);
  }
  ControlBlock* control() const { return static_cast<ControlBlock*>(base); }
  size_t fifo_bytes() const { return control()->fifo_bytes; }
  static size_t headers_offset() { return round_up(sizeof(ControlBlock), kPage); }
  size_t data_offset() const { return headers_offset() + round_up(control()->fifos * sizeof(FifoHeader), kPage); }
  FifoHeader* header(int fifo) const {
    return reinterpret_cast<FifoHeader*>(static_cast<char*>(base) + headers_offset()) + fifo;
  }
  std::byte* data(int fifo) const {
    return static_cast<std::byte*>(base) + data_offset() + size_t(fifo) * fifo_bytes();
  }
};

// The connection to one local peer: our fifo to it (in our segment) and its fifo to us (in its).
class ShmTransport::ShmConnection : public Connection {
 public:
  ShmConnection(ShmTransport& transport, int peer, const Segment& own, int out_fifo, const Segment& theirs, int in_fifo)
      : Connection(transport, peer),
        out_(own.header(out_fifo)),
        out_data_(own.data(out_fifo)),
        in_(theirs.header(in_fifo)),
        in_data_(theirs.data(in_fifo)),
        capacity_(own.fifo_bytes()),
        in_capacity_(theirs.fifo_bytes()),
        peer_control_(theirs.control()),
        written_(out_->written.load(std::memory_order_relaxed)),
        read_(in_->read.load(std::memory_order_relaxed)),
        their_read_(out_->read.load(std::memory_order_relaxed)),
        their_written_(in_->written.load(std::memory_order_relaxed)) {}

  // Fresh looks at the peer's counters (each a cache line the other core writes).
  size_t send_room() const {
    size_t room = capacity_ - (written_ - out_->read.load(std::memory_order_acquire));
    return room > send_pad_ ? room - send_pad_ : 0;
  }
  size_t recv_available() const {
    uint64_t available = in_->written.load(std::memory_order_acquire) - read_;
    return available > recv_skip_ ? size_t(available - recv_skip_) : 0;
  }
  ControlBlock* peer_control() const { return peer_control_; }

  size_t try_send(const void* data, size_t n, size_t granule) override {
    // The peer's read counter is looked at only when the room last seen is too small: a small
    // message then costs no cache miss on that line.
    if (capacity_ - (written_ - their_read_) < send_pad_ + n) their_read_ = out_->read.load(std::memory_order_acquire);
    size_t room = capacity_ - (written_ - their_read_);
    if (room <= send_pad_) return 0;
    n = std::min(n, room - send_pad_);
    n -= n % granule;
    if (n == 0) return 0;
    // The skip align_send asked for goes out with the first bytes after it, never alone, so the
    // receiver never sees a stream that has grown by nothing but skipped bytes.
    written_ += send_pad_;
    send_pad_ = 0;
    size_t at = written_ % capacity_;
    size_t first = std::min(n, capacity_ - at);
    std::memcpy(out_data_ + at, data, first);
    std::memcpy(out_data_, static_cast<const std::byte*>(data) + first, n - first);
    written_ += n;
    out_->written.store(written_, std::memory_order_release);  // publish the bytes, then wake
    wake(peer_control_);
    return n;
  }

  size_t try_recv(void* dst, size_t n) override {
    size_t got = 0;
    while (got < n) {
      auto piece = try_peek(n - got);
      if (piece.empty()) break;
      std::memcpy(static_cast<std::byte*>(dst) + got, piece.data(), piece.size());
      got += piece.size();
      release(piece.size());
    }
    return got;
  }

  std::span<const std::byte> try_peek(size_t max) override {
    if (their_written_ - read_ < recv_skip_ + max) their_written_ = in_->written.load(std::memory_order_acquire);
    if (recv_skip_ > 0) {
      if (their_written_ - read_ <= recv_skip_) return {};  // the sender has not got past the skip yet
      read_ += recv_skip_;
      recv_skip_ = 0;
    }
    size_t at = read_ % in_capacity_;
    size_t n = std::min({size_t(their_written_ - read_), in_capacity_ - at, max});
    return {in_data_ + at, n};
  }

  void release(size_t n) override {
    read_ += n;
    in_->read.store(read_, std::memory_order_release);  // the room is free for the sender again
    wake(peer_control_);
  }

  size_t bytes_per_turn() const override { return static_cast<const ShmTransport&>(transport()).bytes_per_turn_; }

  // Both ends compute the same skip: at the start of a collective the sender's count of bytes
  // written equals the receiver's count of bytes read. The fifo's data starts on a page.
  // A fifo of a few pages is left as it is: the skip could leave no room for an element.
  void align_send(size_t phase) override {
    if (capacity_ >= kMinAlignedFifo) send_pad_ += skip_to_phase(written_ + send_pad_, phase);
  }
  void align_recv(size_t phase) override {
    if (in_capacity_ >= kMinAlignedFifo) recv_skip_ += skip_to_phase(read_ + recv_skip_, phase);
  }

 private:
  FifoHeader* out_;
  std::byte* out_data_;
  FifoHeader* in_;
  const std::byte* in_data_;
  size_t capacity_;     // of our fifo to the peer
  size_t in_capacity_;  // of the peer's fifo to us (its TINYDDP_SHM_FIFO_BYTES may differ from ours)
  ControlBlock* peer_control_;
  uint64_t written_;  // our copy of out_->written (we are its only writer)
  uint64_t read_;     // our copy of in_->read (we are its only writer)
  uint64_t their_read_;     // out_->read as last seen (it only grows: the room is at least this)
  uint64_t their_written_;  // in_->written as last seen (likewise: at least this has arrived)
  size_t send_pad_ = 0;      // bytes the next send skips (align_send)
  size_t recv_skip_ = 0;     // bytes the next receive skips (align_recv)

  static size_t skip_to_phase(uint64_t position, size_t phase) {
    return size_t((phase % kPage + kPage - position % kPage) % kPage);
  }
};

namespace {

// Where rank `r` stands among the sorted local ranks.
int position_of(const std::vector<int>& local_ranks, int r) {
  return int(std::find(local_ranks.begin(), local_ranks.end(), r) - local_ranks.begin());
}

// The fifo that `owner` keeps for `target` in its segment: target's place among owner's peers.
int fifo_index(const std::vector<int>& local_ranks, int owner, int target) {
  const int t = position_of(local_ranks, target);
  return t - (t > position_of(local_ranks, owner) ? 1 : 0);
}

// Opens and maps rank `r`'s published segment `name`, and checks that it is one of this group.
std::unique_ptr<ShmTransport::Segment> map_segment(const std::string& name, int rank, int r, uint32_t fifos) {
  auto segment = std::make_unique<ShmTransport::Segment>();
  segment->name = name;
  int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
  TINYDDP_CHECK(fd >= 0, "shm transport: rank ", rank, " cannot open rank ", r, "'s segment ", name, ": ",
                std::strerror(errno), "; hint: ranks that share memory must run on one host, as one user, and see the same /dev/shm");
  struct stat st {};
  ::fstat(fd, &st);
  segment->bytes = size_t(st.st_size);
  segment->base = ::mmap(nullptr, segment->bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  ::close(fd);
  if (segment->base == MAP_FAILED) segment->base = nullptr;
  TINYDDP_CHECK(segment->base && segment->control()->magic == kMagic && segment->control()->version == kVersion &&
                    segment->control()->rank == r && segment->control()->fifos == fifos,
                "shm transport: rank ", r, "'s segment ", name,
                " is not a tinyddp segment of this version and group; hint: every rank must run the same tinyddp build");
  return segment;
}

}  // namespace

ShmTransport::ShmTransport(Store& store, const std::string& prefix, int rank, const std::vector<int>& local_ranks,
                           std::chrono::milliseconds timeout, ShmTransportOptions options)
    : rank_(rank), bytes_per_turn_(options.bytes_per_turn), local_ranks_(local_ranks), own_(std::make_unique<Segment>()) {
  TINYDDP_CHECK(position_of(local_ranks, rank) < int(local_ranks.size()), "shm transport: rank ", rank,
                " is not among the local ranks; hint: this is a bug in the caller");
  size_t fifo_bytes = options.fifo_bytes;
  if (fifo_bytes == 0)
    fifo_bytes = env::unsigned_integer("TINYDDP_SHM_FIFO_BYTES", 0, size_t(1) << 40).value_or(tuning::kShmFifoBytes);
  create_own_segment(prefix, round_up(std::max<size_t>(fifo_bytes, kPage), kPage));
  try {
    map_peer_segments(store, prefix, timeout);
  } catch (...) {
    ::shm_unlink(own_->name.c_str());
    throw;
  }
  // Every rank of this host has mapped every segment: the names can go. The mappings stay valid,
  // and nothing is left in /dev/shm if a rank is killed later.
  ::shm_unlink(own_->name.c_str());

  connections_.resize(size_t(*std::max_element(local_ranks.begin(), local_ranks.end())) + 1);
  for (int r : local_ranks) {
    if (r == rank) continue;
    const Segment& theirs = *mapped_[position_of(local_ranks, r)];
    connections_[r] = std::make_unique<ShmConnection>(*this, r, *own_, fifo_index(local_ranks, rank, r), theirs,
                                                      fifo_index(local_ranks, r, rank));
  }
}

// Creates, sizes and maps this rank's segment: a control block and one fifo per local peer. The
// name is unique per job, group, rank and process, so a crashed earlier run can never be mistaken
// for this one.
void ShmTransport::create_own_segment(const std::string& prefix, size_t fifo_bytes) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a(prefix)));
  own_->name = "/tinyddp-" + std::string(hex) + "-" + std::to_string(rank_) + "-" + std::to_string(::getpid());
  const uint32_t fifos = uint32_t(local_ranks_.size() - 1);
  own_->bytes = Segment::headers_offset() + round_up(fifos * sizeof(FifoHeader), kPage) + fifos * fifo_bytes;
  int fd = ::shm_open(own_->name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  TINYDDP_CHECK(fd >= 0, "shm transport: shm_open(", own_->name, ") failed: ", std::strerror(errno),
                "; hint: /dev/shm must be a writable tmpfs (in Docker: --ipc=host or --shm-size), or use the tcp transport");
  int err = ::posix_fallocate(fd, 0, off_t(own_->bytes));  // fail now, not with SIGBUS on first touch
  if (err != 0) {
    ::close(fd);
    ::shm_unlink(own_->name.c_str());
    TINYDDP_FAIL("shm transport: could not reserve ", own_->bytes, " bytes in /dev/shm: ", std::strerror(err),
                 "; hint: enlarge /dev/shm (Docker: --shm-size=1g), lower TINYDDP_SHM_FIFO_BYTES, or use the tcp transport");
  }
  own_->base = ::mmap(nullptr, own_->bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  ::close(fd);
  if (own_->base == MAP_FAILED) {
    own_->base = nullptr;
    ::shm_unlink(own_->name.c_str());
    TINYDDP_FAIL("shm transport: mmap of ", own_->bytes, " bytes failed: ", std::strerror(errno), "; hint: check ulimit -v");
  }
  auto* control = new (own_->base) ControlBlock{};
  control->magic = kMagic;
  control->version = kVersion;
  control->rank = rank_;
  control->pid = ::getpid();
  control->fifos = fifos;
  control->fifo_bytes = fifo_bytes;
  for (uint32_t i = 0; i < fifos; ++i) new (own_->header(int(i))) FifoHeader{};
}

// Publishes this rank's segment, maps every local peer's, and waits until every rank of this host
// has mapped every segment of it.
void ShmTransport::map_peer_segments(Store& store, const std::string& prefix, std::chrono::milliseconds timeout) {
  store.set(prefix + "shm/" + std::to_string(rank_), own_->name);
  mapped_.resize(local_ranks_.size());
  for (int r : local_ranks_) {
    if (r == rank_) continue;
    std::string key = prefix + "shm/" + std::to_string(r);
    store.wait({key}, timeout);
    mapped_[position_of(local_ranks_, r)] = map_segment(store.get(key), rank_, r, own_->control()->fifos);
  }
  // The count is this host's own: the ranks of every host share the store, and a count over all
  // of them would let one host's ranks unlink before a slower rank of another host has mapped.
  const std::string host_key = prefix + "shm/host-" + std::to_string(local_ranks_.front()) + "/";
  if (store.add(host_key + "mapped", 1) == int64_t(local_ranks_.size())) store.set(host_key + "all_mapped", "1");
  store.wait({host_key + "all_mapped"}, timeout);
}

ShmTransport::~ShmTransport() {
  ControlBlock* control = own_->control();
  if (control) {
    uint32_t open = kOpen;
    control->state.compare_exchange_strong(open, kClosed, std::memory_order_acq_rel);
    for (auto& segment : mapped_)
      if (segment) wake(segment->control());
  }
  connections_.clear();
}

Connection* ShmTransport::connection(int peer) {
  return peer >= 0 && peer < int(connections_.size()) ? connections_[peer].get() : nullptr;
}

void ShmTransport::sleep_once(std::span<const WaitFor> waits, std::chrono::microseconds max_sleep) {
  ControlBlock* me = own_->control();
  // Announce the sleep before the last look: a peer that changes something after our look sees
  // sleepers > 0 and wakes us, or changed the doorbell first and the futex returns at once.
  me->sleepers.fetch_add(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);  // pairs with wake's fence
  uint32_t bell = me->doorbell.load(std::memory_order_seq_cst);
  bool ready = false;
  for (const WaitFor& w : waits) {
    auto* peer = static_cast<ShmConnection*>(w.connection);
    ready |= (w.send && peer->send_room() > 0) || (w.recv && peer->recv_available() > 0);
  }
  if (!ready) futex_wait(&me->doorbell, bell, max_sleep);
  me->sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

void ShmTransport::check_peers(std::chrono::milliseconds stalled_for) {
  // Aborted peers first: their reason names the rank that failed first.
  for (auto& segment : mapped_) {
    if (!segment) continue;
    ControlBlock* c = segment->control();
    if (c->state.load(std::memory_order_acquire) == kAborted) {
      std::string reason(c->reason, strnlen(c->reason, sizeof c->reason));
      TINYDDP_FAIL("shm transport: rank ", c->rank, " aborted: ", reason, "; hint: look at rank ", c->rank,
                   "'s own output for the first error");
    }
  }
  // A peer that is gone (or closed) is a failure only once everything it sent us has been read: a
  // rank may send its last bytes and exit at once, and those bytes stay in its fifo, readable,
  // after the process has left. The order matters: whether it is gone first, the unread bytes
  // after; every byte it wrote before it went is visible by then, so none is missed in between.
  for (int r : local_ranks_) {
    if (r == rank_) continue;
    const ShmConnection& peer = *connections_[r];
    ControlBlock* c = peer.peer_control();
    const bool gone = c->pid != ::getpid() && !process_alive(c->pid);
    const bool closed = c->state.load(std::memory_order_acquire) == kClosed;
    if (!gone && !closed) continue;
    if (peer.recv_available() > 0) continue;  // still ours to read: the caller makes progress first
    if (gone)
      TINYDDP_FAIL("shm transport: rank ", r, " (pid ", c->pid, ") died while rank ", rank_,
                   " was in a collective with it; hint: look at rank ", r,
                   "'s output and exit status (killed by a signal? out of memory?)");
    if (stalled_for >= kClosedGrace)
      TINYDDP_FAIL("shm transport: rank ", r, " closed its process group while rank ", rank_,
                   " still waits for it; hint: every rank must make the same collective calls before shutting down");
  }
}

void ShmTransport::abort(const std::string& reason) {
  ControlBlock* me = own_->control();
  size_t n = std::min(reason.size(), sizeof me->reason - 1);
  std::memcpy(me->reason, reason.data(), n);
  me->reason[n] = 0;
  me->state.store(kAborted, std::memory_order_release);
  for (auto& segment : mapped_)
    if (segment) wake(segment->control());
}

}  // namespace tinyddp::comm
