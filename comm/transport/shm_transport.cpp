#include "comm/transport/shm_transport.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
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

#include "core/error.h"

namespace tinyddp::comm {

namespace {

constexpr uint64_t kMagic = 0x4d48535044445454ull;  // "TTDDPSHM"
constexpr uint32_t kVersion = 1;
constexpr uint32_t kOpen = 0, kClosed = 1, kAborted = 2;
// 1 MiB per ring: half an L2 of the reference host (2 MiB per core), so a ring being filled and
// drained stays in cache. 256 KiB and 4 MiB measured the same within the (large) noise there.
constexpr size_t kDefaultRingBytes = 1 << 20;
constexpr size_t kPage = 4096;
// Rings smaller than this keep every byte (see align_send).
constexpr size_t kMinAlignedRing = 16 * kPage;
// How long a rank may wait on a peer that closed cleanly before that counts as a failure.
constexpr auto kClosedGrace = std::chrono::milliseconds(1000);

struct ControlBlock {
  uint64_t magic;
  uint32_t version;
  int32_t rank;
  int32_t pid;
  uint32_t rings;
  uint64_t ring_bytes;
  alignas(64) std::atomic<uint32_t> doorbell;  // bumped by a peer after it sent to us or freed room
  alignas(64) std::atomic<uint32_t> sleepers;  // > 0 while this rank sleeps on the doorbell
  std::atomic<uint32_t> state;                 // kOpen, kClosed, kAborted
  char reason[1024];                           // why it aborted
};

// The two counters live on separate cache lines: each is written by one side only.
struct RingHeader {
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
void ring_doorbell(ControlBlock* control) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (control->sleepers.load(std::memory_order_relaxed) == 0) return;
  control->doorbell.fetch_add(1, std::memory_order_seq_cst);
  futex_wake_all(&control->doorbell);
}

bool process_alive(int pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  // A killed child stays a zombie until its parent reaps it, and kill() still finds zombies.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;  // no /proc: trust kill()
  auto close_paren = line.rfind(')');
  char state = close_paren != std::string::npos && close_paren + 2 < line.size() ? line[close_paren + 2] : 'R';
  return state != 'Z' && state != 'X';
}

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

uint64_t fnv1a(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
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
  size_t ring_bytes() const { return control()->ring_bytes; }
  static size_t headers_offset() { return round_up(sizeof(ControlBlock), kPage); }
  size_t data_offset() const { return headers_offset() + round_up(control()->rings * sizeof(RingHeader), kPage); }
  RingHeader* header(int ring) const {
    return reinterpret_cast<RingHeader*>(static_cast<char*>(base) + headers_offset()) + ring;
  }
  std::byte* data(int ring) const {
    return static_cast<std::byte*>(base) + data_offset() + size_t(ring) * ring_bytes();
  }
};

// The connection to one local peer: our ring to it (in our segment) and its ring to us (in its).
class ShmTransport::Peer : public Connection {
 public:
  Peer(ShmTransport& transport, int peer, const Segment& own, int out_ring, const Segment& theirs, int in_ring)
      : Connection(transport, peer),
        out_(own.header(out_ring)),
        out_data_(own.data(out_ring)),
        in_(theirs.header(in_ring)),
        in_data_(theirs.data(in_ring)),
        capacity_(own.ring_bytes()),
        in_capacity_(theirs.ring_bytes()),
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
    ring_doorbell(peer_control_);
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
    ring_doorbell(peer_control_);
  }

  size_t segment_bytes() const override { return static_cast<const ShmTransport&>(transport()).segment_bytes_; }

  // Both ends compute the same skip: at the start of a collective the sender's count of bytes
  // written equals the receiver's count of bytes read. The ring's data starts on a page.
  // A ring of a few pages is left as it is: the skip could leave no room for an element.
  void align_send(size_t phase) override {
    if (capacity_ >= kMinAlignedRing) send_pad_ += skip_to_phase(written_ + send_pad_, phase);
  }
  void align_recv(size_t phase) override {
    if (in_capacity_ >= kMinAlignedRing) recv_skip_ += skip_to_phase(read_ + recv_skip_, phase);
  }

 private:
  RingHeader* out_;
  std::byte* out_data_;
  RingHeader* in_;
  const std::byte* in_data_;
  size_t capacity_;     // of our ring to the peer
  size_t in_capacity_;  // of the peer's ring to us (its TINYDDP_SHM_RING_BYTES may differ from ours)
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

ShmTransport::ShmTransport(Store& store, const std::string& prefix, int rank, const std::vector<int>& local_ranks,
                           std::chrono::milliseconds timeout, ShmTransportOptions options)
    : rank_(rank), segment_bytes_(options.segment_bytes), local_ranks_(local_ranks), own_(std::make_unique<Segment>()) {
  size_t ring_bytes = options.ring_bytes;
  if (ring_bytes == 0) {
    const char* env = std::getenv("TINYDDP_SHM_RING_BYTES");
    ring_bytes = env && *env ? size_t(std::stoull(env)) : kDefaultRingBytes;
  }
  ring_bytes = round_up(std::max<size_t>(ring_bytes, kPage), kPage);
  const int n_local = int(local_ranks.size());
  auto position = [&](int r) { return int(std::find(local_ranks.begin(), local_ranks.end(), r) - local_ranks.begin()); };
  // The ring that `owner` keeps for `target` in its segment: target's place among owner's peers.
  auto ring_index = [&](int owner, int target) { return position(target) - (position(target) > position(owner) ? 1 : 0); };
  TINYDDP_CHECK(position(rank) < n_local, "shm transport: rank ", rank, " is not among the local ranks; hint: this is a bug in the caller");

  // 1. Create, size and map this rank's segment. The name is unique per job, group, rank and
  // process, so a crashed earlier run can never be mistaken for this one.
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a(prefix)));
  own_->name = "/tinyddp-" + std::string(hex) + "-" + std::to_string(rank) + "-" + std::to_string(::getpid());
  const uint32_t rings = uint32_t(n_local - 1);
  own_->bytes = Segment::headers_offset() + round_up(rings * sizeof(RingHeader), kPage) + rings * ring_bytes;
  int fd = ::shm_open(own_->name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  TINYDDP_CHECK(fd >= 0, "shm transport: shm_open(", own_->name, ") failed: ", std::strerror(errno),
                "; hint: /dev/shm must be a writable tmpfs (in Docker: --ipc=host or --shm-size), or use the tcp transport");
  int err = ::posix_fallocate(fd, 0, off_t(own_->bytes));  // fail now, not with SIGBUS on first touch
  if (err != 0) {
    ::close(fd);
    ::shm_unlink(own_->name.c_str());
    TINYDDP_FAIL("shm transport: could not reserve ", own_->bytes, " bytes in /dev/shm: ", std::strerror(err),
                 "; hint: enlarge /dev/shm (Docker: --shm-size=1g), lower TINYDDP_SHM_RING_BYTES, or use the tcp transport");
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
  control->rank = rank;
  control->pid = ::getpid();
  control->rings = rings;
  control->ring_bytes = ring_bytes;
  for (uint32_t i = 0; i < rings; ++i) new (own_->header(int(i))) RingHeader{};

  try {
    // 2. Publish it, map every peer's.
    store.set(prefix + "shm/" + std::to_string(rank), own_->name);
    mapped_.resize(n_local);
    for (int r : local_ranks) {
      if (r == rank) continue;
      std::string key = prefix + "shm/" + std::to_string(r);
      store.wait({key}, timeout);
      auto segment = std::make_unique<Segment>();
      segment->name = store.get(key);
      int peer_fd = ::shm_open(segment->name.c_str(), O_RDWR, 0600);
      TINYDDP_CHECK(peer_fd >= 0, "shm transport: rank ", rank, " cannot open rank ", r, "'s segment ", segment->name, ": ",
                    std::strerror(errno), "; hint: ranks that share memory must run on one host, as one user, and see the same /dev/shm");
      struct stat st {};
      ::fstat(peer_fd, &st);
      segment->bytes = size_t(st.st_size);
      segment->base = ::mmap(nullptr, segment->bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, peer_fd, 0);
      ::close(peer_fd);
      if (segment->base == MAP_FAILED) segment->base = nullptr;
      TINYDDP_CHECK(segment->base && segment->control()->magic == kMagic && segment->control()->version == kVersion &&
                        segment->control()->rank == r && segment->control()->rings == rings,
                    "shm transport: rank ", r, "'s segment ", segment->name,
                    " is not a tinyddp segment of this version and group; hint: every rank must run the same tinyddp build");
      mapped_[position(r)] = std::move(segment);
    }
    // 3. Once every rank has mapped every segment, the names can go: the mappings stay valid and
    // nothing is left behind if a rank is killed later.
    // The count is this host's own: the ranks of every host share the store, and a count over all
    // of them would let one host's ranks unlink before a slower rank of another host has mapped.
    const std::string host_key = prefix + "shm/host-" + std::to_string(local_ranks.front()) + "/";
    if (store.add(host_key + "mapped", 1) == n_local) store.set(host_key + "all_mapped", "1");
    store.wait({host_key + "all_mapped"}, timeout);
  } catch (...) {
    ::shm_unlink(own_->name.c_str());
    throw;
  }
  ::shm_unlink(own_->name.c_str());

  peers_.resize(size_t(*std::max_element(local_ranks.begin(), local_ranks.end())) + 1);
  for (int r : local_ranks) {
    if (r == rank) continue;
    const Segment& theirs = *mapped_[position(r)];
    peers_[r] = std::make_unique<Peer>(*this, r, *own_, ring_index(rank, r), theirs, ring_index(r, rank));
  }
}

ShmTransport::~ShmTransport() {
  ControlBlock* control = own_->control();
  if (control) {
    uint32_t open = kOpen;
    control->state.compare_exchange_strong(open, kClosed, std::memory_order_acq_rel);
    for (auto& segment : mapped_)
      if (segment) ring_doorbell(segment->control());
  }
  peers_.clear();
}

Connection* ShmTransport::connection(int peer) {
  return peer >= 0 && peer < int(peers_.size()) ? peers_[peer].get() : nullptr;
}

void ShmTransport::sleep_once(std::span<const WaitFor> waits, std::chrono::microseconds max_sleep) {
  ControlBlock* me = own_->control();
  // Announce the sleep before the last look: a peer that changes something after our look sees
  // sleepers > 0 and wakes us, or changed the doorbell first and the futex returns at once.
  me->sleepers.fetch_add(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);  // pairs with ring_doorbell's fence
  uint32_t bell = me->doorbell.load(std::memory_order_seq_cst);
  bool ready = false;
  for (const WaitFor& w : waits) {
    auto* peer = static_cast<Peer*>(w.connection);
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
  // rank may send its last bytes and exit at once, and those bytes stay in its ring, readable,
  // after the process has left. The order matters: whether it is gone first, the unread bytes
  // after; every byte it wrote before it went is visible by then, so none is missed in between.
  for (int r : local_ranks_) {
    if (r == rank_) continue;
    const Peer& peer = *peers_[r];
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
    if (segment) ring_doorbell(segment->control());
}

}  // namespace tinyddp::comm
