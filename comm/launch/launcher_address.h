// Where the store is, when the launcher did not say: srun and mpirun start every process with its
// rank, but set no MASTER_ADDR / MASTER_PORT. What they do say is enough to agree on one address
// without talking first:
//
//   Slurm    the host: the first node of the step (SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST), in
//            Slurm's hostlist syntax ("gpu[01-04,07],login2"), where task 0 runs with srun's block and
//            cyclic distributions; the port: 15000 + (job id x 16 + step id) mod 17000, the same on
//            every task of the step and different for the steps of one job.
//   Open MPI the host: mpirun's own, where rank 0 runs when mpirun's host is the first in its host
//            list, as it is by default. Open MPI 4 lists its addresses in OMPI_MCA_orte_hnp_uri, and
//            the port is 15000 + job id mod 17000 (the job id leads the same URI). Open MPI 5 (PRRTE)
//            names it in PMIX_NAMESPACE, "prterun-<host>-<pid>@<job>", and the port is 15000 +
//            (pid x 16 + job) mod 17000. Both still set OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE.
//   either   every rank on one host (the world is the local world): 127.0.0.1.
//
// Where that cannot work (rank 0 placed elsewhere, a port another job holds), the error names the two
// variables to export on every rank; MASTER_ADDR and MASTER_PORT always win over what is derived.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tinyddp/comm/store/rendezvous.h"

namespace tinyddp::comm {

// Expands Slurm's hostlist syntax: "n[1-3,07],login" -> n1 n2 n3 n07 login; zero padding is kept
// ("n[01-03]" -> n01 n02 n03) and several bracket groups multiply ("r[1-2]n[1-2]" -> r1n1 r1n2 r2n1
// r2n2). Throws on an unbalanced bracket or a range that runs backwards.
std::vector<std::string> expand_hostlist(const std::string& hostlist);

// Expands SLURM_TASKS_PER_NODE ("2(x3),1" -> 2 2 2 1): the number of tasks on each node of the step.
std::vector<int> expand_tasks_per_node(const std::string& text);

struct DerivedStoreAddress {
  std::string host;
  int port = 0;
  std::string how;  // "first host of SLURM_STEP_NODELIST, port from SLURM_JOB_ID" ... for messages
};

// The store's address for a job that Slurm (`family` "slurm") or Open MPI ("ompi") started without
// MASTER_ADDR/MASTER_PORT; nullopt when the environment does not tell, with the reason in `why`.
std::optional<DerivedStoreAddress> derive_store_address(const std::string& family, const EnvironmentLookup& lookup,
                                                        std::string& why);

// The addresses in an Open MPI HNP URI ("1234.0;tcp://10.0.0.1,192.168.1.2:41000;tcp6://[...]:41001").
std::vector<std::string> hnp_uri_addresses(const std::string& uri);

}  // namespace tinyddp::comm
