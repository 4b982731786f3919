// port_owner names the process listening on a port (for the "port is taken" errors), and nothing
// for a port no one listens on.
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "tinyddp/comm/transport/port_owner.h"

using namespace tinyddp;

TEST_CASE("port_owner: the pid and name of the listener, or nothing for a closed port") {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&address), length) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0);
  const int port = ntohs(address.sin_port);
  CHECK(comm::port_owner(port).empty());  // bound, not listening: nothing to name
  REQUIRE(::listen(fd, 1) == 0);
  std::string name;
  std::getline(std::ifstream("/proc/self/comm"), name);
  CHECK(comm::port_owner(port) == "pid " + std::to_string(getpid()) + " (" + name + ")");
  ::close(fd);
  CHECK(comm::port_owner(port).empty());
}
