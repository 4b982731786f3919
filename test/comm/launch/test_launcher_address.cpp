// What the launchers' variables say, read without the launchers: Slurm's hostlist and tasks-per-node
// syntax, the store address derived for srun and mpirun, torchrun's variables, and the errors that
// say what to export when nothing can be derived. (test/cluster runs the real launchers.)
#include <doctest/doctest.h>

#include <map>

#include "tinyddp/comm/launch/launcher_address.h"
#include "tinyddp/comm/store/rendezvous.h"
#include "tinyddp/core/error.h"

using namespace tinyddp;
using namespace tinyddp::comm;

namespace {

using Variables = std::map<std::string, std::string>;

EnvironmentLookup from(Variables variables) {
  return [variables = std::move(variables)](const std::string& name) -> std::optional<std::string> {
    auto it = variables.find(name);
    if (it == variables.end()) return std::nullopt;
    return it->second;
  };
}

using Hosts = std::vector<std::string>;

}  // namespace

TEST_CASE("Slurm's hostlist syntax expands as scontrol show hostnames does") {
  CHECK(expand_hostlist("node7") == Hosts{"node7"});
  CHECK(expand_hostlist("gpu[01-03,07],login2") == Hosts{"gpu01", "gpu02", "gpu03", "gpu07", "login2"});
  CHECK(expand_hostlist("n[8-11]") == Hosts{"n8", "n9", "n10", "n11"});
  CHECK(expand_hostlist("r[1-2]n[01-02]") == Hosts{"r1n01", "r1n02", "r2n01", "r2n02"});
  CHECK(expand_hostlist("a[1-2]-ib,b") == Hosts{"a1-ib", "a2-ib", "b"});
  CHECK(expand_hostlist("x[009-011]") == Hosts{"x009", "x010", "x011"});
  CHECK_THROWS_WITH_AS(expand_hostlist("n[1-3"), doctest::Contains("never closed"), Error);
  CHECK_THROWS_WITH_AS(expand_hostlist("n[5-2]"), doctest::Contains("'5-2' is not a range"), Error);
  CHECK_THROWS_WITH_AS(expand_hostlist("n[a-b]"), doctest::Contains("is not a range of numbers"), Error);
}

TEST_CASE("SLURM_TASKS_PER_NODE in its 2(x3) form gives each node's task count") {
  CHECK(expand_tasks_per_node("4") == std::vector<int>{4});
  CHECK(expand_tasks_per_node("2(x3),1") == std::vector<int>{2, 2, 2, 1});
  CHECK(expand_tasks_per_node("1,3(x2)") == std::vector<int>{1, 3, 3});
  CHECK_THROWS_WITH_AS(expand_tasks_per_node("2(x3"), doctest::Contains("neither N nor N(xM)"), Error);

  // The local world size of a task is its node's count, found by SLURM_NODEID.
  Variables step = {{"SLURM_PROCID", "6"},
                    {"SLURM_NTASKS", "7"},
                    {"SLURM_LOCALID", "0"},
                    {"SLURM_TASKS_PER_NODE", "2(x3),1"},
                    {"SLURM_NODEID", "3"}};
  auto last = read_launch_environment(from(step));
  CHECK(last.local_world_size == 1);
  step["SLURM_PROCID"] = "3";
  step["SLURM_LOCALID"] = "1";
  step["SLURM_NODEID"] = "1";
  auto middle = read_launch_environment(from(step));
  CHECK(middle.local_rank == 1);
  CHECK(middle.local_world_size == 2);
}

TEST_CASE("srun without MASTER_ADDR/MASTER_PORT: the step's first host and a port from the job id") {
  Variables step = {{"SLURM_PROCID", "2"},
                    {"SLURM_NTASKS", "4"},
                    {"SLURM_LOCALID", "0"},
                    {"SLURM_NODEID", "1"},
                    {"SLURM_TASKS_PER_NODE", "2(x2)"},
                    {"SLURM_JOB_NODELIST", "gpu[01-08]"},
                    {"SLURM_STEP_NODELIST", "gpu[03-04]"},
                    {"SLURM_JOB_ID", "123456"},
                    {"SLURM_STEP_ID", "2"}};
  auto env = read_launch_environment(from(step));
  CHECK(env.master_addr == "gpu03");  // the step's first node, not the job's
  CHECK(env.master_port == 15000 + (123456 * 16 + 2) % 17000);
  CHECK(env.address_source.find("SLURM_STEP_NODELIST") != std::string::npos);
  // Every task of the step derives the same; the next step of the job another port.
  step["SLURM_PROCID"] = "0";
  step["SLURM_NODEID"] = "0";
  CHECK(read_launch_environment(from(step)).master_port == env.master_port);
  step["SLURM_STEP_ID"] = "3";
  CHECK(read_launch_environment(from(step)).master_port != env.master_port);
  // MASTER_ADDR/MASTER_PORT, when given, win.
  step["MASTER_ADDR"] = "10.1.2.3";
  step["MASTER_PORT"] = "29500";
  auto given = read_launch_environment(from(step));
  CHECK(given.master_addr == "10.1.2.3");
  CHECK(given.master_port == 29500);
  // Every task on one node: loopback.
  Variables one_node = {{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"},         {"SLURM_LOCALID", "1"},
                        {"SLURM_NODEID", "0"}, {"SLURM_TASKS_PER_NODE", "2"}, {"SLURM_JOB_NODELIST", "vm"},
                        {"SLURM_JOB_ID", "7"}};
  CHECK(read_launch_environment(from(one_node)).master_addr == "127.0.0.1");
}

TEST_CASE("mpirun without MASTER_ADDR/MASTER_PORT: mpirun's host and a port from its job id") {
  CHECK(hnp_uri_addresses("98631680.0;tcp://192.0.2.2,10.0.0.5:46549;tcp6://[fd00::2]:57159") ==
        Hosts{"192.0.2.2", "10.0.0.5"});
  Variables ranks = {{"OMPI_COMM_WORLD_RANK", "3"},
                     {"OMPI_COMM_WORLD_SIZE", "4"},
                     {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                     {"OMPI_MCA_ess_base_jobid", "98631681"},
                     {"OMPI_MCA_orte_hnp_uri", "98631680.0;tcp://192.0.2.2:46549"}};
  auto env = read_launch_environment(from(ranks));
  CHECK(env.master_addr == "192.0.2.2");
  CHECK(env.master_port == 15000 + 98631681 % 17000);
  // One host: loopback.
  ranks["OMPI_COMM_WORLD_LOCAL_SIZE"] = "4";
  CHECK(read_launch_environment(from(ranks)).master_addr == "127.0.0.1");
}

TEST_CASE("mpirun of Open MPI 5 (PRRTE): mpirun's host and a port from PMIX_NAMESPACE's pid and job") {
  // What Open MPI 5.0's mpirun sets (its docs' "Environment variables set for MPI applications", and
  // PRRTE's job names, prterun-<host>-<pid>@<job>): still OMPI_COMM_WORLD_*, no OMPI_MCA_orte_hnp_uri.
  std::map<std::string, std::string> ranks = {{"OMPI_COMM_WORLD_RANK", "3"},
                                              {"OMPI_COMM_WORLD_SIZE", "4"},
                                              {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                              {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                              {"OMPI_COMM_WORLD_NODE_RANK", "1"},
                                              {"OMPI_UNIVERSE_SIZE", "4"},
                                              {"PMIX_RANK", "3"},
                                              {"PMIX_NAMESPACE", "prterun-gpu-a-01-48213@1"},
                                              {"PMIX_SERVER_URI41",
                                               "prterun-gpu-a-01-48213@0.1;tcp4://10.1.0.2:40321"}};
  auto env = read_launch_environment(from(ranks));
  CHECK(env.rank == 3);
  CHECK(env.world_size == 4);
  CHECK(env.local_rank == 1);
  CHECK(env.master_addr == "gpu-a-01");  // a host name with dashes of its own
  CHECK(env.master_port == 15000 + (48213 * 16 + 1) % 17000);
  // The next job of the same mpirun (@2) gets another port.
  ranks["PMIX_NAMESPACE"] = "prterun-gpu-a-01-48213@2";
  CHECK(read_launch_environment(from(ranks)).master_port == 15000 + (48213 * 16 + 2) % 17000);
  // One host: loopback, whatever the namespace says.
  ranks["OMPI_COMM_WORLD_LOCAL_SIZE"] = "4";
  CHECK(read_launch_environment(from(ranks)).master_addr == "127.0.0.1");
  // A namespace of another shape (another PMIx launcher) is said; rendezvous adds what to export.
  ranks["OMPI_COMM_WORLD_LOCAL_SIZE"] = "2";
  for (const char* other : {"slurm.pmix.42.0", "prterun-host@1", "prterun--12@1", "prterun-h-x@1", "prterun-h-12@x"}) {
    ranks["PMIX_NAMESPACE"] = other;
    const LaunchEnvironment unknown = read_launch_environment(from(ranks));
    CHECK(unknown.master_addr.empty());
    CHECK_MESSAGE(unknown.address_problem.find("PMIX_NAMESPACE ('" + std::string(other) +
                                               "') is not PRRTE's prterun-<host>-<pid>@<job>") != std::string::npos,
                  unknown.address_problem);
  }
}

TEST_CASE("when the address cannot be derived, the error says exactly what to export, and how") {
  RendezvousOptions options;
  options.timeout = std::chrono::seconds(2);
  options.environment = from({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}});  // neither 4's nor 5's
  CHECK_THROWS_WITH_AS(rendezvous("env://", options),
                       doctest::Contains("could not be derived from Open MPI (OMPI_COMM_WORLD_RANK/SIZE): Open MPI set "
                                         "neither OMPI_MCA_orte_hnp_uri (Open MPI 4) nor PMIX_NAMESPACE (Open MPI 5)"),
                       Error);
  CHECK_THROWS_WITH_AS(rendezvous("env://", options),
                       doctest::Contains("mpirun -x MASTER_ADDR=<host> -x MASTER_PORT=<port>"), Error);
  options.environment = from({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}});
  CHECK_THROWS_WITH_AS(rendezvous("env://", options), doctest::Contains("srun --export=ALL,MASTER_ADDR="), Error);

  // Rank 0 placed away from the derived host cannot host the store there: it says so, at once.
  options.environment = from({{"OMPI_COMM_WORLD_RANK", "0"},
                              {"OMPI_COMM_WORLD_SIZE", "2"},
                              {"OMPI_COMM_WORLD_LOCAL_SIZE", "1"},
                              {"OMPI_MCA_ess_base_jobid", "5"},
                              {"OMPI_MCA_orte_hnp_uri", "4.0;tcp://192.0.2.77:1000"}});  // TEST-NET: never this host
  CHECK_THROWS_WITH_AS(rendezvous("env://", options), doctest::Contains("which is not that host"), Error);
  CHECK_THROWS_WITH_AS(rendezvous("env://", options), doctest::Contains("export MASTER_ADDR=<rank 0's host>"), Error);
}

TEST_CASE("torchrun's variables: the agent's store, the attempt, the job, the error file") {
  auto env = read_launch_environment(from({{"RANK", "1"},
                                           {"WORLD_SIZE", "2"},
                                           {"MASTER_ADDR", "localhost"},
                                           {"MASTER_PORT", "29500"},
                                           {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                           {"TORCHELASTIC_RESTART_COUNT", "2"},
                                           {"TORCHELASTIC_RUN_ID", "abc"},
                                           {"TORCHELASTIC_ERROR_FILE", "/tmp/e.json"}}));
  CHECK(env.torch_agent_store);
  CHECK(env.restart_count == 2);
  CHECK(env.run_id == "abc");
  CHECK(env.torch_error_file == "/tmp/e.json");
  // tinyddp's own variables win over torchrun's.
  auto ours = read_launch_environment(from({{"TINYDDP_RESTART_COUNT", "1"}, {"TORCHELASTIC_RESTART_COUNT", "4"}}));
  CHECK(ours.restart_count == 1);
  CHECK_FALSE(read_launch_environment(from({{"TORCHELASTIC_USE_AGENT_STORE", "False"}})).torch_agent_store);
}
