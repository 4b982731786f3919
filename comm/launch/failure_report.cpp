#include "tinyddp/comm/launch/failure_report.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "tinyddp/comm/store/prefix_store.h"
#include "tinyddp/core/error.h"
#include "tinyddp/core/process.h"

namespace tinyddp::comm {

namespace {

// Whether process `pid` of this host has ended (gone, or a zombie its parent has not reaped yet).
bool process_ended(long pid) {
  if (pid <= 0) return false;
  return kill(pid_t(pid), 0) != 0 ? errno == ESRCH : process_state(pid_t(pid)) == 0 || main_thread_ended(pid_t(pid));
}

std::string this_host() {
  char name[256] = {0};
  gethostname(name, sizeof name - 1);
  return name;
}

// The first rank of this host whose process has ended, from the identities rendezvous recorded
// ("host pid N #nonce" under rdzv/rank/<r>); -1 when none has.
int vanished_local_peer(Store& job_store, int rank) {
  PrefixStore rdzv(job_store, "rdzv");
  rdzv.set_timeout(std::chrono::seconds(2));
  int world_size = std::atoi(rdzv.get("world_size").c_str());
  const std::string host = this_host();
  for (int r = 0; r < world_size; ++r) {
    if (r == rank) continue;
    std::string identity = rdzv.get("rank/" + std::to_string(r));
    std::istringstream fields(identity);
    std::string peer_host, word;
    long pid = 0;
    fields >> peer_host >> word >> pid;
    if (peer_host == host && word == "pid" && process_ended(pid)) return r;
  }
  return -1;
}

struct FirstFailure {
  int rank = -1;
  long long when = 0;  // unix seconds
};

// Settles which rank failed first (see the header); this rank's own failure at `now` otherwise.
FirstFailure settle_first_failure(Store* job_store, int rank, long long now) {
  FirstFailure mine{rank, now};
  if (!job_store) return mine;
  try {
    PrefixStore failures(*job_store, "failure");
    // A peer's sockets close while its process is still being torn down, a moment before it shows as
    // ended: look again for a little while before deciding no peer is gone.
    int vanished = vanished_local_peer(*job_store, rank);
    for (int look = 0; vanished < 0 && look < 25 && !failures.check({"first"}); ++look) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      vanished = vanished_local_peer(*job_store, rank);
    }
    if (vanished >= 0) failures.compare_set("first", "", std::to_string(vanished) + " " + std::to_string(now));
    std::string first = failures.compare_set("first", "", std::to_string(rank) + " " + std::to_string(now));
    FirstFailure settled;
    std::istringstream(first) >> settled.rank >> settled.when;
    return settled.rank >= 0 ? settled : mine;
  } catch (const std::exception&) {
    return mine;  // the store is gone too: say what we know
  }
}

}  // namespace

std::string torchelastic_error_json(const std::string& message, long long unix_seconds) {
  nlohmann::json error;
  error["message"]["message"] = message.substr(0, message.find('\n'));
  error["message"]["extraInfo"]["py_callstack"] = message;
  error["message"]["extraInfo"]["timestamp"] = std::to_string(unix_seconds);
  return error.dump();
}

void report_failure_to_launcher(Store* job_store, int rank, const std::string& message, FailureReportOptions options) {
  if (options.error_file.empty()) {
    const char* file = std::getenv("TORCHELASTIC_ERROR_FILE");
    if (!file || !*file) return;
    options.error_file = file;
  }
  const long long now = std::time(nullptr);
  FirstFailure first = settle_first_failure(job_store, rank, now);
  const bool i_was_first = first.rank == rank;
  std::string text = "rank " + std::to_string(rank) + ": " + message;
  if (!i_was_first) text += "\n(rank " + std::to_string(first.rank) + " failed first; this failure followed it)";
  // A consequence sorts after its cause in torchrun's earliest-first choice.
  std::ofstream(options.error_file) << torchelastic_error_json(text, i_was_first ? now : first.when + 1) << "\n";
  if (i_was_first) return;
  std::cerr << "tinyddp: rank " << rank << " failed after rank " << first.rank << " did: " << message
            << "\ntinyddp: waiting up to " << options.linger.count() / 1000.0
            << " s for torchrun to stop this rank, so that it reports rank " << first.rank << " as the root cause"
            << std::endl;
  std::this_thread::sleep_for(options.linger);
}

}  // namespace tinyddp::comm
