// The job's timeout: how long any wait of the collective runtime may last before it fails.
//
// One number bounds them all, as torch.distributed.init_process_group(timeout=...) does: joining
// the rendezvous (connecting to the store, waiting for the other ranks), the process group's setup,
// and each collective, from the moment it starts running. It is set, from the strongest:
//
//   ProcessGroupOptions::timeout / RendezvousOptions::timeout   in code
//   --timeout SECONDS                                           the examples' command line
//   TINYDDP_TIMEOUT=SECONDS                                     the environment (any program)
//   5 minutes                                                   the default
//
// A wait longer than a few seconds also says so while it lasts (progress_interval(), every 10 s by
// default), so a job that hangs tells which rank it waits for long before it fails.
#pragma once

#include <chrono>
#include <string>

namespace tinyddp::comm {

constexpr std::chrono::milliseconds kDefaultTimeout = std::chrono::minutes(5);
constexpr std::chrono::milliseconds kDefaultProgressInterval = std::chrono::seconds(10);

// TINYDDP_TIMEOUT, else kDefaultTimeout. Throws on a value that is not a number of seconds.
std::chrono::milliseconds timeout_from_environment();

// How often a long wait reports itself: TINYDDP_PROGRESS_SECONDS, else kDefaultProgressInterval.
std::chrono::milliseconds progress_interval();

// "12.3 s"
std::string seconds_text(std::chrono::nanoseconds duration);

// The hint every timeout message ends with: where the timeout comes from and how to change it.
std::string timeout_hint(std::chrono::milliseconds timeout);

}  // namespace tinyddp::comm
