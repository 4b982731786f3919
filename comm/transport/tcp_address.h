// Which address a rank's tcp transport listens on and publishes for its peers on other hosts.
//
// A rank whose peers all share its host listens on loopback. One with peers elsewhere listens on the
// one interface that faces them, never on every address of the host unless asked: the port takes
// data from anyone who reaches it. Which interface that is, in order of preference:
//   1. the address the caller gives (TcpTransportOptions::advertise_address), or TINYDDP_SOCKET_ADDR;
//   2. the interface TINYDDP_IFNAME names (an error if it has no IPv4 address);
//   3. the interface the route to the store's host leaves through: every rank reaches the store,
//      so that interface faces the other hosts (the store connection itself uses it);
//   4. the first IPv4 address, not loopback, of this host's name;
//   5. the first interface that is up and not loopback; then loopback, when there is nothing else.
#pragma once

#include <string>

namespace tinyddp::comm {

// The address peers on other hosts connect to (see above). `route_to`: a host every rank reaches.
std::string peer_facing_address(const std::string& advertise_address, const std::string& route_to);

// Whether TINYDDP_BIND_ALL asks to listen on every address (INADDR_ANY): for hosts whose peers come
// in through an address this host cannot name (NAT, some containers).
bool bind_all_from_environment();

}  // namespace tinyddp::comm
