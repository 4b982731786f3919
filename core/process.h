// Process state: what /proc says of another process on this host.
//
// The transports ask it of peers on the same host while they wait for them (a peer killed with
// SIGKILL says no goodbye, and its pid is how a waiting rank learns it is gone); the launcher asks
// it to tell a dying worker from a living one, and a stopped one (SIGSTOP) from a running one.
#pragma once

#include <sys/types.h>

namespace tinyddp {

// The state letter of /proc/<pid>/stat (R, S, D, T, Z, X, ...), or 0 when there is no such
// process (or no /proc).
char process_state(pid_t pid);

// False once process `pid` has exited, including when it is a zombie not yet reaped by its parent
// (kill(pid, 0) still finds zombies, so /proc/<pid>/stat is read too). True when it cannot tell
// (no /proc).
bool process_alive(int pid);

// Whether the main thread of `pid` has ended (state Z or X): a process that is dying, or dead and not
// yet reaped by its parent. A multi-threaded process killed by a signal shows this first, until its
// last thread is gone.
inline bool main_thread_ended(pid_t pid) {
  char state = process_state(pid);
  return state == 'Z' || state == 'X';
}

// Whether `pid` is stopped by a signal (SIGSTOP, SIGTSTP: state T) or by a tracer (t).
inline bool process_stopped(pid_t pid) {
  char state = process_state(pid);
  return state == 'T' || state == 't';
}

// Whether any process of group `pgid` is still alive. kill(-pgid, 0) is not enough: it also counts
// zombies, and a child's orphaned children, once killed, wait as zombies until init reaps them.
bool process_group_alive(pid_t pgid);

// Whether `pid` has a handler installed for `signal` (the SigCgt mask of /proc/<pid>/status): sending
// it a signal it does not catch would, for most signals, end it.
bool process_catches_signal(pid_t pid, int signal);

}  // namespace tinyddp
