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
  // Whether a spinning thread yields its core between looks: yes unless every rank of the host has a
  // core of its own (then the peer being waited for is running elsewhere already).
  bool yield_while_spinning = true;
};

// One wait: spin while the budget lasts (keep_spinning), then the caller sleeps.
class SpinThenSleep {
 public:
  explicit SpinThenSleep(std::chrono::nanoseconds budget) : start_(std::chrono::steady_clock::now()), budget_(budget) {}
  // True while the spin budget lasts; after it, callers sleep.
  bool keep_spinning() const { return std::chrono::steady_clock::now() - start_ < budget_; }
  // Progress was made: the next wait starts a fresh spin.
  void reset() { start_ = std::chrono::steady_clock::now(); }
  // One look's worth of backing off, leaving the core's pipeline to the other hyper-thread.
  static void pause() {
#if defined(__x86_64__) || defined(__i386__)
    for (int i = 0; i < 16; ++i) _mm_pause();
#endif
  }

 private:
  std::chrono::steady_clock::time_point start_;
  std::chrono::nanoseconds budget_;
};

}  // namespace tinyddp::comm
