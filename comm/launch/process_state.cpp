#include "tinyddp/comm/launch/process_state.h"

#include <cstdio>
#include <cstring>
#include <string>

namespace tinyddp::comm {

char process_state(pid_t pid) {
  if (pid <= 0) return 0;
  FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (!f) return 0;
  char line[1024] = {0};
  size_t n = std::fread(line, 1, sizeof line - 1, f);
  std::fclose(f);
  // The command name, in parentheses, may itself hold spaces or ')': the state follows the last ')'.
  const char* after_name = n ? std::strrchr(line, ')') : nullptr;
  char state = 0;
  return after_name && std::sscanf(after_name + 1, " %c", &state) == 1 ? state : 0;
}

}  // namespace tinyddp::comm
