#include "comm/store/rendezvous.h"

#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cstdlib>
#include <random>
#include <set>
#include <sstream>

#include "comm/store/barrier.h"
#include "comm/store/prefix_store.h"
#include "comm/store/tcp_store.h"
#include "core/error.h"

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
  const char* name;
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_world_size;
};

constexpr VariableFamily kFamilies[] = {
    {"RANK/WORLD_SIZE", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"Slurm (SLURM_PROCID/SLURM_NTASKS)", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
    {"Open MPI (OMPI_COMM_WORLD_RANK/SIZE)", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
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

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

}  // namespace

InitMethod InitMethod::parse(const std::string& text) {
  InitMethod method;
  if (text == "env://") return method;
  const std::string scheme = "tcp://";
  TINYDDP_CHECK(text.rfind(scheme, 0) == 0, "init_method '", text,
                "' is not understood; hint: use \"tcp://host:port\" (rank 0 hosts the store there) or \"env://\" "
                "(MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE from the environment)");
  std::string rest = text.substr(scheme.size());
  std::string host, port;
  if (!rest.empty() && rest[0] == '[') {  // [v6 address]:port
    auto close = rest.find(']');
    TINYDDP_CHECK(close != std::string::npos && close + 1 < rest.size() && rest[close + 1] == ':', "init_method '",
                  text, "': an IPv6 address needs its port after the brackets; hint: tcp://[::1]:29500");
    host = rest.substr(1, close - 1);
    port = rest.substr(close + 2);
  } else {
    auto colon = rest.rfind(':');
    TINYDDP_CHECK(colon != std::string::npos && colon > 0, "init_method '", text,
                  "' names no port; hint: write it as tcp://host:port, e.g. tcp://localhost:12355");
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
  }
  auto number = parse_int(port);
  TINYDDP_CHECK(number && *number >= 1 && *number <= 65535, "init_method '", text, "': port '", port,
                "' is not a port number 1..65535; hint: every rank must be given the same fixed port");
  method.kind = Kind::tcp;
  method.host = host;
  method.port = *number;
  return method;
}

EnvironmentLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (!value) return std::nullopt;
    return std::string(value);
  };
}

LaunchEnvironment read_launch_environment(const EnvironmentLookup& lookup) {
  LaunchEnvironment env;
  auto integer = [&](const char* name, int minimum) -> std::optional<int> {
    auto text = lookup(name);
    if (!text) return std::nullopt;
    auto value = parse_int(*text);
    TINYDDP_CHECK(value && *value >= minimum, "environment variable ", name, "='", *text, "' is not an integer >= ",
                  minimum, "; hint: check the launcher's settings (or unset it)");
    return value;
  };
  for (const auto& family : kFamilies) {
    auto rank = integer(family.rank, 0);
    if (!rank) continue;
    auto world_size = integer(family.world_size, 1);
    TINYDDP_CHECK(world_size, family.rank, " is set but ", family.world_size, " is not; hint: set both (found via ",
                  family.name, ")");
    TINYDDP_CHECK(*rank < *world_size, family.rank, "=", *rank, " is not below ", family.world_size, "=", *world_size,
                  "; hint: ranks run from 0 to world size - 1");
    env.rank = *rank;
    env.world_size = *world_size;
    env.source = family.name;
    // Slurm writes SLURM_NTASKS_PER_NODE as "4" or "4(x2)"; the leading number is what we need.
    std::optional<int> local_size;
    if (auto text = lookup(family.local_world_size)) {
      auto digits = text->substr(0, text->find('('));
      local_size = parse_int(digits);
    }
    env.local_world_size = local_size.value_or(env.world_size);  // absent: one node
    env.local_rank = integer(family.local_rank, 0).value_or(env.rank);
    TINYDDP_CHECK(env.local_rank < env.local_world_size, "local rank ", env.local_rank, " is not below the local world size ",
                  env.local_world_size, " (from ", family.name, "); hint: check ", family.local_rank, " and ",
                  family.local_world_size);
    break;
  }
  if (auto addr = lookup("MASTER_ADDR")) env.master_addr = *addr;
  if (auto port = integer("MASTER_PORT", 1)) {
    TINYDDP_CHECK(*port <= 65535, "MASTER_PORT=", *port, " is not a port; hint: use 1..65535");
    env.master_port = *port;
  }
  env.restart_count = integer("TINYDDP_RESTART_COUNT", 0).value_or(0);
  if (auto run_id = lookup("TINYDDP_RUN_ID"); run_id && !run_id->empty()) env.run_id = *run_id;
  if (auto launcher = lookup("TINYDDP_LAUNCHER_STORE")) env.launcher_store = *launcher == "1";
  return env;
}

Rendezvous rendezvous(const std::string& init_method, RendezvousOptions options) {
  InitMethod method = InitMethod::parse(init_method);
  LaunchEnvironment env = read_launch_environment(options.environment ? options.environment : process_environment());

  Rendezvous r;
  r.rank = options.rank >= 0 ? options.rank : env.rank;
  r.world_size = options.world_size >= 1 ? options.world_size : env.world_size;
  TINYDDP_CHECK(r.rank >= 0 && r.world_size >= 1, init_method, ": this process's rank and world size are unknown",
                "; hint: ", method.kind == InitMethod::Kind::tcp ? "pass rank and world_size" :
                "start it with tinyddp-run, srun or mpirun, or set RANK and WORLD_SIZE");
  TINYDDP_CHECK(r.rank < r.world_size, init_method, ": rank ", r.rank, " is not below the world size ", r.world_size,
                "; hint: ranks run from 0 to world size - 1");
  bool same_family = options.rank < 0 && options.world_size < 1;
  r.local_rank = same_family && env.local_rank >= 0 ? env.local_rank : r.rank;
  r.local_world_size = same_family && env.local_world_size >= 1 ? env.local_world_size : r.world_size;

  std::string host = method.host;
  int port = method.port;
  if (method.kind == InitMethod::Kind::env) {
    TINYDDP_CHECK(!env.master_addr.empty() && env.master_port > 0, "env://: MASTER_ADDR and MASTER_PORT must name ",
                  "the store (MASTER_ADDR='", env.master_addr, "', MASTER_PORT=", env.master_port,
                  "); hint: export MASTER_ADDR=<rank 0's host> MASTER_PORT=<a free port>, the same on every rank");
    host = env.master_addr;
    port = env.master_port;
  }
  r.store_address = host + ":" + std::to_string(port);
  bool hosts = r.rank == 0 && options.rank0_hosts_store.value_or(!env.launcher_store);
  auto start = Clock::now();
  std::string where = init_method + " (" + r.store_address + ", rank " + std::to_string(r.rank) + " of " +
                      std::to_string(r.world_size) + ")";

  TcpStoreOptions store_options;
  store_options.timeout = options.timeout;
  store_options.token = options.token;
  try {
    r.tcp_store = std::make_shared<TcpStore>(host, port, hosts, store_options);
  } catch (const Error& e) {
    TINYDDP_FAIL("rendezvous at ", where, ": ", e.message());
  }
  auto job = std::make_shared<PrefixStore>(r.tcp_store,
                                           "tinyddp/" + env.run_id + "/" + std::to_string(env.restart_count));
  r.store = job;
  PrefixStore rdzv(job, "rdzv");

  // 1. One world size for everyone: the first rank to arrive sets it, the others must agree.
  std::string size_text = std::to_string(r.world_size);
  std::string agreed = rdzv.compare_set("world_size", "", size_text);
  TINYDDP_CHECK(agreed == size_text, "rendezvous at ", where, ": world size mismatch: this process has world size ",
                r.world_size, " but the ranks that joined first have ", agreed,
                "; hint: every process must be started with the same WORLD_SIZE (check the launcher's -n/--nnodes, "
                "or srun's task count)");

  // 2. One process per rank: claim ours; if someone already holds it, say who.
  std::string me = process_identity();
  std::string holder = rdzv.compare_set("rank/" + std::to_string(r.rank), "", me);
  TINYDDP_CHECK(holder == me, "rendezvous at ", where, ": rank ", r.rank, " is claimed by two processes: ",
                person_readable(holder), " joined first, and this one (", person_readable(me),
                ") also says it is rank ", r.rank,
                "; hint: every process needs its own RANK (a launcher started twice, or a wrong rank in a script?)");
  rdzv.append("joined", std::to_string(r.rank) + ",");

  // 3. Everyone waits for everyone, and on a timeout says who never came.
  std::vector<std::string> all;
  for (int i = 0; i < r.world_size; ++i) all.push_back("rank/" + std::to_string(i));
  try {
    rdzv.wait(all, options.timeout);
  } catch (const Error& failure) {
    // A timeout: find out who came. (If the store itself is gone, that question fails too, and the
    // original error, which says the connection was lost, is the one to report.)
    std::string joined;
    try {
      rdzv.set_timeout(std::chrono::seconds(5));
      joined = rdzv.get("joined");
    } catch (const Error&) {
      TINYDDP_FAIL("rendezvous at ", where, ": ", failure.message());
    }
    std::set<int> came;
    std::istringstream list(joined);
    for (std::string item; std::getline(list, item, ',');)
      if (auto n = parse_int(item)) came.insert(*n);
    std::vector<int> missing;
    for (int i = 0; i < r.world_size; ++i)
      if (!came.count(i)) missing.push_back(i);
    std::ostringstream waited;
    waited.precision(1);
    waited << std::fixed << seconds_since(start);
    TINYDDP_FAIL("rendezvous at ", where, ": ", came.size(), "/", r.world_size, " ranks joined after ", waited.str(),
                 " s; missing: ", describe_ranks(missing),
                 "; hint: those processes did not start, crashed before joining, or use another address/port; if they "
                 "are only slow, raise the rendezvous timeout");
  }

  // 4. The rank hosting the store must not leave before every other rank has seen the job complete:
  //    the others say they are through, and the host waits for that.
  if (hosts) {
    std::vector<std::string> through;
    for (int i = 1; i < r.world_size; ++i) through.push_back("through/" + std::to_string(i));
    rdzv.wait(through, options.timeout);
  } else {
    rdzv.set("through/" + std::to_string(r.rank), "1");
  }
  return r;
}

}  // namespace tinyddp::comm
