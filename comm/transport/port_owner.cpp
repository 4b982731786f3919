#include "tinyddp/comm/transport/port_owner.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

namespace tinyddp::comm {

namespace {

constexpr const char* kListenState = "0A";  // TCP_LISTEN in /proc/net/tcp's "st" column

// The inodes of the listening sockets on `port` in one /proc/net/tcp-style table.
std::vector<std::string> listening_inodes(const char* table, int port) {
  std::vector<std::string> inodes;
  std::ifstream in(table);
  std::string line;
  std::getline(in, line);  // the column names
  while (std::getline(in, line)) {
    // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode ...
    std::istringstream fields(line);
    std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
    if (!(fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode))
      continue;
    const size_t colon = local.rfind(':');
    if (colon == std::string::npos || state != kListenState) continue;
    if (std::strtol(local.c_str() + colon + 1, nullptr, 16) == port) inodes.push_back(inode);
  }
  return inodes;
}

std::string process_name(const std::string& pid) {
  std::ifstream in("/proc/" + pid + "/comm");
  std::string name;
  std::getline(in, name);
  return name;
}

}  // namespace

std::string port_owner(int port) {
  std::vector<std::string> inodes = listening_inodes("/proc/net/tcp", port);
  for (const std::string& inode : listening_inodes("/proc/net/tcp6", port)) inodes.push_back(inode);
  if (inodes.empty()) return "";
  std::error_code error;
  for (const auto& process : std::filesystem::directory_iterator("/proc", error)) {
    const std::string pid = process.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    std::error_code ignored;
    for (const auto& fd : std::filesystem::directory_iterator(process.path() / "fd", ignored)) {
      std::error_code unreadable;
      const std::string target = std::filesystem::read_symlink(fd.path(), unreadable).string();
      for (const std::string& inode : inodes)
        if (target == "socket:[" + inode + "]") return "pid " + pid + " (" + process_name(pid) + ")";
    }
  }
  return "a process this user cannot see";
}

}  // namespace tinyddp::comm
