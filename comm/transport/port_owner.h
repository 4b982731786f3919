// Who listens on a TCP port of this host: for the error that says a port is taken, so that the user
// learns which program to stop instead of having to run `ss -ltnp` themselves.
//
//   port_owner(12355)  ->  "pid 4242 (python3)"
//
// It reads Linux's /proc/net/tcp and /proc/net/tcp6 for a listening socket on the port, then the
// processes' /proc/<pid>/fd links for that socket's inode.
#pragma once

#include <string>

namespace tinyddp::comm {

// "pid 4242 (python3)"; "a process this user cannot see" when the socket is found but not its owner
// (another user's process, without root); "" when no socket listens on the port (it may then be held
// only by connections in TIME_WAIT, or the system may have no /proc).
std::string port_owner(int port);

}  // namespace tinyddp::comm
