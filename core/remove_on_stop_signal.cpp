#include "tinyddp/core/remove_on_stop_signal.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <iterator>

namespace tinyddp {

namespace {

constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP};
// Files written at the same time: one per saving thread, a handful at most.
constexpr int kSlots = 32;
// The handler may run at any moment, so it reads only these: each slot holds a path's characters
// (owned by its guard, alive while the slot holds them) or null.
std::atomic<const char*> g_slots[kSlots];

void unlink_and_stop(int signal) {
  for (auto& slot : g_slots)
    if (const char* path = slot.load()) ::unlink(path);  // async-signal-safe
  // The default action now; the signal is blocked while this runs, so it ends the process the
  // moment the handler returns.
  struct sigaction action {};
  action.sa_handler = SIG_DFL;
  sigemptyset(&action.sa_mask);
  sigaction(signal, &action, nullptr);
  raise(signal);
}

void install_where_default() {
  for (int signal : kStopSignals) {
    struct sigaction current {};
    if (sigaction(signal, nullptr, &current) != 0 || current.sa_handler != SIG_DFL || (current.sa_flags & SA_SIGINFO))
      continue;
    struct sigaction action {};
    action.sa_handler = unlink_and_stop;
    sigemptyset(&action.sa_mask);
    sigaction(signal, &action, nullptr);
  }
}

}  // namespace

RemoveOnStopSignal::RemoveOnStopSignal(const std::string& path) : path_(path) {
  // Asked each time, not once: the program may have set a signal back to its default since.
  install_where_default();
  for (int i = 0; i < kSlots; ++i) {
    const char* empty = nullptr;
    if (g_slots[i].compare_exchange_strong(empty, path_.c_str())) {
      slot_ = i;
      return;
    }
  }
}

RemoveOnStopSignal::~RemoveOnStopSignal() {
  if (slot_ >= 0) g_slots[slot_].store(nullptr);
}

}  // namespace tinyddp
