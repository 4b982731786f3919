#include "tinyddp/comm/store/rendezvous.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cstdlib>
#include <random>
#include <set>
#include <sstream>

#include "tinyddp/comm/launch/launcher_address.h"
#include "tinyddp/comm/store/barrier.h"
#include "tinyddp/comm/store/prefix_store.h"
#include "tinyddp/comm/store/tcp_store.h"
#include "tinyddp/comm/store/torch_tcp_store.h"
#include "tinyddp/core/env.h"
#include "tinyddp/core/error.h"
#include "tinyddp/core/log.h"

namespace tinyddp::comm {

namespace {

using Clock = std::chrono::steady_clock;

std::optional<int> parse_int(const std::string& text) {
  int value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return value;
}

// One family of variables a launcher sets.
struct VariableFamily {
  const char* id;
  const char* name;
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_world_size;
};

constexpr VariableFamily kFamilies[] = {
    {"env", "RANK/WORLD_SIZE", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"slurm", "Slurm (SLURM_PROCID/SLURM_NTASKS)", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
     "SLURM_NTASKS_PER_NODE"},
    {"ompi", "Open MPI (OMPI_COMM_WORLD_RANK/SIZE)", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
};

// A process's identity in the rank claims: host and pid for people, a random nonce so two
// processes with the same pid on different hosts (or containers) still differ.
std::string process_identity() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  std::ostringstream id;
  id << host << " pid " << getpid() << " #" << std::hex << std::random_device{}();
  return id.str();
}

std::string person_readable(const std::string& identity) { return identity.substr(0, identity.rfind(" #")); }

}  // namespace

InitMethod InitMethod::parse(const std::string& text) {
  InitMethod method;
  if (text == "env://") return method;
  const std::string scheme = "tcp://";
  TINYDDP_CHECK(text.rfind(scheme, 0) == 0, "init_method '", text, "' is not understood",
                hint("use \"tcp://host:port\" (rank 0 hosts the store there) or \"env://\" "
                     "(MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE from the environment)"));
  std::string rest = text.substr(scheme.size());
  std::string host, port;
  if (!rest.empty() && rest[0] == '[') {  // [v6 address]:port
    auto close = rest.find(']');
    TINYDDP_CHECK(close != std::string::npos && close + 1 < rest.size() && rest[close + 1] == ':', "init_method '",
                  text, "': an IPv6 address needs its port after the brackets", hint("tcp://[::1]:29500"));
    host = rest.substr(1, close - 1);
    port = rest.substr(close + 2);
  } else {
    auto colon = rest.rfind(':');
    TINYDDP_CHECK(colon != std::string::npos && colon > 0, "init_method '", text, "' names no port",
                  hint("write it as tcp://host:port, e.g. tcp://localhost:12355"));
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
  }
  auto number = parse_int(port);
  TINYDDP_CHECK(number && *number >= 1 && *number <= 65535, "init_method '", text, "': port '", port,
                "' is not a port number 1..65535", hint("every rank must be given the same fixed port"));
  method.kind = Kind::tcp;
  method.host = host;
  method.port = *number;
  return method;
}

EnvironmentLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> { return env::text(name); };
}

namespace {

// Reads an integer variable (nullopt when unset); throws on one that is not a number >= minimum.
std::optional<int> read_integer(const EnvironmentLookup& lookup, const char* name, int minimum) {
  auto text = lookup(name);
  if (!text) return std::nullopt;
  auto value = parse_int(*text);
  TINYDDP_CHECK(value && *value >= minimum, "environment variable ", name, "='", *text,
                "' is not an integer >= ", minimum, hint("check the launcher's settings (or unset it)"));
  return value;
}

// The tasks on this node under srun: SLURM_TASKS_PER_NODE ("2(x3),1") at SLURM_NODEID, else the
// leading number of SLURM_NTASKS_PER_NODE (set only with --ntasks-per-node).
std::optional<int> slurm_local_world_size(const EnvironmentLookup& lookup) {
  auto per_node = lookup("SLURM_STEP_TASKS_PER_NODE");
  if (!per_node) per_node = lookup("SLURM_TASKS_PER_NODE");
  auto node = read_integer(lookup, "SLURM_NODEID", 0);
  if (per_node && node) {
    std::vector<int> tasks = expand_tasks_per_node(*per_node);
    TINYDDP_CHECK(size_t(*node) < tasks.size(), "SLURM_NODEID=", *node, " but SLURM_TASKS_PER_NODE='", *per_node,
                  "' lists ", tasks.size(), " nodes", hint("run the program with srun inside the allocation"));
    return tasks[size_t(*node)];
  }
  if (auto text = lookup("SLURM_NTASKS_PER_NODE")) return parse_int(text->substr(0, text->find('(')));
  return std::nullopt;
}

// Rank, world size, local rank and local world size, from the first family of variables present.
void read_ranks(const EnvironmentLookup& lookup, LaunchEnvironment& env) {
  for (const auto& family : kFamilies) {
    auto rank = read_integer(lookup, family.rank, 0);
    if (!rank) continue;
    auto world_size = read_integer(lookup, family.world_size, 1);
    TINYDDP_CHECK(world_size, family.rank, " is set but ", family.world_size, " is not",
                  hint("set both (found via ", family.name, ")"));
    TINYDDP_CHECK(*rank < *world_size, family.rank, "=", *rank, " is not below ", family.world_size, "=", *world_size,
                  hint("ranks run from 0 to world size - 1"));
    env.rank = *rank;
    env.world_size = *world_size;
    env.source = family.name;
    env.family = family.id;
    std::optional<int> local_size = std::string(family.id) == "slurm"
                                        ? slurm_local_world_size(lookup)
                                        : read_integer(lookup, family.local_world_size, 1);
    env.local_world_size = local_size.value_or(env.world_size);  // absent: one node
    env.local_rank = read_integer(lookup, family.local_rank, 0).value_or(env.rank);
    TINYDDP_CHECK(env.local_rank < env.local_world_size, "local rank ", env.local_rank,
                  " is not below the local world size ", env.local_world_size, " (from ", family.name, ")",
                  hint("check ", family.local_rank, " and ", family.local_world_size));
    return;
  }
}

// MASTER_ADDR/MASTER_PORT, or, under srun and mpirun, an address both can agree on without them.
void read_store_address(const EnvironmentLookup& lookup, LaunchEnvironment& env) {
  if (auto addr = lookup("MASTER_ADDR"); addr && !addr->empty()) env.master_addr = *addr;
  if (auto port = read_integer(lookup, "MASTER_PORT", 1)) {
    TINYDDP_CHECK(*port <= 65535, "MASTER_PORT=", *port, " is not a port", hint("use 1..65535"));
    env.master_port = *port;
  }
  if (!env.master_addr.empty() && env.master_port > 0) {
    env.address_source = "MASTER_ADDR/MASTER_PORT";
    return;
  }
  if (env.family != "slurm" && env.family != "ompi") return;
  std::optional<DerivedStoreAddress> derived;
  try {
    derived = derive_store_address(env.family, lookup, env.address_problem);
  } catch (const Error& e) {
    env.address_problem = e.message();
  }
  if (!derived) return;
  // With every rank on this host, loopback needs no name and no route.
  bool one_host = env.world_size == env.local_world_size;
  if (env.master_addr.empty()) env.master_addr = one_host ? "127.0.0.1" : derived->host;
  if (env.master_port <= 0) env.master_port = derived->port;
  env.address_source = one_host ? "127.0.0.1 (every rank on this host) and " + derived->how : derived->how;
}

// env:// needs the store's address: from MASTER_ADDR/MASTER_PORT, or derived under srun and mpirun.
// When neither gives it, say exactly what to export, and how with the launcher at hand.
void require_store_address(const LaunchEnvironment& env) {
  if (!env.master_addr.empty() && env.master_port > 0) return;
  std::string how = "export MASTER_ADDR=<rank 0's host> MASTER_PORT=<a free port there>, the same on every rank";
  if (env.family == "slurm")
    how += " (srun passes the caller's environment on; or srun --export=ALL,MASTER_ADDR=...,MASTER_PORT=...)";
  if (env.family == "ompi") how += " (mpirun -x MASTER_ADDR=<host> -x MASTER_PORT=<port> ...)";
  TINYDDP_FAIL("env://: MASTER_ADDR and MASTER_PORT must name the store (MASTER_ADDR='", env.master_addr,
               "', MASTER_PORT=", env.master_port, ")",
               env.address_problem.empty()
                   ? ""
                   : "; they could not be derived from " + env.source + ": " + env.address_problem,
               hint(how));
}

// Whether `host` (a name or an address) is one of this machine's addresses: only there can a socket
// be bound to it.
bool is_this_host(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0) return false;
  bool local = false;
  for (addrinfo* a = found; a && !local; a = a->ai_next) {
    int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    local = bind(fd, a->ai_addr, a->ai_addrlen) == 0;  // port 0: any free one
    close(fd);
  }
  freeaddrinfo(found);
  return local;
}

// Rank 0 hosts the store at a derived address; that only works if the address is its own.
void require_this_host(const std::string& host, const LaunchEnvironment& env) {
  if (is_this_host(host)) return;
  char name[256] = {0};
  gethostname(name, sizeof name - 1);
  TINYDDP_FAIL("env://: the store's address was derived from ", env.address_source, " as ", host, ":", env.master_port,
               ", but rank 0 runs on ", name,
               ", which is not that host (the launcher placed rank 0 "
               "elsewhere)",
               hint("export MASTER_ADDR=<rank 0's host> MASTER_PORT=<a free port there> on every rank",
                    env.family == "ompi" ? " (mpirun -x MASTER_ADDR=... -x MASTER_PORT=...)" : ""));
}

enum class StoreKind { host, join, torch_agent };

// The store itself: ours, hosted by this rank or joined, or torchrun's agent's (a PyTorch TCPStore).
void connect_store(Rendezvous& r, const std::string& host, int port, StoreKind kind, const RendezvousOptions& options,
                   const std::string& where) {
  try {
    if (kind == StoreKind::torch_agent) {
      TorchTcpStoreOptions torch_options;
      torch_options.timeout = options.timeout;
      r.root_store = std::make_shared<TorchTcpStore>(host, port, torch_options);
      return;
    }
    TcpStoreOptions store_options;
    store_options.timeout = options.timeout;
    store_options.token = options.token;
    r.tcp_store = std::make_shared<TcpStore>(host, port, kind == StoreKind::host, store_options);
    r.root_store = r.tcp_store;
  } catch (const Error& e) {
    TINYDDP_FAIL("rendezvous at ", where, kind == StoreKind::torch_agent ? " (torchrun's agent store)" : "", ": ",
                 e.message());
  }
}

}  // namespace

LaunchEnvironment read_launch_environment(const EnvironmentLookup& environment) {
  // An empty variable is an unset one (a script that writes MASTER_PORT= to clear it).
  EnvironmentLookup lookup = [&environment](const std::string& name) -> std::optional<std::string> {
    auto value = environment(name);
    return value && !value->empty() ? value : std::nullopt;
  };
  LaunchEnvironment env;
  read_ranks(lookup, env);
  read_store_address(lookup, env);
  auto restart = read_integer(lookup, "TINYDDP_RESTART_COUNT", 0);
  if (!restart) restart = read_integer(lookup, "TORCHELASTIC_RESTART_COUNT", 0);
  env.restart_count = restart.value_or(0);
  if (auto run_id = lookup("TINYDDP_RUN_ID"); run_id && !run_id->empty()) {
    env.run_id = *run_id;
  } else if (auto torch_run_id = lookup("TORCHELASTIC_RUN_ID"); torch_run_id && !torch_run_id->empty()) {
    env.run_id = *torch_run_id;
  }
  if (auto launcher = lookup("TINYDDP_LAUNCHER_STORE"); launcher && !launcher->empty())
    env.launcher_store = env::parse_flag("TINYDDP_LAUNCHER_STORE", *launcher);
  if (auto agent = lookup("TORCHELASTIC_USE_AGENT_STORE"); agent && !agent->empty())
    env.torch_agent_store = env::parse_flag("TORCHELASTIC_USE_AGENT_STORE", *agent);
  if (auto file = lookup("TORCHELASTIC_ERROR_FILE")) env.torch_error_file = *file;
  return env;
}

namespace {

// What one call of rendezvous() knows while it runs: who this process is and where it joins.
struct Joining {
  std::string init_method;
  std::string where;   // "env:// (127.0.0.1:29500, rank 1 of 4)", for messages
  std::string me;      // process_identity()
  bool hosts = false;  // this process hosts the store
  Clock::time_point start = Clock::now();
  Store::Duration timeout{};
};

// Rank, world size and local placement, from the options or else the environment.
Rendezvous place_this_process(const InitMethod& method, const LaunchEnvironment& env, const RendezvousOptions& options,
                              const std::string& init_method) {
  Rendezvous r;
  r.rank = options.rank >= 0 ? options.rank : env.rank;
  r.world_size = options.world_size >= 1 ? options.world_size : env.world_size;
  TINYDDP_CHECK(r.rank >= 0 && r.world_size >= 1, init_method, ": this process's rank and world size are unknown",
                hint(method.kind == InitMethod::Kind::tcp
                         ? "pass rank and world_size"
                         : "start it with tinyddp-run, srun or mpirun, or set RANK and WORLD_SIZE"));
  TINYDDP_CHECK(r.rank < r.world_size, init_method, ": rank ", r.rank, " is not below the world size ", r.world_size,
                hint("ranks run from 0 to world size - 1"));
  bool same_family = options.rank < 0 && options.world_size < 1;
  r.local_rank = same_family && env.local_rank >= 0 ? env.local_rank : r.rank;
  r.local_world_size = same_family && env.local_world_size >= 1 ? env.local_world_size : r.world_size;
  return r;
}

// A process refused at the door says so in the store, so the ranks waiting for it fail at once and
// name it, instead of waiting out the timeout for a rank they would call "missing".
void refuse(PrefixStore& rdzv, const std::string& why) {
  try {
    rdzv.compare_set("refused", "", why);
  } catch (const Error&) {
    // the store is gone too: this process's own error says enough
  }
}

// 1. One world size for everyone: the first rank to arrive sets it, the others must agree.
void agree_on_world_size(PrefixStore& rdzv, const Rendezvous& r, const Joining& j) {
  std::string size_text = std::to_string(r.world_size);
  std::string agreed = rdzv.compare_set("world_size", "", size_text);
  if (agreed == size_text) {
    rdzv.compare_set("world_size_set_by", "", "rank " + std::to_string(r.rank) + " (" + person_readable(j.me) + ")");
    return;
  }
  std::string setter = rdzv.compare_set("world_size_set_by", "", "");
  std::string why = "rank " + std::to_string(r.rank) + " (" + person_readable(j.me) + ") has WORLD_SIZE=" + size_text +
                    ", but " + (setter.empty() ? "the ranks that joined first" : setter) + " has WORLD_SIZE=" + agreed;
  refuse(rdzv, why);
  TINYDDP_FAIL("rendezvous at ", j.where, ": world size mismatch: ", why,
               hint("every process must be started with the same WORLD_SIZE (check the launcher's -n/--nnodes, "
                    "or srun's task count)"));
}

// 2. One process per rank: claim ours; if someone already holds it, say who.
void claim_rank(PrefixStore& rdzv, const Rendezvous& r, const Joining& j) {
  std::string holder = rdzv.compare_set("rank/" + std::to_string(r.rank), "", j.me);
  if (holder != j.me) {
    std::string why = "rank " + std::to_string(r.rank) + " is claimed by two processes: " + person_readable(holder) +
                      " joined first, and " + person_readable(j.me) + " also says it is rank " + std::to_string(r.rank);
    refuse(rdzv, why);
    TINYDDP_FAIL("rendezvous at ", j.where, ": ", why,
                 hint("every process needs its own RANK (a launcher started twice, or a wrong rank in a script?)"));
  }
  rdzv.append("joined", std::to_string(r.rank) + ",");
}

// The ranks that have claimed their place so far.
std::set<int> ranks_joined(PrefixStore& rdzv) {
  std::set<int> came;
  if (!rdzv.check({"joined"})) return came;
  std::istringstream list(rdzv.get("joined"));
  for (std::string item; std::getline(list, item, ',');)
    if (auto n = parse_int(item)) came.insert(*n);
  return came;
}

// "3/4 ranks joined after 20.0 s; missing: rank 2 (node 1)". The node is a guess from the local
// world size (launchers place ranks node by node), shown only when there are several nodes.
std::string joining_status(const std::set<int>& came, const Rendezvous& r, const Joining& j) {
  std::vector<int> missing;
  for (int i = 0; i < r.world_size; ++i)
    if (!came.count(i)) missing.push_back(i);
  std::string text = std::to_string(came.size()) + "/" + std::to_string(r.world_size) + " ranks joined after " +
                     seconds_text(Clock::now() - j.start) + "; missing: " + describe_ranks(missing);
  if (r.local_world_size < r.world_size && missing.size() <= 8) {
    std::set<int> nodes;
    for (int m : missing) nodes.insert(m / r.local_world_size);
    std::string list;
    for (int n : nodes) list += (list.empty() ? "" : ", ") + std::to_string(n);
    text += " (node" + std::string(nodes.size() > 1 ? "s " : " ") + list + ", with " +
            std::to_string(r.local_world_size) + " ranks a node)";
  }
  return text;
}

// 3. Everyone waits for everyone. The wait is cut into slices: between them it fails at once when a
//    process was refused (it names that one), and says every progress interval who is still missing.
void wait_for_everyone(PrefixStore& rdzv, const Rendezvous& r, const Joining& j) {
  std::vector<std::string> all;
  for (int i = 0; i < r.world_size; ++i) all.push_back("rank/" + std::to_string(i));
  const auto deadline = j.start + j.timeout;
  const auto interval = progress_interval();
  auto next_report = j.start + interval;
  for (;;) {
    auto now = Clock::now();
    auto slice_end = std::min({deadline, next_report, now + std::chrono::seconds(1)});
    auto slice = slice_end - now;
    try {
      rdzv.wait(all, std::max<Store::Duration>(std::chrono::duration_cast<Store::Duration>(slice), Store::Duration(1)));
      return;
    } catch (const Error& failure) {
      // A slice ended (or the store is gone: then the questions below fail too, and this error,
      // which says the connection was lost, is the one to report).
      std::string refused;
      std::set<int> came;
      try {
        if (rdzv.check({"refused"})) refused = rdzv.get("refused");
        came = ranks_joined(rdzv);
      } catch (const Error&) {
        TINYDDP_FAIL("rendezvous at ", j.where, ": ", failure.message());
      }
      TINYDDP_CHECK(refused.empty(), "rendezvous at ", j.where, ": a process was refused: ", refused,
                    hint("start every process of the job with the same WORLD_SIZE and its own RANK"));
      if (slice_end == deadline || Clock::now() >= deadline)
        TINYDDP_FAIL("rendezvous at ", j.where, ": ", joining_status(came, r, j),
                     hint("those processes did not start, crashed before joining, or use another address/port; if "
                          "they are only slow, raise the timeout: ",
                          timeout_hint(std::chrono::duration_cast<Store::Duration>(j.timeout))));
      if (Clock::now() >= next_report) {
        next_report += interval;
        log_line(LogLevel::warn, "rendezvous",
                 "rank " + std::to_string(r.rank) + ": " + joining_status(came, r, j) + "; giving up after " +
                     seconds_text(j.timeout) + " (TINYDDP_TIMEOUT)");
      }
    }
  }
}

// 4. The rank hosting the store must not leave before every other rank has seen the job complete:
//    the others say they are through, and the host waits for that.
void hold_store_until_through(PrefixStore& rdzv, const Rendezvous& r, const Joining& j) {
  if (!j.hosts) {
    rdzv.set("through/" + std::to_string(r.rank), "1");
    return;
  }
  std::vector<std::string> through;
  for (int i = 1; i < r.world_size; ++i) through.push_back("through/" + std::to_string(i));
  rdzv.wait(through, j.timeout);
}

}  // namespace

Rendezvous rendezvous(const std::string& init_method, RendezvousOptions options) {
  InitMethod method = InitMethod::parse(init_method);
  LaunchEnvironment env = read_launch_environment(options.environment ? options.environment : process_environment());
  Rendezvous r = place_this_process(method, env, options, init_method);

  std::string host = method.host;
  int port = method.port;
  if (method.kind == InitMethod::Kind::env) {
    require_store_address(env);
    host = env.master_addr;
    port = env.master_port;
  }
  r.store_address = host + ":" + std::to_string(port);
  bool agent_store = method.kind == InitMethod::Kind::env && env.torch_agent_store;
  Joining j;
  j.init_method = init_method;
  j.timeout = options.timeout;
  j.me = process_identity();
  j.hosts = r.rank == 0 && !agent_store && options.rank0_hosts_store.value_or(!env.launcher_store);
  j.where = init_method + " (" + r.store_address + ", rank " + std::to_string(r.rank) + " of " +
            std::to_string(r.world_size) + ")";
  if (j.hosts && method.kind == InitMethod::Kind::env && env.address_source != "MASTER_ADDR/MASTER_PORT")
    require_this_host(host, env);

  connect_store(r, host, port,
                agent_store ? StoreKind::torch_agent
                : j.hosts   ? StoreKind::host
                            : StoreKind::join,
                options, j.where);
  auto job = std::make_shared<PrefixStore>(r.root_store,
                                           "tinyddp/" + env.run_id + "/" + std::to_string(env.restart_count));
  r.store = job;
  PrefixStore rdzv(job, "rdzv");
  agree_on_world_size(rdzv, r, j);
  claim_rank(rdzv, r, j);
  wait_for_everyone(rdzv, r, j);
  hold_store_until_through(rdzv, r, j);
  return r;
}

}  // namespace tinyddp::comm
