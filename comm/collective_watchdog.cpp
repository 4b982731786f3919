#include "tinyddp/comm/collective_watchdog.h"

#include <algorithm>
#include <sstream>

#include "tinyddp/comm/store/prefix_store.h"
#include "tinyddp/comm/store/tcp_store.h"
#include "tinyddp/comm/timeout.h"
#include "tinyddp/core/log.h"

namespace tinyddp::comm {

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr auto kTick = 100ms;            // how often the thread looks (SIGUSR1 waits at most this)
constexpr auto kBoardStoreTimeout = 2s;  // each board call, on the watchdog's own connection

int64_t unix_ms_now() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t unix_ms_of(Clock::time_point t) {
  return unix_ms_now() - std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count();
}

std::string seconds_of(double s) {
  return seconds_text(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(s)));
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text;
}

// Finds the TcpStore under a chain of PrefixStores, and the prefix the chain adds.
const TcpStore* tcp_root(Store* store, std::string& prefix) {
  while (auto* prefixed = dynamic_cast<PrefixStore*>(store)) {
    prefix = prefix.empty() ? prefixed->prefix() : prefixed->prefix() + "/" + prefix;
    store = &prefixed->underlying();
  }
  return dynamic_cast<const TcpStore*>(store);
}

}  // namespace

StallVerdict judge_board(const std::vector<BoardEntry>& board, int64_t sequence, const std::string& what) {
  StallVerdict verdict;
  std::vector<int> inside;
  std::string details;
  for (const BoardEntry& e : board) {
    if (e.reported && e.sequence >= sequence) {
      inside.push_back(e.rank);
      continue;
    }
    verdict.lagging.push_back(e.rank);
    std::string who = "rank " + std::to_string(e.rank);
    if (e.pid > 0) who += " (" + e.host + ", pid " + std::to_string(e.pid) + ")";
    std::string where;
    if (!e.reported)
      where = "it has not said where it stands: a stopped or frozen process cannot";
    else if (e.running)
      where = "it is still in #" + std::to_string(e.sequence) + ", for " + seconds_of(e.seconds);
    else if (e.sequence < 0)
      where = "it has run no collective yet, for " + seconds_of(e.seconds);
    else
      where = "it is outside any collective since #" + std::to_string(e.sequence) + " finished " +
              seconds_of(e.seconds) + " ago";
    details += (details.empty() ? "" : "; ") + who + " has not entered " + what + " (" + where + ")";
  }
  if (verdict.lagging.empty()) return verdict;
  verdict.text = details;
  if (!inside.empty()) verdict.text += "; " + rank_list(inside) + (inside.size() == 1 ? " waits" : " wait") + " in it";
  return verdict;
}

CollectiveWatchdog::CollectiveWatchdog(std::shared_ptr<Store> store, std::string board_prefix,
                                       const FlightRecorder& recorder, std::vector<std::string> hosts,
                                       std::vector<int> pids, std::chrono::milliseconds timeout)
    : store_(std::move(store)),
      prefix_(std::move(board_prefix)),
      recorder_(recorder),
      rank_(recorder.rank()),
      world_size_(int(pids.size())),
      hosts_(std::move(hosts)),
      pids_(std::move(pids)),
      timeout_(timeout),
      progress_interval_(progress_interval()),
      thread_([this] { loop(); }) {}

CollectiveWatchdog::~CollectiveWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

std::chrono::milliseconds CollectiveWatchdog::settle_time() const {
  return std::clamp<std::chrono::milliseconds>(timeout_ / 4, 200ms, 2000ms);
}

void CollectiveWatchdog::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, kTick);
    if (stopping_) break;
    auto question = question_;
    lock.unlock();
    std::string answer;
    try {
      if (question) {
        publish(/*force=*/true);
        answer = judge_board(read_board(), int64_t(question->first), question->second).text;
      }
      tick();
    } catch (const std::exception& e) {  // the store does not answer: no verdict, the job goes on
      log_line(LogLevel::debug, "watchdog", std::string("rank ") + std::to_string(rank_) + ": " + e.what());
    }
    lock.lock();
    if (question) {
      answer_ = answer;
      question_.reset();
      wake_.notify_all();
    }
  }
}

void CollectiveWatchdog::tick() {
  if (FlightRecorder::dump_requests() != dumps_served_) {
    dumps_served_ = FlightRecorder::dump_requests();
    std::string path = recorder_.dump("SIGUSR1");
    if (!path.empty()) log_line(LogLevel::info, "flight recorder", "rank " + std::to_string(rank_) + ": wrote " + path);
  }
  if (world_size_ < 2) return;
  FlightRecorder::Position p = recorder_.position();
  std::string standing = p.running
                             ? "in " + std::to_string(p.running->fingerprint.sequence)
                             : "idle " + std::to_string(p.last_finished ? int64_t(p.last_finished->fingerprint.sequence)
                                                                        : -1);
  if (standing != standing_) standing_ = standing, standing_since_ = Clock::now();
  if (Clock::now() - standing_since_ >= settle_time() && published_ != standing_) publish(false);
  if (p.running) report_progress(p);
}

// A TcpStore's board goes through a connection of this thread's own, with a short timeout: the
// shared one's calls may wait as long as the job's timeout, and a thread blocked there would hold up
// the group's destruction. When that connection cannot be made (the store's host is stopped, or the
// token was given in code only), there is no board, and the next stall tries again. Other stores
// (in-process ones, in tests) are used as they are.
Store* CollectiveWatchdog::board_store() {
  if (own_store_) return own_store_.get();
  std::string prefix;
  const TcpStore* root = tcp_root(store_.get(), prefix);
  if (!root) return store_.get();
  TcpStoreOptions options;
  options.timeout = kBoardStoreTimeout;
  auto own = std::make_shared<TcpStore>(root->host(), root->port(), false, options);  // throws: no board now
  own_store_ = prefix.empty() ? std::shared_ptr<Store>(own) : std::make_shared<PrefixStore>(own, prefix);
  return own_store_.get();
}

bool CollectiveWatchdog::publish(bool force) {
  FlightRecorder::Position p = recorder_.position();
  std::string state;
  int64_t sequence = -1, since = unix_ms_now();
  if (p.running) {
    state = "in", sequence = int64_t(p.running->fingerprint.sequence), since = unix_ms_of(p.running->started_at);
  } else {
    state = "idle";
    if (p.last_finished)
      sequence = int64_t(p.last_finished->fingerprint.sequence), since = unix_ms_of(p.last_finished->finished_at);
  }
  std::string standing = state + " " + std::to_string(sequence);
  if (!force && standing == published_) return false;
  board_store()->set(prefix_ + "board/" + std::to_string(rank_), standing + " " + std::to_string(since));
  published_ = standing;
  return true;
}

std::vector<BoardEntry> CollectiveWatchdog::read_board() {
  Store* store = board_store();
  std::vector<BoardEntry> board;
  const int64_t now = unix_ms_now();
  for (int r = 0; r < world_size_; ++r) {
    if (r == rank_) continue;
    BoardEntry e;
    e.rank = r;
    e.host = hosts_[size_t(r)];
    e.pid = pids_[size_t(r)];
    const std::string key = prefix_ + "board/" + std::to_string(r);
    if (store->check({key})) {
      std::istringstream in(store->get(key));
      std::string state;
      int64_t since = now;
      if (in >> state >> e.sequence >> since) {
        e.reported = true;
        e.running = state == "in";
        e.seconds = double(now - since) / 1000.0;
      }
    }
    board.push_back(e);
  }
  return board;
}

void CollectiveWatchdog::report_progress(const FlightRecorder::Position& p) {
  const FlightRecorder::Entry& e = *p.running;
  const int64_t sequence = int64_t(e.fingerprint.sequence);
  if (sequence != reported_sequence_) reported_sequence_ = sequence, reports_ = 0;
  const auto waited = Clock::now() - e.started_at;
  if (waited < progress_interval_ * (reports_ + 1)) return;
  ++reports_;
  const std::string what = FlightRecorder::describe(e);
  std::string line = "rank " + std::to_string(rank_) + ": " + what + " waiting for " + seconds_text(waited);
  std::string verdict = judge_board(read_board(), sequence, "it").text;
  line += verdict.empty() ? "; every rank has entered it (a slow or stuck transfer)" : ": " + verdict;
  line += "; it fails after " + seconds_text(timeout_) + " (TINYDDP_TIMEOUT)";
  log_line(LogLevel::warn, "collective", line);
}

std::string CollectiveWatchdog::explain_stall(uint64_t sequence, const std::string& what,
                                              std::chrono::milliseconds patience) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (world_size_ < 2 || stopping_) return "";
  question_ = std::make_pair(sequence, what);
  answer_.reset();
  wake_.notify_all();
  wake_.wait_for(lock, patience, [this] { return answer_.has_value(); });
  std::string text = answer_.value_or("");
  answer_.reset();
  question_.reset();
  return text;
}

}  // namespace tinyddp::comm
