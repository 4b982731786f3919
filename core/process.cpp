#include "tinyddp/core/process.h"

#include <signal.h>

#include <cerrno>
#include <fstream>
#include <string>

namespace tinyddp {

bool process_alive(int pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;  // no /proc: trust kill()
  // "pid (command) state ...": the state follows the last ')' (a command may contain parentheses).
  auto close_paren = line.rfind(')');
  char state = close_paren != std::string::npos && close_paren + 2 < line.size() ? line[close_paren + 2] : 'R';
  return state != 'Z' && state != 'X';
}

}  // namespace tinyddp
