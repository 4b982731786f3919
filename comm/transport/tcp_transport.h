// TcpTransport: a full mesh of TCP connections between the ranks of a group.
//
// Setup (tcp_setup.h): every rank listens on a free port of one address (loopback when every peer
// shares its host, else the interface that faces the other hosts, tcp_address.h) and publishes it
// in the store; the higher rank of each pair connects to the lower one, twice: one socket per
// direction. A handshake with digests of the group and of the job token TINYDDP_TOKEN keeps
// strangers, stale ranks of earlier jobs and other groups out.
//
// The data path (this file's .cpp): the sockets are tuned for bulk transfer between two cores:
// TCP_NODELAY (a step's last bytes must not wait for Nagle's timer), optionally fixed large kernel
// buffers, one socket per direction. The communication thread sends with non-blocking send(); a
// receiver thread per peer drains the incoming socket into an inbox (a circular buffer) the
// algorithms read in place, so both directions move at once. Bytes that are only to be copied
// somewhere (a posted receive, Connection::post_recv) go there directly instead.
//
// Failure detection: a peer that dies closes its sockets (the kernel does it), so the next read
// returns EOF, or the next write EPIPE, and the rank names it at once. A neighbour that aborts
// because someone else died closes its sockets too, so the first broken connection may not lead
// to the culprit: the error therefore also names peers on this host whose process is gone (pid
// checks) and every peer whose connection was found closed (each rank watches all of them).
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tinyddp/comm/store/store.h"
#include "tinyddp/comm/transport/transport.h"

namespace tinyddp::comm {

struct TcpTransportOptions {
  std::string token;  // the job's shared secret (TINYDDP_TOKEN); both sides must agree
  // SO_SNDBUF / SO_RCVBUF in bytes; 0 keeps the kernel's auto-tuning (which grows to tcp_rmem's max).
  size_t socket_buffer_bytes = 0;
  // The address peers on other hosts connect to, and the only one this rank listens on. Empty:
  // found as tcp_address.h says (TINYDDP_SOCKET_ADDR, TINYDDP_IFNAME, the route to `route_to`, ...).
  // A rank whose peers all share its host listens on 127.0.0.1 instead; a peer on this host dials
  // whatever address the rank published, like every other peer.
  std::string advertise_address;
  // A host the ranks all reach (the store's): the interface toward it is the one that faces them.
  std::string route_to;
  // Listen on every address (INADDR_ANY), as TINYDDP_BIND_ALL=1 asks: only for hosts whose peers
  // come in through an address this host cannot name (NAT, some containers).
  bool bind_all = false;
};

class TcpTransport : public Transport {
 public:
  // Connects `rank` with every rank in `peers`. `host_ids[r]` is rank r's host identity (equal
  // identities talk over loopback) and `pids[r]` its process id (checked for peers on this host).
  // Keys go under `prefix` in `store`; bounded by `timeout`.
  TcpTransport(Store& store, const std::string& prefix, int rank, const std::vector<int>& peers,
               const std::vector<std::string>& host_ids, const std::vector<int>& pids,
               std::chrono::milliseconds timeout, TcpTransportOptions options = {});
  ~TcpTransport() override;

  const char* name() const override { return "tcp"; }
  Connection* connection(int peer) override;
  void sleep_once(std::span<const WaitFor> waits, std::chrono::microseconds max_sleep) override;
  void check_peers(std::chrono::milliseconds stalled_for, std::span<const int> awaited) override;
  void abort(const std::string& reason) override;

  // Throws the error for a broken connection to `peer`, naming any rank that hung up before it.
  [[noreturn]] void fail_connection(int peer, const std::string& what);

 private:
  class TcpConnection;
  struct HangUp {
    int rank;
    std::chrono::steady_clock::time_point when;
  };
  void record_hangups(std::chrono::microseconds max_wait);
  void record_hangup(int peer);  // from a receiver thread
  void wake();                   // from a receiver thread: bytes arrived
  std::string hangup_summary() const;
  // Peers on this host whose process is gone, as "2, 3" ("" when none); with `skip_unread`, not
  // those whose bytes are still waiting to be read; with `among`, only the peers it accepts.
  std::string dead_local_peers(bool skip_unread, const std::function<bool(int)>& among = {}) const;

  int rank_;
  std::vector<int> local_pids_;  // by rank; 0 for this rank and for peers on other hosts
  std::vector<HangUp> hangups_;
  std::mutex hangups_mutex_;
  std::atomic<bool> waiting_{false};                         // the communication thread sleeps in sleep_once
  std::vector<std::unique_ptr<TcpConnection>> connections_;  // by rank; after what their receivers use
  int wakeup_fd_ = -1;                                       // eventfd the receivers write to wake this rank
};

}  // namespace tinyddp::comm
