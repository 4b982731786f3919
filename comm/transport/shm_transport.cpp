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
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <optional>

#include "tinyddp/comm/transport/shm_budget.h"
#include "tinyddp/core/error.h"
#include "tinyddp/core/hash.h"
#include "tinyddp/core/process.h"
#include "tinyddp/core/remove_on_stop_signal.h"

namespace tinyddp::comm {

namespace {

constexpr uint64_t kMagic = 0x4d48535044445454ull;  // "TTDDPSHM"
constexpr uint32_t kVersion = 2;
constexpr uint32_t kOpen = 0, kClosed = 1, kAborted = 2;
constexpr size_t kPage = 4096;
// Fifos smaller than this keep every byte (see align_send).
constexpr size_t kMinAlignedFifo = 16 * kPage;
// How long a rank may wait on a peer that closed cleanly before that counts as a failure.
constexpr auto kClosedGrace = std::chrono::milliseconds(1000);

// One local rank's entry in the host's control table. Its rank fills it in while the group starts
// and writes `magic` last.
struct ControlBlock {
  std::atomic<uint64_t> magic;
  uint32_t version;
  int32_t rank;
  int32_t pid;
  uint64_t fifo_bytes;                         // the size of its fifos to ring neighbours
  std::atomic<uint32_t> fifos_created;         // bumped each time one of its fifos is ready to open
  alignas(64) std::atomic<uint32_t> doorbell;  // bumped by a peer after it sent to us or freed room
  alignas(64) std::atomic<uint32_t> sleepers;  // > 0 while this rank sleeps on the doorbell
  std::atomic<uint32_t> state;                 // kOpen, kClosed, kAborted
  char reason[1024];                           // why it aborted
};

// The first page of a fifo segment; the data follows on the next page. The two counters live on
// separate cache lines: each is written by one side only.
struct FifoHeader {
  std::atomic<uint64_t> magic;  // written last by the sender: the fifo is ready
  uint32_t version;
  int32_t sender;
  int32_t receiver;
  uint64_t capacity;
  std::atomic<uint32_t> opened;               // set by the receiver once it has mapped the fifo
  alignas(64) std::atomic<uint64_t> written;  // bytes ever sent (the sender's)
  alignas(64) std::atomic<uint64_t> read;     // bytes ever consumed (the receiver's)
};

static_assert(sizeof(FifoHeader) <= kPage);
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

// Where rank `r` stands among the sorted local ranks.
int position_of(const std::vector<int>& local_ranks, int r) {
  return int(std::find(local_ranks.begin(), local_ranks.end(), r) - local_ranks.begin());
}

// Store::wait, with an error that says what the keys stand for.
void wait_for(Store& store, const std::string& key, std::chrono::milliseconds timeout, const std::string& what) {
  try {
    store.wait({key}, timeout);
  } catch (const Error& e) {
    TINYDDP_FAIL(
        "shm transport: waited ", timeout.count(), " ms for ", what, " (store key ", key, "): ", e.message(),
        hint("every rank of this host must create the process group; look for one that failed or never started"));
  }
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
  return std::string(host) + "/" + read_first_line("/proc/sys/kernel/random/boot_id") + "/" +
         std::to_string(shm.st_dev) + ":" + std::to_string(shm.st_ino) + "/" + pid_ns;
}

// One mapping: the host's control table, or one fifo.
struct ShmTransport::Segment {
  std::string name;
  void* base = nullptr;
  size_t bytes = 0;
  // A created segment's name stays in /dev/shm until its peers have opened it and someone unlinked it.
  // A stop signal meanwhile (a launcher stops the ranks when one fails; Ctrl-C) unwinds nothing, so
  // from before the name exists this guard unlinks it first; the owner lets it go once the name is gone.
  std::optional<RemoveOnStopSignal> remove_if_stopped;

  ~Segment() {
    if (base) ::munmap(base, bytes);
  }
  ControlBlock* control(int position) const { return static_cast<ControlBlock*>(base) + position; }
  FifoHeader* fifo() const { return static_cast<FifoHeader*>(base); }
  std::byte* data() const { return static_cast<std::byte*>(base) + kPage; }

  // Creates and maps `bytes` bytes under `name`, reserved now so that a full /dev/shm fails here and
  // not with SIGBUS on first touch.
  static std::unique_ptr<Segment> create(const std::string& name, size_t bytes) {
    auto segment = std::make_unique<Segment>();
    segment->name = name;
    segment->bytes = bytes;
    segment->remove_if_stopped.emplace("/dev/shm" + name);
    int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    TINYDDP_CHECK(
        fd >= 0, "shm transport: shm_open(", name, ") failed: ", std::strerror(errno),
        hint("/dev/shm must be a writable tmpfs (in Docker: --ipc=host or --shm-size), or use the tcp transport"));
    int err = ::posix_fallocate(fd, 0, off_t(bytes));
    if (err == 0) segment->base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    const int map_err = errno;
    ::close(fd);
    if (err == 0 && segment->base != MAP_FAILED) return segment;
    segment->base = nullptr;
    ::shm_unlink(name.c_str());
    if (err != 0)
      TINYDDP_FAIL(
          "shm transport: could not reserve ", bytes, " bytes in /dev/shm for ", name, ": ", std::strerror(err),
          hint("enlarge /dev/shm (Docker: --shm-size=1g), lower TINYDDP_SHM_FIFO_BYTES, or use the tcp transport"));
    TINYDDP_FAIL("shm transport: mmap of ", bytes, " bytes failed: ", std::strerror(map_err), hint("check ulimit -v"));
  }

  // Maps the existing segment `name`; nullptr when there is none (yet) or it is still shorter than
  // `min_bytes` (its creator has not sized it yet).
  static std::unique_ptr<Segment> open(const std::string& name, size_t min_bytes, int rank) {
    int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
    if (fd < 0 && errno == ENOENT) return nullptr;
    TINYDDP_CHECK(fd >= 0, "shm transport: rank ", rank, " cannot open ", name, ": ", std::strerror(errno),
                  hint("ranks that share memory must run on one host, as one user, and see the same /dev/shm"));
    struct stat st {};
    ::fstat(fd, &st);
    if (size_t(st.st_size) < min_bytes) {
      ::close(fd);
      return nullptr;
    }
    auto segment = std::make_unique<Segment>();
    segment->name = name;
    segment->bytes = size_t(st.st_size);
    segment->base = ::mmap(nullptr, segment->bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    const int map_err = errno;
    ::close(fd);
    if (segment->base == MAP_FAILED) {
      segment->base = nullptr;
      TINYDDP_FAIL("shm transport: rank ", rank, " could not map ", name, ": ", std::strerror(map_err),
                   hint("check ulimit -v"));
    }
    return segment;
  }
};

// The connection to one local peer: our fifo to it (created on our first send) and its fifo to us
// (mapped once it has created it).
class ShmTransport::ShmConnection : public Connection {
 public:
  ShmConnection(ShmTransport& transport, int peer, ControlBlock* peer_control, size_t capacity, size_t in_capacity)
      : Connection(transport, peer), capacity_(capacity), in_capacity_(in_capacity), peer_control_(peer_control) {}

  ~ShmConnection() override { close(); }

  ControlBlock* peer_control() const { return peer_control_; }
  bool created() const { return out_fifo_ != nullptr; }
  bool mapped() const { return in_fifo_ != nullptr; }

  // Fresh looks at the peer's counters (each a cache line the other core writes).
  size_t send_room() const {
    const uint64_t read = out_ ? out_->read.load(std::memory_order_acquire) : 0;
    size_t room = capacity_ - (written_ - read);
    return room > send_pad_ ? room - send_pad_ : 0;
  }
  size_t recv_available() {
    if (!map_incoming()) return 0;
    uint64_t available = in_->written.load(std::memory_order_acquire) - read_;
    return available > recv_skip_ ? size_t(available - recv_skip_) : 0;
  }

  size_t try_send(const void* data, size_t n, size_t granule) override {
    if (!out_) create_outgoing();
    // The peer's read counter is looked at only when the room last seen is too small: a small
    // message then costs no cache miss on that line.
    if (capacity_ - (written_ - their_read_) < send_pad_ + n) {
      their_read_ = out_->read.load(std::memory_order_acquire);
      if (their_read_ > 0) out_fifo_->remove_if_stopped.reset();  // the peer read: it opened and unlinked the fifo
    }
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
    if (!map_incoming()) return {};
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
    if (n == 0) return;
    read_ += n;
    in_->read.store(read_, std::memory_order_release);  // the room is free for the sender again
    wake(peer_control_);
  }

  size_t bytes_per_turn() const override { return static_cast<const ShmTransport&>(transport()).bytes_per_turn_; }

  // Both ends compute the same skip: at the start of a collective the sender's count of bytes
  // written equals the receiver's count of bytes read. The fifo's data starts on a page, and both
  // ends know its capacity before it exists (planned_fifo_bytes).
  // A fifo of a few pages is left as it is: the skip could leave no room for an element.
  void align_send(size_t phase) override {
    if (capacity_ >= kMinAlignedFifo) send_pad_ += skip_to_phase(written_ + send_pad_, phase);
  }
  void align_recv(size_t phase) override {
    if (in_capacity_ >= kMinAlignedFifo) recv_skip_ += skip_to_phase(read_ + recv_skip_, phase);
  }

 private:
  ShmTransport& shm() const { return static_cast<ShmTransport&>(transport()); }

  // The fifo's name stays in /dev/shm until the peer opens it: the segment's stop-signal guard goes
  // once the peer is seen to have read (so opened) the fifo, or with the connection.
  void create_outgoing() {
    out_fifo_ = shm().create_fifo(peer());
    out_ = out_fifo_->fifo();
    out_data_ = out_fifo_->data();
  }

  // Maps the peer's fifo to us once its table entry says a new fifo of its is ready; true once mapped.
  bool map_incoming() {
    if (in_) return true;
    const uint32_t created = peer_control_->fifos_created.load(std::memory_order_acquire);
    if (created == fifos_seen_) return false;
    fifos_seen_ = created;
    in_fifo_ = shm().open_fifo(peer(), in_capacity_);
    if (!in_fifo_) return false;
    in_ = in_fifo_->fifo();
    in_data_ = in_fifo_->data();
    // Both ends hold it now: the name can go.
    in_->opened.store(1, std::memory_order_release);
    ::shm_unlink(in_fifo_->name.c_str());
    return true;
  }

  // Our fifo's name goes when nobody will open it any more: nothing was sent, or the peer has
  // closed, aborted or gone. Otherwise the peer still may, and unlinks it then (or when it closes).
  void close() {
    if (!out_fifo_ || out_->opened.load(std::memory_order_acquire) != 0) return;
    const bool peer_done = peer_control_->state.load(std::memory_order_acquire) != kOpen ||
                           (peer_control_->pid != ::getpid() && !process_alive(peer_control_->pid));
    if (written_ == 0 || peer_done) ::shm_unlink(out_fifo_->name.c_str());
  }

  std::unique_ptr<Segment> out_fifo_;  // ours to the peer, once created
  std::unique_ptr<Segment> in_fifo_;   // the peer's to us, once mapped
  FifoHeader* out_ = nullptr;
  std::byte* out_data_ = nullptr;
  FifoHeader* in_ = nullptr;
  const std::byte* in_data_ = nullptr;
  size_t capacity_;     // of our fifo to the peer
  size_t in_capacity_;  // of the peer's fifo to us (its TINYDDP_SHM_FIFO_BYTES may differ from ours)
  ControlBlock* peer_control_;
  uint32_t fifos_seen_ = 0;     // the peer's fifos_created when we last looked for its fifo
  uint64_t written_ = 0;        // our copy of out_->written (we are its only writer)
  uint64_t read_ = 0;           // our copy of in_->read (we are its only writer)
  uint64_t their_read_ = 0;     // out_->read as last seen (it only grows: the room is at least this)
  uint64_t their_written_ = 0;  // in_->written as last seen (likewise: at least this has arrived)
  size_t send_pad_ = 0;         // bytes the next send skips (align_send)
  size_t recv_skip_ = 0;        // bytes the next receive skips (align_recv)

  static size_t skip_to_phase(uint64_t position, size_t phase) {
    return size_t((phase % kPage + kPage - position % kPage) % kPage);
  }
};

ShmTransport::ShmTransport(Store& store, const std::string& prefix, int rank, const std::vector<int>& local_ranks,
                           std::chrono::milliseconds timeout, ShmTransportOptions options)
    : rank_(rank),
      position_(position_of(local_ranks, rank)),
      bytes_per_turn_(options.bytes_per_turn),
      local_ranks_(local_ranks) {
  TINYDDP_CHECK(position_ < int(local_ranks.size()), "shm transport: rank ", rank, " is not among the local ranks",
                hint("this is a bug in the caller"));
  const size_t fifo_bytes = options.fifo_bytes ? options.fifo_bytes : configured_fifo_bytes();
  fifo_bytes_ = round_up(std::max<size_t>(fifo_bytes, kPage), kPage);
  // Every local rank sees the same numbers, so all of them refuse together.
  const std::string does_not_fit = job_does_not_fit(estimate_job(int(local_ranks.size()), fifo_bytes_, 0),
                                                    read_host_capacity());
  TINYDDP_CHECK(does_not_fit.empty(), "shm transport: ", does_not_fit);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a(prefix)));
  name_stem_ = "/tinyddp-" + std::string(hex);
  map_control_table(store, prefix, timeout);
  connections_.resize(size_t(*std::max_element(local_ranks.begin(), local_ranks.end())) + 1);
}

// The lowest local rank creates the table; every local rank maps it and fills in its own entry;
// once all of them have (counted per host: the ranks of every host share the store, and a count
// over all of them would let one host's ranks unlink before a slower rank of another has mapped),
// the name goes.
void ShmTransport::map_control_table(Store& store, const std::string& prefix, std::chrono::milliseconds timeout) {
  const int n = int(local_ranks_.size());
  const size_t bytes = round_up(size_t(n) * sizeof(ControlBlock), kPage);
  const std::string host_key = prefix + "shm/host-" + std::to_string(local_ranks_.front()) + "/";
  const std::string first = "rank " + std::to_string(local_ranks_.front());
  // The table's name lives in /dev/shm until every local rank has mapped it, which may take as long as
  // the slowest rank's start (a peer that died before it mapped the table leaves this rank waiting
  // for the launcher's SIGTERM): the segment's guard holds it until it is unlinked below.
  if (position_ == 0) {
    table_ = Segment::create(name_stem_ + "-table-" + std::to_string(rank_) + "-" + std::to_string(::getpid()), bytes);
    for (int i = 0; i < n; ++i) new (table_->control(i)) ControlBlock{};
    store.set(host_key + "table", table_->name);
  } else {
    wait_for(store, host_key + "table", timeout, first + "'s shared-memory control table");
    const std::string name = store.get(host_key + "table");
    table_ = Segment::open(name, bytes, rank_);
    TINYDDP_CHECK(table_ != nullptr, "shm transport: rank ", rank_, " cannot open ", first, "'s control table ", name,
                  hint("ranks that share memory must run on one host, as one user, and see the same /dev/shm"));
  }
  try {
    ControlBlock* mine = table_->control(position_);
    mine->version = kVersion;
    mine->rank = rank_;
    mine->pid = ::getpid();
    mine->fifo_bytes = fifo_bytes_;
    mine->magic.store(kMagic, std::memory_order_release);
    if (store.add(host_key + "mapped", 1) == n) store.set(host_key + "all_mapped", "1");
    wait_for(store, host_key + "all_mapped", timeout, "every rank of this host to map the control table");
  } catch (...) {
    if (position_ == 0) ::shm_unlink(table_->name.c_str());
    throw;
  }
  if (position_ == 0) {
    ::shm_unlink(table_->name.c_str());
    table_->remove_if_stopped.reset();
  }
  for (int i = 0; i < n; ++i) {
    const ControlBlock* c = table_->control(i);
    TINYDDP_CHECK(c->magic.load(std::memory_order_acquire) == kMagic && c->version == kVersion &&
                      c->rank == local_ranks_[size_t(i)],
                  "shm transport: rank ", local_ranks_[size_t(i)], "'s entry in the control table ", table_->name,
                  " is not one of this tinyddp version", hint("every rank must run the same tinyddp build"));
  }
}

bool ShmTransport::ring_neighbours(int a, int b) const {
  const int n = int(local_ranks_.size());
  const int distance = std::abs(position_of(local_ranks_, a) - position_of(local_ranks_, b));
  return distance == 1 || distance == n - 1;
}

// Unique per job, group, direction and sender process, so a crashed earlier run can never be
// mistaken for this one; the receiver knows every part of it.
std::string ShmTransport::fifo_name(int sender, int receiver, int sender_pid) const {
  return name_stem_ + "-" + std::to_string(sender) + "to" + std::to_string(receiver) + "-" + std::to_string(sender_pid);
}

std::unique_ptr<ShmTransport::Segment> ShmTransport::create_fifo(int receiver) {
  const size_t capacity = planned_fifo_bytes(fifo_bytes_, ring_neighbours(rank_, receiver));
  auto segment = Segment::create(fifo_name(rank_, receiver, ::getpid()), kPage + capacity);
  auto* header = new (segment->base) FifoHeader{};
  header->version = kVersion;
  header->sender = rank_;
  header->receiver = receiver;
  header->capacity = capacity;
  header->magic.store(kMagic, std::memory_order_release);
  table_->control(position_)->fifos_created.fetch_add(1, std::memory_order_acq_rel);
  return segment;
}

std::unique_ptr<ShmTransport::Segment> ShmTransport::open_fifo(int sender, size_t capacity) {
  const ControlBlock* theirs = table_->control(position_of(local_ranks_, sender));
  auto segment = Segment::open(fifo_name(sender, rank_, theirs->pid), kPage, rank_);
  if (!segment || segment->fifo()->magic.load(std::memory_order_acquire) != kMagic) return nullptr;  // not ready yet
  const FifoHeader* h = segment->fifo();
  TINYDDP_CHECK(h->version == kVersion && h->sender == sender && h->receiver == rank_ && h->capacity == capacity &&
                    segment->bytes == kPage + capacity,
                "shm transport: rank ", sender, "'s fifo ", segment->name, " to rank ", rank_,
                " is not one of this tinyddp version and group", hint("every rank must run the same tinyddp build"));
  return segment;
}

ShmTransport::~ShmTransport() {
  ControlBlock* me = table_->control(position_);
  uint32_t open = kOpen;
  me->state.compare_exchange_strong(open, kClosed, std::memory_order_acq_rel);
  for (int i = 0; i < int(local_ranks_.size()); ++i)
    if (i != position_) wake(table_->control(i));
  // Fifos to us that we never opened: nobody reads them now.
  for (int i = 0; i < int(local_ranks_.size()); ++i) {
    const int r = local_ranks_[size_t(i)];
    if (r == rank_ || (connections_[size_t(r)] && connections_[size_t(r)]->mapped())) continue;
    ::shm_unlink(fifo_name(r, rank_, table_->control(i)->pid).c_str());
  }
  connections_.clear();
}

Connection* ShmTransport::connection(int peer) {
  if (peer == rank_ || peer < 0 || peer >= int(connections_.size())) return nullptr;
  const int position = position_of(local_ranks_, peer);
  if (position == int(local_ranks_.size())) return nullptr;
  std::lock_guard<std::mutex> lock(connections_mutex_);
  auto& connection = connections_[size_t(peer)];
  if (!connection) {
    ControlBlock* theirs = table_->control(position);
    const bool neighbours = ring_neighbours(rank_, peer);
    connection = std::make_unique<ShmConnection>(*this, peer, theirs, planned_fifo_bytes(fifo_bytes_, neighbours),
                                                 planned_fifo_bytes(theirs->fifo_bytes, neighbours));
  }
  return connection.get();
}

ShmTransport::FifoCounts ShmTransport::fifo_counts() const {
  std::lock_guard<std::mutex> lock(connections_mutex_);
  FifoCounts counts;
  for (const auto& c : connections_) {
    if (!c) continue;
    counts.created += c->created() ? 1 : 0;
    counts.mapped += c->mapped() ? 1 : 0;
  }
  return counts;
}

void ShmTransport::sleep_once(std::span<const WaitFor> waits, std::chrono::microseconds max_sleep) {
  ControlBlock* me = table_->control(position_);
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

void ShmTransport::sleep_until(const std::function<bool()>& ready, std::chrono::microseconds max_sleep) {
  ControlBlock* me = table_->control(position_);
  // The same announcement as sleep_once's, for the same reason.
  me->sleepers.fetch_add(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  uint32_t bell = me->doorbell.load(std::memory_order_seq_cst);
  if (!ready()) futex_wait(&me->doorbell, bell, max_sleep);
  me->sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

void ShmTransport::wake_local_peers() {
  for (int i = 0; i < int(local_ranks_.size()); ++i)
    if (i != position_) wake(table_->control(i));
}

namespace {

// The verdict on local peer `peer` (control block `c`), found gone and/or closed, read in that order:
// a rank closes its group before it exits, so a peer found gone and then read as closed ended cleanly
// (its program was done) and is held to the closed peer's grace; one gone without closing died.
void fail_if_ended(int peer, const ControlBlock* c, bool gone, bool closed, int me,
                   std::chrono::milliseconds stalled_for) {
  if (gone && !closed)
    TINYDDP_FAIL("shm transport: rank ", peer, " (pid ", c->pid, ") died while rank ", me,
                 " was in a collective with it",
                 hint("look at rank ", peer, "'s output and exit status (killed by a signal? out of memory?)"));
  if (closed && stalled_for >= kClosedGrace)
    TINYDDP_FAIL("shm transport: rank ", peer, " closed its process group while rank ", me, " still waits for it",
                 hint("every rank must make the same collective calls before shutting down"));
}

}  // namespace

void ShmTransport::check_peer(int peer, std::chrono::milliseconds stalled_for) {
  const int position = position_of(local_ranks_, peer);
  TINYDDP_CHECK(position < int(local_ranks_.size()), "shm transport: rank ", peer, " is not on rank ", rank_, "'s host",
                hint("this is a bug in the caller"));
  ControlBlock* c = table_->control(position);
  const bool gone = c->pid != ::getpid() && !process_alive(c->pid);
  const uint32_t state = c->state.load(std::memory_order_acquire);
  if (state == kAborted) {
    std::string reason(c->reason, strnlen(c->reason, sizeof c->reason));
    TINYDDP_FAIL("shm transport: rank ", peer, " aborted: ", reason,
                 hint("look at rank ", peer, "'s own output for the first error"));
  }
  fail_if_ended(peer, c, gone, state == kClosed, rank_, stalled_for);
}

void ShmTransport::check_peers(std::chrono::milliseconds stalled_for, std::span<const int> awaited) {
  // Aborted peers first: their reason names the rank that failed first.
  for (int i = 0; i < int(local_ranks_.size()); ++i) {
    ControlBlock* c = table_->control(i);
    if (i != position_ && c->state.load(std::memory_order_acquire) == kAborted) {
      std::string reason(c->reason, strnlen(c->reason, sizeof c->reason));
      TINYDDP_FAIL("shm transport: rank ", c->rank, " aborted: ", reason,
                   hint("look at rank ", c->rank, "'s own output for the first error"));
    }
  }
  std::vector<ShmConnection*> peers;
  {
    std::lock_guard<std::mutex> lock(connections_mutex_);
    for (auto& c : connections_)
      if (c) peers.push_back(c.get());
  }
  // A peer that is gone (or closed) is a failure only once everything it sent us has been read: a
  // rank may send its last bytes and exit at once, and those bytes stay in its fifo, readable,
  // after the process has left. The order matters: whether it is gone first, the unread bytes
  // after; every byte it wrote before it went is visible by then, so none is missed in between.
  // A peer that closed its group before it went ended cleanly (fail_if_ended): its part of the
  // collective may be done while this rank still waits for others, so only an awaited one counts.
  for (ShmConnection* peer : peers) {
    const int r = peer->peer();
    ControlBlock* c = peer->peer_control();
    const bool gone = c->pid != ::getpid() && !process_alive(c->pid);
    const bool closed = c->state.load(std::memory_order_acquire) == kClosed;
    if (!gone && !closed) continue;
    if (closed && std::find(awaited.begin(), awaited.end(), r) == awaited.end()) continue;
    if (peer->recv_available() > 0) continue;  // still ours to read: the caller makes progress first
    fail_if_ended(r, c, gone, closed, rank_, stalled_for);
  }
}

void ShmTransport::abort(const std::string& reason) {
  ControlBlock* me = table_->control(position_);
  size_t n = std::min(reason.size(), sizeof me->reason - 1);
  std::memcpy(me->reason, reason.data(), n);
  me->reason[n] = 0;
  me->state.store(kAborted, std::memory_order_release);
  for (int i = 0; i < int(local_ranks_.size()); ++i)
    if (i != position_) wake(table_->control(i));
}

}  // namespace tinyddp::comm
