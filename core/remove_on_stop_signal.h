// RemoveOnStopSignal: a file being written goes with its writer when SIGINT, SIGTERM or SIGHUP ends
// the process.
//
//   RemoveOnStopSignal guard(tmp);   // while it lives, a stop signal first unlinks `tmp`
//   ... write tmp, rename it into place ...
//
// A process killed in the middle of writing a temporary file (a checkpoint's <name>.tmp.<pid>.<n>)
// leaves it behind: Ctrl-C reaches every process of the terminal's job, and a launcher stops its
// workers with SIGTERM. Unwinding cannot help (a signal's default action unwinds nothing), so a
// guard installs a handler for the three signals -- only where their action is still the
// default: a program's own handler (or a MultiDevice spawner's StopSignals) is left alone -- that
// unlinks every file registered at that moment, then lets the signal end the process as it would
// have (by the signal). SIGKILL cannot be caught: what it leaves, the next writer removes
// (StateManager's remove_stale_temporaries).
#pragma once

#include <string>

namespace tinyddp {

class RemoveOnStopSignal {
 public:
  explicit RemoveOnStopSignal(const std::string& path);
  ~RemoveOnStopSignal();
  RemoveOnStopSignal(const RemoveOnStopSignal&) = delete;
  RemoveOnStopSignal& operator=(const RemoveOnStopSignal&) = delete;

 private:
  int slot_ = -1;  // -1: every slot was taken (the file is then left to the next writer)
  std::string path_;
};

}  // namespace tinyddp
