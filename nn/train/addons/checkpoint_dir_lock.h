// CheckpointDirLock: one job at a time in a checkpoint directory.
//
// Two jobs writing one directory overwrite each other's last.safetensors, and the second resumes from
// the first's file without a word. So the process that writes the checkpoints (rank 0) holds an
// exclusive flock(2) on <dir>/lock for as long as its run lasts; the file says who holds it:
//
//   pid 4242 on host node7 since YYYY-MM-DD hh:mm:ss UTC
//
// and a second job's rank 0 fails at once, quoting that line. The kernel drops the lock when the
// holder exits, however it exits (SIGKILL too), so a crashed job never blocks the next. The holder
// removes the file when it lets go, or when a stop signal ends it (core/remove_on_stop_signal.h); a
// file left by a holder killed with SIGKILL is not locked, and the next job takes it over
// (remove_stale_lock removes it sooner: a MultiDevice spawner does once its workers are gone).
// flock works on local file systems and on NFS (as a whole-file lock) alike.
#pragma once

#include <memory>
#include <string>

#include "tinyddp/core/remove_on_stop_signal.h"

namespace tinyddp::nn {

class CheckpointDirLock {
 public:
  // Takes the lock on `directory` (which must exist), or throws an Error naming the holder.
  explicit CheckpointDirLock(const std::string& directory);
  ~CheckpointDirLock();
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

  // <directory>/lock
  static std::string path_in(const std::string& directory);

 private:
  std::string path_;
  int fd_ = -1;
  std::unique_ptr<RemoveOnStopSignal> removed_if_stopped_;  // Ctrl-C or SIGTERM: the file goes with us
};

// Removes <directory>/lock when no process holds it (a holder killed with SIGKILL left it).
void remove_stale_lock(const std::string& directory);

}  // namespace tinyddp::nn
