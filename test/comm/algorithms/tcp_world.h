// TcpWorld: `world` ranks on threads of this process, every pair connected over tcp, for driving
// an algorithm directly (with host layouts one machine's host identity cannot show) rather than
// through a ProcessGroup.
#pragma once

#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "tinyddp/comm/algorithms/peer_group.h"
#include "tinyddp/comm/store/hash_store.h"
#include "tinyddp/comm/transport/tcp_transport.h"
#include "test/comm/test_collectives_support.h"

namespace tinyddp::testing {

// `world` ranks on threads, every pair connected over tcp.
class TcpWorld {
 public:
  explicit TcpWorld(int world) : transports_(size_t(world)), own_(size_t(world)) {
    auto store = std::make_shared<comm::HashStore>();
    store->set_timeout(std::chrono::seconds(20));
    const std::vector<std::string> ids(size_t(world), "one-host");
    const std::vector<int> pids(size_t(world), int(::getpid()));
    run_ranks(world, [&](int r) {
      std::vector<int> peers;
      for (int p = 0; p < world; ++p)
        if (p != r) peers.push_back(p);
      if (peers.empty()) return;
      transports_[size_t(r)] = std::make_unique<comm::TcpTransport>(*store, "algo/", r, peers, ids, pids,
                                                                    std::chrono::seconds(20));
      own_[size_t(r)] = {transports_[size_t(r)].get()};
    });
  }
  int size() const { return int(transports_.size()); }
  comm::CollectiveContext context(int rank, DType dtype, comm::ReduceOp op) const {
    comm::CollectiveContext ctx;
    ctx.rank = rank;
    ctx.dtype = dtype;
    ctx.op = op;
    ctx.world_size = size();
    ctx.timeout = std::chrono::seconds(20);
    ctx.deadline = std::chrono::steady_clock::now() + ctx.timeout;
    ctx.transports = own_[size_t(rank)];
    return ctx;
  }
  comm::ConnectionLookup lookup(int rank) const {
    comm::TcpTransport* t = transports_[size_t(rank)].get();
    return [t](int peer) { return t ? t->connection(peer) : nullptr; };  // a world of 1 has no transport
  }
  // Every rank's connection as `rank` sees it (nullptr at itself), as the direct algorithms take them.
  std::vector<comm::Connection*> all_peers(int rank) const {
    std::vector<comm::Connection*> peers(size_t(size()), nullptr);
    for (int p = 0; p < size(); ++p)
      if (p != rank) peers[size_t(p)] = transports_[size_t(rank)]->connection(p);
    return peers;
  }
  comm::PeerGroup everyone(int rank) const {
    comm::PeerGroup g{rank, {}, lookup(rank)};
    for (int r = 0; r < size(); ++r) g.members.push_back(r);
    return g;
  }

 private:
  std::vector<std::unique_ptr<comm::TcpTransport>> transports_;
  std::vector<std::vector<comm::Transport*>> own_;
};

inline std::byte* bytes_of(const Tensor& t) { return static_cast<std::byte*>(const_cast<void*>(t.raw_data())); }

}  // namespace tinyddp::testing
