#include "tinyddp/comm/symmetric/symmetric_buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>

#include "tinyddp/comm/store/store.h"
#include "tinyddp/core/error.h"
#include "tinyddp/core/process.h"
#include "tinyddp/core/short_list.h"

namespace tinyddp::comm {

namespace {

constexpr uint64_t kMagic = 0x4d4d5953444454ull;  // "TDDSYMM"
constexpr uint32_t kVersion = 3;
constexpr size_t kPage = 4096;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// The first page of a rank's part. Its owner writes everything; the peers only read.
struct PartHeader {
  uint64_t magic;
  uint32_t version;
  int32_t rank;
  uint64_t bytes;
  // The owner's progress, in the entry of each step's parity: the step and the call it announces,
  // written call first, on one cache line, so that a peer waiting for the step takes the call with
  // it. A peer one step ahead writes the other entry, so the one being read never changes under the
  // reader.
  struct alignas(64) Announcement {
    SymmetricCall call;
    std::atomic<uint64_t> step;
  };
  Announcement announced[2];
};
static_assert(sizeof(PartHeader::Announcement) == 64, "a step and its call share one cache line");
static_assert(sizeof(PartHeader) <= kPage);
static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared-memory atomics must be lock-free across processes");

std::string key_of(const std::string& prefix, int index, int rank) {
  return prefix + std::to_string(index) + "/" + std::to_string(rank);
}

}  // namespace

// One rank's part, as mapped in this process. `fd` is open only in the part this rank created, and
// only until every peer has opened the file through it.
struct SymmetricBuffer::Part {
  void* base = nullptr;
  size_t mapped = 0;
  int fd = -1;

  ~Part() {
    if (base) ::munmap(base, mapped);
    if (fd >= 0) ::close(fd);
  }
  PartHeader* header() const { return static_cast<PartHeader*>(base); }
  std::byte* data() const { return static_cast<std::byte*>(base) + kPage; }
};

bool SymmetricBuffer::peers_openable() {
  char target[32] = {};
  const ssize_t n = ::readlink("/proc/self", target, sizeof(target) - 1);
  return n > 0 && std::string(target, size_t(n)) == std::to_string(::getpid());
}

std::shared_ptr<SymmetricBuffer> SymmetricBuffer::allocate(Store& store, const std::string& key_prefix, int index,
                                                           int rank, const std::vector<int>& local_ranks, size_t bytes,
                                                           std::chrono::milliseconds timeout) {
  const std::string what = "symmetric allocation #" + std::to_string(index) + " (" + std::to_string(bytes) + " bytes)";
  std::shared_ptr<SymmetricBuffer> buffer(new SymmetricBuffer());
  buffer->index_ = index;
  buffer->bytes_ = bytes;
  buffer->ranks_ = local_ranks;
  buffer->position_ = int(std::find(local_ranks.begin(), local_ranks.end(), rank) - local_ranks.begin());
  TINYDDP_CHECK(buffer->position_ < int(local_ranks.size()), what, ": rank ", rank, " is not among the host's ranks",
                hint("this is a bug in the caller"));
  const size_t mapped = kPage + round_up(std::max<size_t>(bytes, 1), kPage);
  buffer->parts_.resize(local_ranks.size());

  // This rank's part: an anonymous file, its pages reserved now.
  auto mine = std::make_unique<Part>();
  // Named after the key prefix's last part ("symmetric", "cross-memory"): /proc/<pid>/maps shows it.
  const std::string stem = key_prefix.substr(0, key_prefix.size() - 1);
  const std::string name = "tinyddp-" + stem.substr(stem.rfind('/') + 1) + "-" + std::to_string(index) + "-rank" +
                           std::to_string(rank);
  mine->fd = ::memfd_create(name.c_str(), MFD_CLOEXEC);
  TINYDDP_CHECK(mine->fd >= 0, what, ": rank ", rank, ": memfd_create failed: ", std::strerror(errno),
                hint("symmetric memory needs Linux 3.17 or later; use ordinary tensors instead"));
  if (int err = ::posix_fallocate(mine->fd, 0, off_t(mapped)); err != 0)
    TINYDDP_FAIL(what, ": rank ", rank, " could not reserve ", mapped, " bytes of shared memory: ", std::strerror(err),
                 hint("the host is short of memory (free, or the container's memory limit); allocate less, or use "
                      "ordinary tensors"));
  mine->base = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, mine->fd, 0);
  if (mine->base == MAP_FAILED) {
    mine->base = nullptr;
    TINYDDP_FAIL(what, ": rank ", rank, ": mmap of ", mapped, " bytes failed: ", std::strerror(errno),
                 hint("check ulimit -v"));
  }
  mine->mapped = mapped;
  auto* header = new (mine->base) PartHeader{};
  header->magic = kMagic;
  header->version = kVersion;
  header->rank = rank;
  header->bytes = bytes;
  buffer->parts_[size_t(buffer->position_)] = std::move(mine);

  // Meet the host's other ranks: each publishes where its part is, then maps everyone's.
  store.set(key_of(key_prefix, index, rank), std::to_string(::getpid()) + " " +
                                                 std::to_string(buffer->parts_[size_t(buffer->position_)]->fd) + " " +
                                                 std::to_string(bytes));
  std::vector<std::string> keys;
  for (int r : local_ranks) keys.push_back(key_of(key_prefix, index, r));
  try {
    store.wait(keys, timeout);
  } catch (const Error& e) {
    std::vector<int> missing;
    for (size_t i = 0; i < keys.size(); ++i)
      if (!store.check({keys[i]})) missing.push_back(local_ranks[i]);
    TINYDDP_FAIL(
        what, ": rank ", rank, " waited ", timeout.count(), " ms for rank(s) ",
        short_list(missing, 8, [](int r) { return std::to_string(r); }), " to allocate theirs: ", e.message(),
        hint("every rank of the host must call allocate_symmetric the same number of times, in the same order"));
  }
  const std::vector<std::string> where = store.multi_get(keys);
  for (size_t p = 0; p < local_ranks.size(); ++p) {
    if (int(p) == buffer->position_) continue;
    const int peer = local_ranks[p];
    int pid = 0, fd = -1;
    unsigned long long their_bytes = 0;
    TINYDDP_CHECK(std::sscanf(where[p].c_str(), "%d %d %llu", &pid, &fd, &their_bytes) == 3, what, ": rank ", peer,
                  " published '", where[p], "'", hint("every rank must run the same tinyddp build"));
    TINYDDP_CHECK(their_bytes == bytes, what, ": rank ", peer, " allocated ", their_bytes, " bytes where rank ", rank,
                  " allocated ", bytes,
                  hint("every rank of the host must make the same allocate_symmetric calls, in the "
                       "same order, with the same sizes"));
    const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
    auto part = std::make_unique<Part>();
    int peer_fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (peer_fd < 0) {
      const int err = errno;
      TINYDDP_CHECK(pid == ::getpid() || process_alive(pid), what, ": rank ", peer, " (pid ", pid,
                    ") died before rank ", rank, " could map its part", hint("look at rank ", peer, "'s output"));
      TINYDDP_FAIL(what, ": rank ", rank, " cannot open rank ", peer, "'s part (", path, "): ", std::strerror(err),
                   hint("the ranks of a host must run as one user and see each other's /proc (no hidepid); else use "
                        "ordinary tensors"));
    }
    struct stat st {};
    ::fstat(peer_fd, &st);
    if (size_t(st.st_size) < mapped) {
      ::close(peer_fd);
      TINYDDP_FAIL(what, ": rank ", peer, "'s part is ", st.st_size, " bytes, not ", mapped,
                   hint("every rank must run the same tinyddp build"));
    }
    part->base = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, peer_fd, 0);
    const int map_err = errno;
    ::close(peer_fd);  // the mapping keeps the file
    if (part->base == MAP_FAILED) {
      part->base = nullptr;
      TINYDDP_FAIL(what, ": rank ", rank, " could not map rank ", peer, "'s part: ", std::strerror(map_err),
                   hint("check ulimit -v"));
    }
    part->mapped = mapped;
    const PartHeader* theirs = part->header();
    TINYDDP_CHECK(theirs->magic == kMagic && theirs->version == kVersion && theirs->rank == peer &&
                      theirs->bytes == bytes,
                  what, ": rank ", peer, "'s part (", path, ") is not one of this tinyddp version and allocation",
                  hint("every rank must run the same tinyddp build"));
    buffer->parts_[p] = std::move(part);
  }
  // Every part must stay open until every peer has mapped it: a rank that returned at once could
  // free its buffer (and close the file) before a slower peer opened it. After this the mappings
  // alone keep the memory, and the file descriptor goes.
  const std::string mapped_key = key_prefix + std::to_string(index) + "/mapped";
  if (store.add(mapped_key, 1) == int64_t(local_ranks.size())) store.set(mapped_key + "/all", "1");
  try {
    store.wait({mapped_key + "/all"}, timeout);
  } catch (const Error& e) {
    TINYDDP_FAIL(what, ": rank ", rank, " waited ", timeout.count(),
                 " ms for every rank of the host to map it: ", e.message(),
                 hint("a rank failed or stopped between allocating and mapping; look at the others' output"));
  }
  Part& own = *buffer->parts_[size_t(buffer->position_)];
  ::close(own.fd);
  own.fd = -1;
  buffer->peers_mapped_ = true;
  return buffer;
}

SymmetricBuffer::~SymmetricBuffer() = default;

std::byte* SymmetricBuffer::data() const { return parts_[size_t(position_)]->data(); }

std::byte* SymmetricBuffer::data_of(int p) const {
  const auto& part = parts_[size_t(p)];
  return part ? part->data() : nullptr;
}

void SymmetricBuffer::release_peers() {
  for (size_t p = 0; p < parts_.size(); ++p)
    if (int(p) != position_) parts_[p].reset();
  peers_mapped_ = false;
}

void SymmetricBuffer::publish(uint64_t step) {
  my_step_ = step;
  parts_[size_t(position_)]->header()->announced[step & 1].step.store(step, std::memory_order_release);
}

void SymmetricBuffer::set_call(uint64_t step, const SymmetricCall& call) {
  parts_[size_t(position_)]->header()->announced[step & 1].call = call;
}

bool SymmetricBuffer::reached(int p, uint64_t step) const {
  return parts_[size_t(p)]->header()->announced[step & 1].step.load(std::memory_order_acquire) >= step;
}

SymmetricCall SymmetricBuffer::call_of(int p, uint64_t step) const {
  return parts_[size_t(p)]->header()->announced[step & 1].call;
}

}  // namespace tinyddp::comm
