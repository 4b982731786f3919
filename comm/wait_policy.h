// WaitPolicy: how the threads of one process group wait for each other and for their peers.
//
// Every blocking loop of the runtime (an algorithm waiting for bytes, the communication thread
// waiting for work, a caller waiting for its Work) spins for a moment first, because the answer
// usually comes within microseconds, much sooner than a sleeping thread is woken; then it sleeps.
// How long to spin, and whether to give the core away between looks, depends on the group: when its
// ranks outnumber the cores, a spinning rank only steals the core from the rank it waits for, which
// is how oversubscribed collectives collapse. The process group works that out when it is created
// (HostBackend) and hands its policy to everything that waits on its behalf.
#pragma once

#include <chrono>

#include "tinyddp/comm/tuning.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace tinyddp::comm {

struct WaitPolicy {
  // How long to spin before sleeping.
  std::chrono::nanoseconds spin = tuning::kSpinBudget;
  // How long a wait spins before it starts to yield (when it yields at all): short when the ranks of
  // the host outnumber its cores, so that the rank being waited for, which shares this core, gets it.
  std::chrono::nanoseconds pure_spin = tuning::kPureSpin;
  // Whether a spinning thread yields its core between looks: yes unless every rank of the host has a
  // core of its own (then the peer being waited for is running elsewhere already).
  bool yield_while_spinning = true;
};

// One wait: look, pause, look again while the spin budget lasts (keep_spinning), then the caller
// sleeps. A look is one `pause` instruction long: its latency differs tenfold between CPUs (a few
// cycles to ~140), so the phases of a wait are measured in time, never counted in looks. The clock
// is read only every kLooksPerClockRead looks: a read costs about as much as a pause, and the
// budgets are tens of microseconds. A wait is begun only once a look found nothing, so the reading
// that starts it is taken while there is nothing to do but wait.
class SpinThenSleep {
 public:
  explicit SpinThenSleep(std::chrono::nanoseconds budget) : start_(Clock::now()), budget_(budget) {}
  // True while the spin budget lasts; after it, callers sleep.
  bool keep_spinning() {
    if (++looks_ % kLooksPerClockRead == 0) spent_ = Clock::now() - start_;
    return spent_ < budget_;
  }
  // When the wait began.
  std::chrono::steady_clock::time_point started_at() const { return start_; }
  // Whether the spin has gone on for `pure_spin` (WaitPolicy::pure_spin), as of the last clock read:
  // from then on a thread that may share its core with a rank it waits for yields between looks.
  bool past(std::chrono::nanoseconds pure_spin) const { return spent_ >= pure_spin; }
  // Progress was made: the next wait starts a fresh spin.
  void reset(std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now()) {
    start_ = now;
    spent_ = {};
    looks_ = 0;
  }
  // One look's worth of backing off: the loop does not flood the memory system with loads of a line
  // that another core is about to write, and leaves the pipeline to the core's other hyper-thread.
  static void pause() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
  }

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr unsigned kLooksPerClockRead = 16;
  Clock::time_point start_;
  std::chrono::nanoseconds budget_;
  Clock::duration spent_{};
  unsigned looks_ = 0;
};

}  // namespace tinyddp::comm
