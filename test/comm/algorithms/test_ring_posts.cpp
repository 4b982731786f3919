// When the ring engine offers a transport a copy region (Connection::post_recv), so that a receiver
// thread can put the bytes straight into the caller's buffer. The engine posts each all-gather
// region ahead, while it still reduces, but only once this rank has sent the bytes it reads from
// that memory before receiving into it (an in-place all-reduce first sends the very chunk its
// all-gather receives into). Bytes it forwards after receiving them do not hold the post back.
//
// The ranks here talk through an in-memory transport that records every post and how many bytes
// its rank had sent at that moment; it ignores the posts otherwise (a transport may), so the
// engine's choices are seen without any transport's own rules in between.
#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "tinyddp/comm/algorithms/ring.h"
#include "tinyddp/comm/transport/transport.h"
#include "test/comm/test_collectives_support.h"

using namespace tinyddp;
using namespace tinyddp::comm;

namespace {

// One direction between two ranks: a single-producer, single-consumer byte ring.
struct Pipe {
  static constexpr size_t kCapacity = 256 << 10;
  std::vector<std::byte> bytes = std::vector<std::byte>(kCapacity);
  std::atomic<uint64_t> written{0}, read{0};
};

class MemoryTransport : public Transport {
 public:
  const char* name() const override { return "memory"; }
  Connection* connection(int) override { return nullptr; }
  void sleep_once(std::span<const WaitFor>, std::chrono::microseconds) override { std::this_thread::yield(); }
  void check_peers(std::chrono::milliseconds, std::span<const int>) override {}
  void abort(const std::string&) override {}
};

struct Post {
  const std::byte* dst;
  size_t bytes, skip;
  uint64_t rank_had_sent;  // bytes this rank had sent to its next rank when it posted
};

class MemoryConnection : public Connection {
 public:
  MemoryConnection(Transport& transport, int peer, Pipe* out, Pipe* in, const std::atomic<uint64_t>* rank_sent)
      : Connection(transport, peer), out_(out), in_(in), rank_sent_(rank_sent) {}

  size_t try_send(const void* data, size_t n, size_t) override {
    uint64_t w = out_->written.load(std::memory_order_relaxed);
    size_t room = Pipe::kCapacity - size_t(w - out_->read.load(std::memory_order_acquire));
    size_t k = std::min(n, room), at = size_t(w % Pipe::kCapacity), first = std::min(k, Pipe::kCapacity - at);
    std::memcpy(out_->bytes.data() + at, data, first);
    std::memcpy(out_->bytes.data(), static_cast<const std::byte*>(data) + first, k - first);
    out_->written.store(w + k, std::memory_order_release);
    return k;
  }
  size_t try_recv(void* dst, size_t n) override {
    size_t got = 0;
    for (auto piece = try_peek(n); !piece.empty() && got < n; piece = try_peek(n - got)) {
      std::memcpy(static_cast<std::byte*>(dst) + got, piece.data(), piece.size());
      got += piece.size();
      release(piece.size());
    }
    return got;
  }
  std::span<const std::byte> try_peek(size_t max) override {
    uint64_t r = in_->read.load(std::memory_order_relaxed);
    size_t at = size_t(r % Pipe::kCapacity);
    size_t n = std::min({size_t(in_->written.load(std::memory_order_acquire) - r), Pipe::kCapacity - at, max});
    return {in_->bytes.data() + at, n};
  }
  void release(size_t n) override {
    in_->read.store(in_->read.load(std::memory_order_relaxed) + n, std::memory_order_release);
  }
  void post_recv(std::byte* dst, size_t n, size_t skip) override {
    posts.push_back({dst, n, skip, rank_sent_->load(std::memory_order_acquire)});
  }

  std::vector<Post> posts;

 private:
  Pipe *out_, *in_;
  const std::atomic<uint64_t>* rank_sent_;
};

// A post as the test reads it: where in the rank's buffer it starts.
struct PostAt {
  size_t offset, bytes, skip;
  uint64_t rank_had_sent;
};

// Runs an in-place f32 sum all-reduce of world * chunk bytes over the in-memory transport, checks
// the result, and returns each rank's posts (the all-gather receives, from rank r-1).
std::vector<std::vector<PostAt>> ring_posts(int world, size_t chunk) {
  const size_t ranks = static_cast<size_t>(world), count = ranks * chunk / sizeof(float);
  std::vector<Pipe> pipes(ranks);  // pipes[r]: rank r -> rank r+1
  std::vector<MemoryTransport> transports(ranks);
  std::vector<std::unique_ptr<MemoryConnection>> next(ranks), prev(ranks);
  for (int r = 0; r < world; ++r) {
    const int after = (r + 1) % world, before = (r + world - 1) % world;
    Pipe* out = &pipes[size_t(r)];
    next[size_t(r)] = std::make_unique<MemoryConnection>(transports[size_t(r)], after, out, nullptr, &out->written);
    prev[size_t(r)] = std::make_unique<MemoryConnection>(transports[size_t(r)], before, nullptr, &pipes[size_t(before)],
                                                         &out->written);
  }
  std::vector<std::vector<float>> buffers(ranks);
  for (int r = 0; r < world; ++r)
    for (size_t i = 0; i < count; ++i) buffers[size_t(r)].push_back(float((i % 251) * size_t(r + 1)));
  testing::run_ranks(world, [&](int r) {
    Transport* mine = &transports[size_t(r)];
    CollectiveContext ctx;
    ctx.rank = r;
    ctx.world_size = world;
    ctx.timeout = std::chrono::seconds(20);
    ctx.deadline = std::chrono::steady_clock::now() + ctx.timeout;
    ctx.transports = {&mine, 1};
    auto* data = reinterpret_cast<std::byte*>(buffers[size_t(r)].data());
    ring_all_reduce(Ring{r, world, next[size_t(r)].get(), prev[size_t(r)].get()}, data, data, count, ctx);
  });
  const float ranks_sum = float(world * (world + 1) / 2);
  std::vector<std::vector<PostAt>> posts(ranks);
  for (int r = 0; r < world; ++r) {
    for (size_t i = 0; i < count; ++i)
      if (buffers[size_t(r)][i] != float(i % 251) * ranks_sum)
        FAIL("rank ", r, " element ", i, " = ", buffers[size_t(r)][i]);
    auto* base = reinterpret_cast<const std::byte*>(buffers[size_t(r)].data());
    for (const Post& post : prev[size_t(r)]->posts)
      posts[size_t(r)].push_back({size_t(post.dst - base), post.bytes, post.skip, post.rank_had_sent});
  }
  return posts;
}

}  // namespace

TEST_CASE("the ring engine posts every all-gather region, after sending what it reads from there") {
  // 3 ranks: all-gather receives every chunk but the one the rank finished (chunk r+1): first chunk
  // r, which the rank also sent first (reduce-scatter, step 0) and forwards once received, then
  // chunk r-1. A post may come late and cover only the rest of its region (the consumer had begun
  // it), but every region gets one.
  const int world = 3;
  const size_t chunk = 512 << 10;
  auto posts = ring_posts(world, chunk);
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    REQUIRE(posts[size_t(r)].size() == size_t(world - 1));
    for (size_t k = 0; k < size_t(world - 1); ++k) {
      CAPTURE(k);
      const PostAt& post = posts[size_t(r)][k];
      const size_t chunk_begin = size_t((r - int(k) + world) % world) * chunk;
      CHECK(post.offset >= chunk_begin);
      CHECK(post.offset + post.bytes == chunk_begin + chunk);
    }
    // Chunk r is read by the reduce-scatter's first send: posted only once all of it had left.
    CHECK(posts[size_t(r)][0].rank_had_sent >= chunk);
  }
}

TEST_CASE("the ring engine posts a 2-rank all-gather region ahead, while it still reduces") {
  // One segment per chunk: the first turn sends all of chunk r, so the next offers the all-gather
  // region (chunk r again, in place) before a single byte of the reduce-scatter has been taken.
  const size_t chunk = 64 << 10;
  auto posts = ring_posts(2, chunk);
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    REQUIRE(posts[size_t(r)].size() == 1);
    const PostAt& post = posts[size_t(r)][0];
    CHECK(post.offset == size_t(r) * chunk);
    CHECK(post.bytes == chunk);
    CHECK(post.skip == chunk);  // the whole reduce-scatter half still ahead of it
    CHECK(post.rank_had_sent >= chunk);
  }
}
