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
//                     SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID,
//                       SLURM_TASKS_PER_NODE ("2(x3),1")                    (srun)
//                     OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE  (Open MPI's mpirun)
//                   MASTER_ADDR and MASTER_PORT name the store. Under srun and mpirun, which set
//                   neither, the address is derived from what they do set (comm/launch/launcher_address.h).
//                   Under torchrun (TORCHELASTIC_USE_AGENT_STORE=True) the store is its agent's, a
//                   PyTorch TCPStore, joined as a client (comm/store/torch_tcp_store.h), and
//                   TORCHELASTIC_RESTART_COUNT / TORCHELASTIC_RUN_ID name the attempt and the job.
//
// Joining is checked, because a job that starts wrong should say so at once and say why:
//   - every rank registers its world size with compare_set: a different one is an error;
//   - every rank claims its rank with compare_set: a second process claiming it is an error;
//   - every rank waits for all the others; after the timeout the error names the ranks missing
//     ("3/4 ranks joined after 300.0 s; missing: rank 2").
//
// Keys live under "tinyddp/<run id>/<restart count>/": a restarted job (TINYDDP_RESTART_COUNT, or
// torchrun's TORCHELASTIC_RESTART_COUNT) or another job on a shared store (TINYDDP_RUN_ID, or
// TORCHELASTIC_RUN_ID) never sees stale keys. The store returned is already scoped to that namespace.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "tinyddp/comm/store/store.h"
#include "tinyddp/comm/timeout.h"

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
  std::string source;              // which variables the ranks came from, for messages
  std::string family;              // "env" (RANK/WORLD_SIZE), "slurm", "ompi"; "" when none
  std::string address_source;      // how master_addr/port were found: "MASTER_ADDR/MASTER_PORT", or derived
  std::string address_problem;     // why they could not be derived, when they are missing
  int restart_count = 0;           // TINYDDP_RESTART_COUNT, else TORCHELASTIC_RESTART_COUNT
  std::string run_id = "default";  // TINYDDP_RUN_ID, else TORCHELASTIC_RUN_ID
  bool launcher_store = false;     // TINYDDP_LAUNCHER_STORE=1: the store is already hosted (by
                                   // tinyddp-run or tinyddp-store); rank 0 connects as a client
  bool torch_agent_store = false;  // TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent hosts a
                                   // PyTorch TCPStore at MASTER_ADDR:MASTER_PORT
  std::string torch_error_file;    // TORCHELASTIC_ERROR_FILE: where torchrun reads a failed rank's error
};

// RANK/WORLD_SIZE first, then Slurm's, then Open MPI's variables, one family at a time (a launcher run
// inside a Slurm allocation sets both, and RANK is the one that means this process). Missing local
// rank / local world size assume one node. Throws on a value that is not a number or out of range.
// MASTER_ADDR/MASTER_PORT left unset by srun or mpirun are derived (address_source says how), or
// address_problem says why not.
LaunchEnvironment read_launch_environment(const EnvironmentLookup& lookup = process_environment());

struct RendezvousOptions {
  int rank = -1;        // -1: from the environment
  int world_size = -1;  // -1: from the environment
  // For connecting and for the others to join. Default: TINYDDP_TIMEOUT, else 5 minutes.
  Store::Duration timeout = timeout_from_environment();
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
  std::string store_address;            // host:port
  std::shared_ptr<TcpStore> tcp_store;  // the connection (and, on the hosting rank, the server); null
                                        // when the store is torchrun's (see root_store)
  std::shared_ptr<Store> root_store;    // the store itself, unscoped: a TcpStore or a TorchTcpStore
  std::shared_ptr<Store> store;         // scoped to this job and attempt: use this one
};

Rendezvous rendezvous(const std::string& init_method, RendezvousOptions options = {});

}  // namespace tinyddp::comm
