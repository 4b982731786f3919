#include "tinyddp/comm/launch/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "tinyddp/comm/cpu_binding.h"
#include "tinyddp/comm/launch/flight_explain.h"
#include "tinyddp/comm/store/prefix_store.h"
#include "tinyddp/comm/store/store_server.h"
#include "tinyddp/comm/store/tcp_store.h"
#include "tinyddp/core/child_processes.h"
#include "tinyddp/core/env.h"
#include "tinyddp/core/error.h"
#include "tinyddp/core/process.h"

namespace tinyddp::comm {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

// How often a launcher looks at the store for news from other nodes (a failure, the end of the job).
constexpr auto kStorePollInterval = 100ms;
// After a worker exits with an error code, how long the launcher watches for a peer that was killed
// by a signal just before it (see settle_root_cause), and how long for one that is already dying.
constexpr auto kSettle = 200ms;
constexpr auto kSettleDying = 2s;
// How long the workers asked for their flight records (SIGUSR1) get to write them: their watchdog
// threads look for the request every 100 ms, and a record takes milliseconds to write.
constexpr auto kRecordsWait = 500ms;
// The longest piece of a line without a newline that is held back before it is passed on anyway.
constexpr size_t kMaxLine = 64 * 1024;

std::string random_hex(int bytes) {
  static const char digits[] = "0123456789abcdef";
  std::random_device device;
  std::string text;
  for (int i = 0; i < bytes; ++i) {
    unsigned byte = device() & 0xff;
    text += digits[byte >> 4];
    text += digits[byte & 15];
  }
  return text;
}

std::string signal_name(int signal) {
  const char* name = sigabbrev_np(signal);
  return name ? std::string("SIG") + name : "signal " + std::to_string(signal);
}

// Finds program[0] the way a shell would, before any fork: after fork only async-signal-safe calls
// are allowed, and searching PATH is not one.
std::string resolve_program(const std::string& name) {
  TINYDDP_CHECK(!name.empty(), "tinyddp-run: no program to run", hint("tinyddp-run -n 2 -- ./my_program args..."));
  auto executable = [](const std::string& path) { return access(path.c_str(), X_OK) == 0; };
  if (name.find('/') != std::string::npos) {
    TINYDDP_CHECK(executable(name), "tinyddp-run: '", name, "' is not an executable file (", std::strerror(errno), ")",
                  hint("check the path and its permissions"));
    return name;
  }
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "/usr/bin:/bin");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (executable(candidate)) return candidate;
  }
  TINYDDP_FAIL("tinyddp-run: program '", name, "' was not found on PATH", hint("give its path (./", name, ")"));
}

std::string encode_failure(const WorkerFailure& f) {
  std::ostringstream out;
  out << f.rank << ' ' << f.local_rank << ' ' << f.node_rank << ' ' << f.pid << ' ' << f.exit_code << ' ' << f.signal;
  if (!f.stall.empty()) out << ' ' << f.stall;
  return out.str();
}

WorkerFailure decode_failure(const std::string& text) {
  WorkerFailure f;
  std::istringstream in(text);
  in >> f.rank >> f.local_rank >> f.node_rank >> f.pid >> f.exit_code >> f.signal;
  std::getline(in >> std::ws, f.stall);
  return f;
}

int exit_code_for(const WorkerFailure& f) { return f.signal ? 128 + f.signal : f.exit_code; }

}  // namespace

std::string WorkerFailure::describe() const {
  std::string where = "rank " + std::to_string(rank) + " (local rank " + std::to_string(local_rank) + " on node " +
                      std::to_string(node_rank) + ", pid " + std::to_string(pid) + ")";
  if (!stall.empty()) return where + " stalled: " + stall;
  if (signal) return where + " was killed by " + signal_name(signal);
  return where + " exited with code " + std::to_string(exit_code);
}

// One worker process (child `rank - first rank` of the job's ChildProcesses) and the two pipes its
// output comes through.
struct WorkerProcess {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;
  int fds[2] = {-1, -1};   // read ends: stdout, stderr
  std::string partial[2];  // the unfinished last line of each
  bool running = false;    // a copy of ChildProcesses::running, kept by reap()
  int status = 0;          // its waitpid status, once reaped
};

// Everything one run() holds: the store, the workers, and the steps of the job.
struct Launcher::Job {
  Launcher& launcher;
  LauncherOptions& o;
  int world_size;
  std::string token;
  std::unique_ptr<StoreServer> server;
  std::unique_ptr<TcpStore> client;
  std::unique_ptr<PrefixStore> store;  // tinyddp/<run id>/launcher
  std::string program_path;
  // Each worker in its own process group (the launcher forwards signals to everything a worker starts).
  ChildProcesses children{"tinyddp-run"};
  std::vector<WorkerProcess> workers;  // workers[i] is children's child i
  std::string records_dir;             // the workers' TINYDDP_FLIGHT_RECORDER
  bool owns_records_dir = false;       // a temporary one, removed at the end

  Job(Launcher& l) : launcher(l), o(l.options_), world_size(o.nnodes * o.nproc_per_node) {
    records_dir = !o.flight_recorder_dir.empty() ? o.flight_recorder_dir
                                                 : env::text("TINYDDP_FLIGHT_RECORDER").value_or("");
    if (records_dir.empty()) {
      std::string pattern = (std::filesystem::temp_directory_path() / "tinyddp-run-records-XXXXXX").string();
      if (mkdtemp(pattern.data())) records_dir = pattern, owns_records_dir = true;
    }
  }

  ~Job() {
    // Whatever happened (an exception included), no worker outlives the launcher.
    children.stop(SIGKILL, std::chrono::milliseconds::zero());
    for (auto& w : workers)
      for (int& fd : w.fds)
        if (fd >= 0) close(fd), fd = -1;
    std::error_code ignored;
    if (owns_records_dir) std::filesystem::remove_all(records_dir, ignored);
  }

  void log(LogLevel level, const std::string& message) { o.log(level, message); }
  std::string attempt_key(int attempt, const std::string& what) {
    return "attempt/" + std::to_string(attempt) + "/" + what;
  }

  // Node 0 hosts the store; every node's launcher (node 0's too) is a client of it.
  void start_store() {
    if (std::optional<std::string> env_token = env::text("TINYDDP_TOKEN")) {
      token = *env_token;
    } else if (o.nnodes == 1) {
      token = random_hex(16);
    } else {
      log(LogLevel::info,
          "no TINYDDP_TOKEN set: the store accepts any client; export the same TINYDDP_TOKEN on "
          "every node to require one");
    }
    std::string listen = "0.0.0.0";
    if (o.master_addr == "localhost" || o.master_addr.rfind("127.", 0) == 0) listen = "127.0.0.1";
    if (o.master_addr.find(':') != std::string::npos) listen = o.master_addr == "::1" ? "::1" : "::";
    int port = o.master_port;
    if (o.node_rank == 0) {
      StoreServerOptions server_options;
      server_options.host = listen;
      server_options.port = o.master_port;
      server_options.token = token;
      server = std::make_unique<StoreServer>(server_options);
      port = server->port();
    }
    launcher.bound_port_ = port;
    TcpStoreOptions client_options;
    client_options.timeout = o.rendezvous_timeout;
    client_options.token = token;
    client = std::make_unique<TcpStore>(o.master_addr, port, false, client_options);
    store = std::make_unique<PrefixStore>(*client, "tinyddp/" + o.run_id + "/launcher");
  }

  // Every node must describe the same job; the first to arrive sets the reference.
  void register_node() {
    auto agree = [&](const std::string& what, const std::string& mine, const std::string& flag) {
      std::string theirs = store->compare_set(what, "", mine);
      TINYDDP_CHECK(theirs == mine, "tinyddp-run (node ", o.node_rank, "): this node has ", flag, " ", mine,
                    " but the node that registered first has ", theirs,
                    hint("run the same tinyddp-run command line on every node"));
    };
    agree("nnodes", std::to_string(o.nnodes), "--nnodes");
    agree("nproc_per_node", std::to_string(o.nproc_per_node), "--nproc-per-node");
    agree("max_restarts", std::to_string(o.max_restarts), "--max-restarts");
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    std::string me = std::string(host) + " pid " + std::to_string(getpid()) + " #" + random_hex(4);
    std::string holder = store->compare_set("node/" + std::to_string(o.node_rank), "", me);
    TINYDDP_CHECK(holder == me, "tinyddp-run: node rank ", o.node_rank, " is claimed twice: by ",
                  holder.substr(0, holder.rfind(" #")), " and by this launcher (", me.substr(0, me.rfind(" #")), ")",
                  hint("give every node its own --node-rank, 0 to ", o.nnodes - 1));
  }

  // Every node starts attempt k together. Like StoreBarrier, but watching for a stop request while it
  // waits (other nodes may take minutes to come up, and Ctrl-C must still work meanwhile).
  // Returns false when stopped.
  bool start_together(int attempt) {
    store->append(attempt_key(attempt, "nodes"), std::to_string(o.node_rank) + ",");
    if (store->add(attempt_key(attempt, "arrived"), 1) == o.nnodes) store->set(attempt_key(attempt, "go"), "1");
    auto deadline = Clock::now() + o.rendezvous_timeout;
    while (!store->check({attempt_key(attempt, "go")})) {
      if (launcher.stop_signal_.load()) return false;
      if (Clock::now() >= deadline) {
        std::set<int> came;
        std::istringstream list(store->get(attempt_key(attempt, "nodes")));
        for (std::string n; std::getline(list, n, ',');) came.insert(std::stoi(n));
        std::string missing;
        for (int n = 0; n < o.nnodes; ++n)
          if (!came.count(n)) missing += (missing.empty() ? "" : ", ") + std::to_string(n);
        TINYDDP_FAIL("tinyddp-run: ", came.size(), "/", o.nnodes, " nodes arrived for attempt ", attempt, " after ",
                     o.rendezvous_timeout.count() / 1000.0, " s; missing: node ", missing,
                     hint("start the same tinyddp-run command on every node, with --master-addr/--master-port "
                          "naming node 0"));
      }
      pump_output(kStorePollInterval);
    }
    return true;
  }

  // Records already in a directory the user named were written by an earlier attempt or an earlier
  // job; they would be read as this attempt's. Each node moves those of its own ranks (node 0 also
  // those of ranks beyond this world) into DIR/previous/, where they stay readable.
  void set_aside_old_records() {
    if (records_dir.empty() || owns_records_dir) return;
    std::error_code ec;
    std::vector<std::filesystem::path> old;
    for (const auto& file : std::filesystem::directory_iterator(records_dir, ec)) {
      const std::string name = file.path().filename().string();
      int rank = -1;
      if (name.rfind("rank-", 0) != 0 || !file.is_regular_file(ec)) continue;
      std::from_chars(name.data() + 5, name.data() + name.size(), rank);
      const bool mine = rank / o.nproc_per_node == o.node_rank || (o.node_rank == 0 && rank >= world_size);
      if (rank >= 0 && mine) old.push_back(file.path());
    }
    const std::filesystem::path previous = std::filesystem::path(records_dir) / "previous";
    for (const auto& path : old) {
      std::filesystem::create_directories(previous, ec);
      std::filesystem::rename(path, previous / path.filename(), ec);
      if (ec) log(LogLevel::warn, "cannot move the old flight record " + path.string() + " aside: " + ec.message());
    }
  }

  void spawn_workers(int attempt, int port) {
    set_aside_old_records();
    workers.assign(o.nproc_per_node, {});
    for (int local = 0; local < o.nproc_per_node; ++local) {
      WorkerProcess& w = workers[local];
      w.local_rank = local;
      w.rank = o.node_rank * o.nproc_per_node + local;
      std::map<std::string, std::string> env = {
          {"RANK", std::to_string(w.rank)},
          {"LOCAL_RANK", std::to_string(local)},
          {"WORLD_SIZE", std::to_string(world_size)},
          {"LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node)},
          {"GROUP_RANK", std::to_string(o.node_rank)},
          {"MASTER_ADDR", o.master_addr},
          {"MASTER_PORT", std::to_string(port)},
          {"TINYDDP_RESTART_COUNT", std::to_string(attempt)},
          {"TINYDDP_MAX_RESTARTS", std::to_string(o.max_restarts)},
          {"TINYDDP_RUN_ID", o.run_id},
          {"TINYDDP_LAUNCHER_STORE", "1"},
          {"TINYDDP_TOKEN", token},
      };
      if (!records_dir.empty()) env["TINYDDP_FLIGHT_RECORDER"] = records_dir;
      int out[2], err[2];
      TINYDDP_CHECK(pipe2(out, O_CLOEXEC) == 0 && pipe2(err, O_CLOEXEC) == 0,
                    "tinyddp-run: pipe failed: ", std::strerror(errno), hint("raise the open-file limit (ulimit -n)"));
      w.fds[0] = out[0];
      w.fds[1] = err[0];
      ChildCommand command{program_path, o.program, environment_with(env), true, out[1], err[1]};
      if (o.bind_cpus) command.cpus = worker_cpus(local, o.nproc_per_node);
      try {
        w.pid = children.pid(children.start(command));
      } catch (...) {
        close(out[1]);
        close(err[1]);
        throw;
      }
      close(out[1]);
      close(err[1]);
      w.running = true;
    }
  }

  static constexpr int kEnded = 2;  // pump_output's mark for a pidfd (0 and 1 are stdout and stderr)

  void emit(WorkerProcess& w, int stream, std::string_view line) {
    if (o.output) o.output(w.rank, stream + 1, line);
  }

  // Waits up to timeout for output (or a stop request) and passes complete lines on.
  void pump_output(std::chrono::milliseconds timeout) {
    std::vector<pollfd> fds;
    std::vector<std::pair<WorkerProcess*, int>> owners;
    fds.push_back({launcher.wake_pipe_[0], POLLIN, 0});
    owners.push_back({nullptr, 0});
    for (auto& w : workers) {
      for (int s = 0; s < 2; ++s)
        if (w.fds[s] >= 0) {
          fds.push_back({w.fds[s], POLLIN, 0});
          owners.push_back({&w, s});
        }
      // A pidfd wakes the poll the moment the worker dies, so the launcher sees the first death
      // before the peers' own failures follow it (they come milliseconds later).
      const size_t child = size_t(&w - workers.data());  // fewer children when a start failed
      int pidfd = child < children.size() ? children.pidfd(child) : -1;
      if (pidfd >= 0) {
        fds.push_back({pidfd, POLLIN, 0});
        owners.push_back({&w, kEnded});
      }
    }
    if (poll(fds.data(), fds.size(), int(timeout.count())) <= 0) return;
    char buffer[65536];
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      auto [w, s] = owners[i];
      if (s == kEnded) continue;  // a worker ended: the poll is over, and the caller reaps it
      ssize_t n = read(fds[i].fd, buffer, sizeof buffer);
      if (!w) continue;  // the wake pipe: drained, its job (ending the poll) is done
      if (n <= 0) {
        if (!w->partial[s].empty()) emit(*w, s, w->partial[s]);
        w->partial[s].clear();
        close(w->fds[s]);
        w->fds[s] = -1;
        continue;
      }
      std::string& pending = w->partial[s];
      pending.append(buffer, size_t(n));
      size_t start = 0;
      for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1)
        emit(*w, s, std::string_view(pending).substr(start, nl - start));
      pending.erase(0, start);
      if (pending.size() > kMaxLine) {
        emit(*w, s, pending);
        pending.clear();
      }
    }
  }

  // Reaps the workers that have ended; returns them in rank order.
  std::vector<WorkerProcess*> reap() {
    std::vector<WorkerProcess*> ended;
    for (size_t i : children.reap_ended()) ended.push_back(&workers[i]);
    sync_with_children();
    return ended;
  }

  void sync_with_children() {
    for (size_t i = 0; i < workers.size() && i < children.size(); ++i) {
      workers[i].running = children.running(i);
      workers[i].status = children.status(i);
    }
  }

  bool failed(const WorkerProcess& w) { return !(WIFEXITED(w.status) && WEXITSTATUS(w.status) == 0); }

  // The root cause among workers reaped together: one ended by a signal before one that exited with
  // an error code. A worker's error exits with a code (exceptions reach main), and the usual error
  // after a peer died is exactly that ("peer rank 1 closed the connection"); a signal is not
  // something a peer's death causes. Otherwise the first in `ended`. nullptr when none failed.
  WorkerProcess* root_cause_of(const std::vector<WorkerProcess*>& ended) {
    WorkerProcess* first = nullptr;
    for (WorkerProcess* w : ended) {
      if (!failed(*w)) continue;
      if (!first || (WIFSIGNALED(w->status) && !WIFSIGNALED(first->status))) first = w;
    }
    return first;
  }

  // `first` exited with an error code. The peer it lost may have been killed a moment earlier and
  // still be dying (a process with many threads, or one in the middle of an fsync, takes a while to
  // be reported to its parent), so before naming `first` the launcher watches a little longer:
  // kSettle, or kSettleDying while some worker's main thread has already ended. A worker found
  // killed by a signal in that time is the root cause instead.
  WorkerProcess* settle_root_cause(WorkerProcess* first) {
    if (WIFSIGNALED(first->status)) return first;
    std::vector<WorkerProcess*> ended{first};
    const auto start = Clock::now();
    for (;;) {
      bool running = false, dying = false;
      for (auto& w : workers)
        if (w.running) running = true, dying = dying || main_thread_ended(w.pid);
      if (!running || Clock::now() - start >= (dying ? kSettleDying : kSettle)) break;
      pump_output(5ms);
      for (WorkerProcess* w : reap()) ended.push_back(w);
    }
    return root_cause_of(ended);
  }

  WorkerFailure failure_of(const WorkerProcess& w) {
    WorkerFailure f;
    f.rank = w.rank;
    f.local_rank = w.local_rank;
    f.node_rank = o.node_rank;
    f.pid = w.pid;
    if (WIFEXITED(w.status)) f.exit_code = WEXITSTATUS(w.status);
    if (WIFSIGNALED(w.status)) f.signal = WTERMSIG(w.status);
    return f;
  }

  // The group may have failed by timeout, waiting for a worker that is alive but stuck: name that
  // one instead of the first to exit (see the header). Changes `cause` only when one is found.
  void blame_stalled_worker(WorkerFailure& cause) {
    for (auto& w : workers)
      if (w.running && process_stopped(w.pid)) {
        cause = failure_of(w);
        cause.exit_code = 0;
        cause.stall = "it was stopped by a signal (SIGSTOP or SIGTSTP: state T), and the others waited for it";
        return;
      }
    if (records_dir.empty()) return;
    // The workers still alive write their records on SIGUSR1, if they listen for it.
    bool asked = false;
    for (auto& w : workers)
      if (w.running && process_catches_signal(w.pid, SIGUSR1)) kill(w.pid, SIGUSR1), asked = true;
    for (auto until = Clock::now() + kRecordsWait; asked && Clock::now() < until;) pump_output(10ms);
    FlightExplanation x;
    try {
      x = explain_flight_records(records_dir);
    } catch (const Error&) {
      return;  // no records: nothing to add
    }
    bool timed_out = false;
    for (const auto& r : x.ranks) timed_out = timed_out || (r.present && r.reason == "timeout");
    if (!timed_out) return;
    for (int lagging : x.lagging)
      for (auto& w : workers)
        if (w.rank == lagging && w.running) {
          cause = failure_of(w);
          cause.exit_code = 0;
          cause.stall = "the others timed out waiting for it (" + x.verdict + ")";
          return;
        }
  }

  bool all_output_closed() {
    for (auto& w : workers)
      if (w.fds[0] >= 0 || w.fds[1] >= 0) return false;
    return true;
  }

  // Ends every worker and anything they started: `signal` first, SIGKILL after the grace period
  // (core/child_processes.h), their output read meanwhile.
  void stop_workers(int signal) {
    for (size_t i : children.stop(signal, o.grace, [&](std::chrono::milliseconds wait) { pump_output(wait); }))
      log(LogLevel::warn, "rank " + std::to_string(workers[i].rank) + " did not stop within the grace period; SIGKILL");
    sync_with_children();
    // The last output, up to the pipes' end (bounded: a process stuck in the kernel may keep one open).
    auto drain_deadline = Clock::now() + 1s;
    while (!all_output_closed() && Clock::now() < drain_deadline) pump_output(10ms);
    for (auto& w : workers)
      for (int s = 0; s < 2; ++s)
        if (w.fds[s] >= 0) close(w.fds[s]), w.fds[s] = -1;
  }

  enum class End { success, failure, stopped };

  // Watches one attempt until it ends, here or on another node.
  End supervise(int attempt) {
    std::string failed_key = attempt_key(attempt, "failed");
    auto next_store_check = Clock::now() + kStorePollInterval;
    bool local_done = false;
    for (;;) {
      pump_output(local_done ? kStorePollInterval : 50ms);
      if (launcher.stop_signal_.load()) return End::stopped;
      if (!local_done) {
        if (WorkerProcess* w = root_cause_of(reap())) {
          w = settle_root_cause(w);
          WorkerFailure cause = failure_of(*w);
          if (!WIFSIGNALED(w->status)) blame_stalled_worker(cause);
          // The first failure anywhere is the root cause: compare_set lets exactly one node publish it.
          store->compare_set(failed_key, "", encode_failure(cause));
          return End::failure;
        }
        bool any_running = false;
        for (auto& w : workers) any_running |= w.running;
        if (!any_running) {
          local_done = true;
          if (store->add(attempt_key(attempt, "nodes_done"), 1) == o.nnodes)
            store->set(attempt_key(attempt, "all_done"), "1");
        }
      }
      if (Clock::now() >= next_store_check || local_done) {
        next_store_check = Clock::now() + kStorePollInterval;
        if (store->check({failed_key})) return End::failure;
        if (local_done && store->check({attempt_key(attempt, "all_done")})) return End::success;
      }
    }
  }

  // Node 0 hosts the store: it waits (briefly) until every other launcher that took part in this
  // attempt has read the outcome, so none of them finds the store gone mid-question.
  void leave(int attempt) {
    if (o.node_rank != 0) {
      store->set(attempt_key(attempt, "left/" + std::to_string(o.node_rank)), "1");
      return;
    }
    std::vector<std::string> others;
    std::istringstream list(store->check({attempt_key(attempt, "nodes")}) ? store->get(attempt_key(attempt, "nodes"))
                                                                          : "");
    for (std::string n; std::getline(list, n, ',');)
      if (n != "0") others.push_back(attempt_key(attempt, "left/" + n));
    if (others.empty()) return;
    try {
      store->wait(others, std::min<std::chrono::milliseconds>(o.rendezvous_timeout, 30s));
    } catch (const Error& e) {
      log(LogLevel::warn, "not every node said goodbye: " + e.message());
    }
  }

  LaunchResult run() {
    start_store();
    register_node();
    program_path = resolve_program(o.program.at(0));
    LaunchResult result;
    for (int attempt = 0;; ++attempt) {
      End end = End::stopped;
      if (start_together(attempt)) {
        spawn_workers(attempt, launcher.bound_port_);
        end = supervise(attempt);
      }
      // Whatever the outcome, this attempt's processes end here: on success that is only what the
      // workers left running behind them.
      int s = launcher.stop_signal_.load();
      stop_workers(end == End::stopped ? s : SIGTERM);
      workers.clear();
      children.clear();
      if (end == End::stopped) {
        // Other nodes must stop too, and must not restart: say so before the failure they watch for.
        store->set("stopped", "node " + std::to_string(o.node_rank) + " got " + signal_name(s));
        store->compare_set(attempt_key(attempt, "failed"), "",
                           "-1 -1 " + std::to_string(o.node_rank) + " 0 0 " + std::to_string(s));
        leave(attempt);
        result.exit_code = 128 + s;
        result.summary = "stopped by " + signal_name(s) + "; the workers got it too";
        return result;
      }
      if (end == End::success) {
        leave(attempt);
        result.summary = "all " + std::to_string(world_size) + " workers finished successfully" +
                         (attempt ? " (after " + std::to_string(attempt) + " restart" + (attempt > 1 ? "s)" : ")")
                                  : "");
        return result;
      }
      WorkerFailure cause = decode_failure(store->get(attempt_key(attempt, "failed")));
      if (store->check({"stopped"})) {
        result.exit_code = 1;
        result.summary = "the job was stopped on another node (" + store->get("stopped") + ")";
        leave(attempt);  // last: once node 0 has seen every node leave, its store is gone
        return result;
      }
      result.root_cause = cause;
      if (attempt < o.max_restarts) {
        result.restarts = attempt + 1;
        log(LogLevel::warn, "worker " + cause.describe() + "; stopped the group; restart " +
                                std::to_string(attempt + 1) + " of " + std::to_string(o.max_restarts));
        continue;
      }
      leave(attempt);
      result.exit_code = exit_code_for(cause);
      if (result.exit_code == 0) result.exit_code = 1;
      result.summary = "worker " + cause.describe() +
                       (cause.stall.empty() ? " (the first to fail)" : " (the root cause)") + "; stopped the other " +
                       std::to_string(world_size - 1) + " worker" + (world_size == 2 ? "" : "s") + "; " +
                       (o.max_restarts ? "all " + std::to_string(o.max_restarts) + " restarts used"
                                       : "no restarts (--max-restarts 0)");
      return result;
    }
  }
};

Launcher::Launcher(LauncherOptions options) : options_(std::move(options)) {
  TINYDDP_CHECK(pipe2(wake_pipe_, O_CLOEXEC | O_NONBLOCK) == 0, "tinyddp-run: pipe failed: ", std::strerror(errno),
                hint("raise the open-file limit (ulimit -n)"));
  auto& o = options_;
  if (!o.log) o.log = stderr_log_sink("tinyddp-run");
  if (o.run_id.empty()) {
    o.run_id = env::text("TINYDDP_RUN_ID").value_or("default");
  }
  TINYDDP_CHECK(!o.program.empty(), "tinyddp-run: no program to run", hint("tinyddp-run -n 2 -- ./my_program args..."));
  TINYDDP_CHECK(o.nproc_per_node >= 1, "tinyddp-run: --nproc-per-node ", o.nproc_per_node, " must be at least 1",
                hint("one worker per device is usual"));
  TINYDDP_CHECK(o.nnodes >= 1 && o.node_rank >= 0 && o.node_rank < o.nnodes, "tinyddp-run: --node-rank ", o.node_rank,
                " with --nnodes ", o.nnodes, hint("node ranks run from 0 to nnodes - 1"));
  TINYDDP_CHECK(o.max_restarts >= 0, "tinyddp-run: --max-restarts ", o.max_restarts, " is negative", hint("0 or more"));
  TINYDDP_CHECK(o.nnodes == 1 || o.master_port > 0, "tinyddp-run: --nnodes ", o.nnodes,
                " needs --master-port (and --master-addr): every node must find the same store",
                hint("pick a free "
                     "port on node 0, e.g. --master-port 29500"));
  TINYDDP_CHECK(o.master_port >= 0 && o.master_port <= 65535, "tinyddp-run: --master-port ", o.master_port,
                " is not a port", hint("1..65535, or leave it out on one node"));
}

Launcher::~Launcher() {
  for (int fd : wake_pipe_)
    if (fd >= 0) close(fd);
}

void Launcher::request_stop(int signal) {
  stop_signal_.store(signal);
  char byte = 1;
  ssize_t ignored = write(wake_pipe_[1], &byte, 1);
  (void)ignored;
}

LaunchResult Launcher::run() {
  Job job(*this);
  return job.run();
}

}  // namespace tinyddp::comm
