#include "tinyddp/comm/transport/tcp_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <vector>

#include "tinyddp/core/env.h"
#include "tinyddp/core/error.h"

namespace tinyddp::comm {

namespace {

bool is_loopback(const std::string& address) { return address.rfind("127.", 0) == 0; }

struct Interface {
  std::string name;
  std::string address;  // IPv4, dotted
  bool up = false;
  bool loopback = false;
};

// Every IPv4 address of every interface of this host, in the kernel's order (one getifaddrs walk).
std::vector<Interface> ipv4_interfaces() {
  std::vector<Interface> found;
  ifaddrs* all = nullptr;
  if (::getifaddrs(&all) != 0) return found;
  for (ifaddrs* i = all; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    if (!::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text)) continue;
    found.push_back({i->ifa_name, text, (i->ifa_flags & IFF_UP) != 0, (i->ifa_flags & IFF_LOOPBACK) != 0});
  }
  ::freeifaddrs(all);
  return found;
}

// The local address this host uses to reach `host`: the kernel's route lookup, through a UDP
// socket's connect(), which sends nothing. "" when `host` does not resolve or is unreachable.
std::string route_source(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), "9", &hints, &found) != 0 || !found) return "";
  std::string address;
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in local{};
  socklen_t len = sizeof local;
  char text[INET_ADDRSTRLEN] = {};
  if (fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
      ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof text))
    address = text;
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(found);
  return address;
}

// The first IPv4 address, not loopback, that this host's name resolves to ("" when none).
std::string hostname_address() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "";
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(name, nullptr, &hints, &found) != 0) return "";
  std::string address;
  for (addrinfo* a = found; a && address.empty(); a = a->ai_next) {
    char text[INET_ADDRSTRLEN] = {};
    auto* in = reinterpret_cast<sockaddr_in*>(a->ai_addr);
    if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text) && !is_loopback(text)) address = text;
  }
  ::freeaddrinfo(found);
  return address;
}

}  // namespace

std::string peer_facing_address(const std::string& advertise_address, const std::string& route_to) {
  if (!advertise_address.empty()) return advertise_address;
  if (auto address = env::text("TINYDDP_SOCKET_ADDR")) return *address;
  if (auto ifname = env::text("TINYDDP_IFNAME")) {
    for (const Interface& i : ipv4_interfaces())
      if (i.name == *ifname) return i.address;
    TINYDDP_FAIL("tcp transport: TINYDDP_IFNAME='", *ifname, "' names no network interface with an IPv4 address",
                 hint("pick one that `ip -4 addr` lists, or unset it"));
  }
  if (!route_to.empty())
    if (std::string address = route_source(route_to); !address.empty() && !is_loopback(address)) return address;
  if (std::string address = hostname_address(); !address.empty()) return address;
  for (const Interface& i : ipv4_interfaces())
    if (i.up && !i.loopback) return i.address;
  return "127.0.0.1";
}

bool bind_all_from_environment() { return env::flag("TINYDDP_BIND_ALL").value_or(false); }

}  // namespace tinyddp::comm
