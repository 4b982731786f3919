// Process liveness: whether another process on this host still runs.
//
// The transports ask it of peers on the same host while they wait for them: a peer killed with
// SIGKILL says no goodbye, and its pid is how a waiting rank learns it is gone.
#pragma once

namespace tinyddp {

// False once process `pid` has exited, including when it is a zombie not yet reaped by its parent
// (kill(pid, 0) still finds zombies, so /proc/<pid>/stat is read too). True when it cannot tell
// (no /proc).
bool process_alive(int pid);

}  // namespace tinyddp
