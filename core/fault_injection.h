// Fault injection: deterministic crashes, so that each moment a worker can die at has its own test.
//
//   TINYDDP_FAULT=backward:3            rank 0 SIGKILLs itself the 3rd time it passes "backward"
//   TINYDDP_FAULT=allreduce:5:1         ... rank 1, the 5th time it passes "allreduce"
//   TINYDDP_FAULT=forward:2:1:0,forward:2:1:1   rank 1, 2nd forward, in attempt 0 and again in attempt 1
//
// Each fault is point:count[:rank[:attempt]]; several are separated by commas. rank is the process's
// RANK (or SLURM_PROCID, OMPI_COMM_WORLD_RANK; default 0), attempt its TINYDDP_RESTART_COUNT as
// tinyddp-run sets it (or torchrun's TORCHELASTIC_RESTART_COUNT; default 0). A fault
// fires in the first attempt only unless told otherwise: the group that tinyddp-run restarts must be
// able to get past the point where its predecessor died, as it would after a real crash.
//
// The points, and where they sit:
//   forward           a training step starts (nn/train/addons/state_manager.h)
//   backward          the first gradient of a backward pass is finished: the pass is half done
//   allreduce         the last gradient is finished, just after DDP put the last bucket's all-reduce
//                     on the wire: the peers are inside that collective, waiting for this rank
//   checkpoint_write  a checkpoint file is half written (the kernel stops the write there; see
//                     kill_when_file_exceeds)
//
// A process dies with SIGKILL -- no destructor, no flush, no goodbye to its peers -- exactly as under
// the OOM killer or a lost node, after one line on stderr saying where. When TINYDDP_FAULT is unset,
// a point costs a load and a branch.
#pragma once

#include <cstdint>
#include <string_view>

namespace tinyddp::fault {

// True when TINYDDP_FAULT aims a fault at this process (its rank and attempt). The variable is read
// once; a malformed one (an unknown point, a count that is not a positive number) throws then.
bool armed();

// Counts one pass through `point`; true on the pass that a fault is aimed at.
bool due(std::string_view point);

// Writes "tinyddp fault injection: SIGKILL at <point> ..." to stderr and SIGKILLs this process.
[[noreturn]] void kill_self(std::string_view point);

// The fault point itself: counts the pass and, when it is the one aimed at, dies.
inline void point(std::string_view name) {
  if (armed() && due(name)) kill_self(name);
}

// Makes the kernel stop this process's next file write at `bytes` bytes into the file, and the process
// then die by SIGKILL: a crash in the middle of writing a file, at an exact offset. (RLIMIT_FSIZE
// raises SIGXFSZ at the limit; its handler turns that into SIGKILL.) For checkpoint_write.
void kill_when_file_exceeds(uint64_t bytes, std::string_view point);

}  // namespace tinyddp::fault
