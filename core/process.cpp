#include "tinyddp/core/process.h"

#include <dirent.h>
#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

namespace tinyddp {

char process_state(pid_t pid) {
  if (pid <= 0) return 0;
  FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (!f) return 0;
  char line[1024] = {0};
  size_t n = std::fread(line, 1, sizeof line - 1, f);
  std::fclose(f);
  // "pid (command) state ...": the command may itself hold spaces or ')', so the state follows the
  // last ')'.
  const char* after_name = n ? std::strrchr(line, ')') : nullptr;
  char state = 0;
  return after_name && std::sscanf(after_name + 1, " %c", &state) == 1 ? state : 0;
}

bool process_alive(int pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  char state = process_state(pid_t(pid));
  if (state == 0) return true;  // no /proc: trust kill()
  return state != 'Z' && state != 'X';
}

bool process_group_alive(pid_t pgid) {
  if (::kill(-pgid, 0) != 0) return false;
  DIR* proc = opendir("/proc");
  if (!proc) return true;
  bool alive = false;
  while (dirent* entry = readdir(proc)) {
    if (entry->d_name[0] < '0' || entry->d_name[0] > '9') continue;
    FILE* f = std::fopen((std::string("/proc/") + entry->d_name + "/stat").c_str(), "r");
    if (!f) continue;
    char line[1024] = {0};
    size_t n = std::fread(line, 1, sizeof line - 1, f);
    std::fclose(f);
    const char* after_name = std::strrchr(line, ')');  // the command name may itself hold spaces or ')'
    if (n == 0 || !after_name) continue;
    char state = 0;
    int ppid = 0, pgrp = 0;
    if (std::sscanf(after_name + 1, " %c %d %d", &state, &ppid, &pgrp) == 3 && pgrp == pgid && state != 'Z' &&
        state != 'X') {
      alive = true;
      break;
    }
  }
  closedir(proc);
  return alive;
}

bool process_catches_signal(pid_t pid, int signal) {
  FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/status").c_str(), "r");
  if (!f) return false;
  char line[256];
  unsigned long long caught = 0;
  bool found = false;
  while (!found && std::fgets(line, sizeof line, f)) found = std::sscanf(line, "SigCgt: %llx", &caught) == 1;
  std::fclose(f);
  return found && signal >= 1 && signal <= 64 && ((caught >> (signal - 1)) & 1);
}

}  // namespace tinyddp
