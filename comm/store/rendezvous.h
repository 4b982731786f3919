// Rendezvous: how the processes of a job find the store and each other, and learn their ranks.
//
//   auto r = rendezvous("tcp://10.0.0.1:29500", {.rank = rank, .world_size = 4});   // the seed's init_method
//   auto r = rendezvous("env://");        // under tinyddp-run, torchrun, srun or mpirun
//   r.store->set(...);   r.rank;   r.world_size;
//
// tcp://host:port   rank 0 hosts the store on that port; the others connect to it. Ranks and world
//                   size come from the options (or, when left at -1, from the environment).
// env://            everything comes from the environment, read by read_launch_environment():
//                     RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE         (tinyddp-run, torchrun)
//                     SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, ...         (srun)
//                     OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE  (Open MPI's mpirun)
//                   MASTER_ADDR and MASTER_PORT name the store in every case.
//
// Joining is checked, because a job that starts wrong should say so at once and say why:
//   - every rank registers its world size with compare_set: a different one is an error;
//   - every rank claims its rank with compare_set: a second process claiming it is an error;
//   - every rank waits for all the others; after the timeout the error names the ranks missing
//     ("3/4 ranks joined after 300.0 s; missing: rank 2").
//
// Keys live under "tinyddp/<run id>/<restart count>/": a restarted job (TINYDDP_RESTART_COUNT) or
// another job on a shared store (TINYDDP_RUN_ID) never sees stale keys. The store returned is
// already scoped to that namespace.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "comm/store/store.h"

namespace tinyddp::comm {

class TcpStore;

struct InitMethod {
  enum class Kind { tcp, env };
  Kind kind = Kind::env;
  std::string host;  // tcp:// only
  int port = 0;      // tcp:// only

  // Accepts "tcp://host:port", "tcp://[v6 address]:port" and "env://".
  static InitMethod parse(const std::string& text);
};

// Reads one environment variable (nullopt when unset). Tests pass their own.
using EnvironmentLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvironmentLookup process_environment();

// What a launcher told this process. Fields nobody set stay at -1 / "".
struct LaunchEnvironment {
  int rank = -1;
  int world_size = -1;
  int local_rank = -1;
  int local_world_size = -1;
  std::string master_addr;
  int master_port = -1;
  std::string source;         // which variables the ranks came from, for messages
  int restart_count = 0;      // TINYDDP_RESTART_COUNT
  std::string run_id = "default";  // TINYDDP_RUN_ID
  bool launcher_store = false;     // TINYDDP_LAUNCHER_STORE=1: the store is already hosted (by
                                   // tinyddp-run or tinyddp-store); rank 0 connects as a client
};

// RANK/WORLD_SIZE first, then Slurm's, then Open MPI's variables, one family at a time (a launcher run
// inside a Slurm allocation sets both, and RANK is the one that means this process). Missing local
// rank / local world size assume one node. Throws on a value that is not a number or out of range.
LaunchEnvironment read_launch_environment(const EnvironmentLookup& lookup = process_environment());

struct RendezvousOptions {
  int rank = -1;        // -1: from the environment
  int world_size = -1;  // -1: from the environment
  Store::Duration timeout = Store::kDefaultTimeout;  // for connecting and for the others to join
  // Whether rank 0 starts the store server. nullopt: yes, unless TINYDDP_LAUNCHER_STORE=1.
  std::optional<bool> rank0_hosts_store;
  std::optional<std::string> token;  // nullopt: TINYDDP_TOKEN
  EnvironmentLookup environment;     // empty: the process environment
};

struct Rendezvous {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string store_address;           // host:port
  std::shared_ptr<TcpStore> tcp_store;  // the connection (and, on the hosting rank, the server)
  std::shared_ptr<Store> store;         // scoped to this job and attempt: use this one
};

Rendezvous rendezvous(const std::string& init_method, RendezvousOptions options = {});

}  // namespace tinyddp::comm
