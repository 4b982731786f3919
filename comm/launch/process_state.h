// Process state: what /proc says of a process, for the code that must tell a dying process from a
// living one (the launcher choosing a root cause, a rank naming the peer that vanished).
#pragma once

#include <sys/types.h>

namespace tinyddp::comm {

// The state letter of /proc/<pid>/stat (R, S, D, Z, X, ...), or 0 when there is no such process.
char process_state(pid_t pid);

// Whether the main thread of `pid` has ended (state Z or X): a process that is dying, or dead and not
// yet reaped by its parent. A multi-threaded process killed by a signal shows this first, until its
// last thread is gone.
inline bool main_thread_ended(pid_t pid) {
  char state = process_state(pid);
  return state == 'Z' || state == 'X';
}

}  // namespace tinyddp::comm
