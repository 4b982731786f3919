// TCP connection setup: the full mesh of sockets a TcpTransport starts from.
//
// Every rank listens on one address (tcp_address.h) and publishes "address:port" in the store. The
// higher rank of each pair connects to the lower one, twice: one socket per direction, because with
// data flowing both ways on one socket each direction's ACKs and window updates queue behind the
// other direction's segments (NCCL's socket transport does the same). Lower ranks accept only after
// their own connects finished, so rank 0 answers first and the chain cannot deadlock.
//
// Each new connection opens with a handshake: magic, protocol version, both ranks, which direction,
// and digests of the group (its store prefix) and of the job token TINYDDP_TOKEN. A stranger, a
// stale rank of an earlier job or a connection meant for another group is refused, and the reason
// logged, so a crowded port never mixes two jobs' bytes. Handshakes are heard concurrently, so a
// stranger that connects and stays silent costs the real ranks nothing.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "tinyddp/comm/store/store.h"

namespace tinyddp::comm {

// The two connected sockets of one pair of ranks, already tuned; -1 for a rank that is no peer.
struct SocketPair {
  int send_fd = -1;
  int recv_fd = -1;
};

// Everything connect_mesh needs to know.
struct MeshSpec {
  int rank = 0;
  int world_size = 0;
  std::vector<int> peers;          // the ranks to connect with
  std::string prefix;              // where the addresses go in the store; its digest names the group
  std::string token;               // the job's shared secret (only its digest travels)
  std::string listen_on;           // an IPv4 address of this host
  bool bind_all = false;           // listen on every address instead (still publishing listen_on)
  size_t socket_buffer_bytes = 0;  // SO_SNDBUF / SO_RCVBUF; 0: the kernel's auto-tuning
  std::chrono::milliseconds timeout{0};
};

// Connects spec.rank with every rank in spec.peers through `store`; returns the sockets by rank.
// Throws, naming the rank that could not be reached, at spec.timeout.
std::vector<SocketPair> connect_mesh(Store& store, const MeshSpec& spec);

// "Connection refused (errno 111)", for messages.
std::string errno_text(int err);

}  // namespace tinyddp::comm
