#!/usr/bin/env bash
# cluster_mpi_agent.sh: Open MPI's remote-start agent (plm_rsh_agent) for the simulated cluster of
# scripts/sim_cluster.sh: where mpirun would ssh to a host, this enters that host's namespaces.
#
#   SIM_CLUSTER=NAME mpirun --mca plm_rsh_agent bench/cluster_mpi_agent.sh --host 10.N.0.1:2,10.N.0.2:2 ...
#
# mpirun calls it as ssh: `agent [ssh options] HOST COMMAND...`, COMMAND being a shell line (it starts
# Open MPI's daemon, orted). HOST is a simulated host's address, 10.N.0.(I+1), so its last number
# less one is the host's index I.
set -euo pipefail
sim="$(cd "$(dirname "$0")/.." && pwd)/scripts/sim_cluster.sh"
[ -n "${SIM_CLUSTER:-}" ] || { echo "cluster_mpi_agent.sh: SIM_CLUSTER is not set; hint: the cluster's name (sim_cluster.sh up NAME K)" >&2; exit 2; }
while [[ "${1:-}" == -* ]]; do shift; done  # ssh options mpirun may add (-x: no X11)
host=${1:?cluster_mpi_agent.sh: no host given}
shift
[[ "$host" =~ ^10\.[0-9]+\.0\.([0-9]+)$ ]] || { echo "cluster_mpi_agent.sh: '$host' is not a simulated host's address (10.N.0.I+1); hint: give mpirun the addresses of sim_cluster.sh addr" >&2; exit 2; }
exec "$sim" run "$SIM_CLUSTER" $((BASH_REMATCH[1] - 1)) /bin/sh -c "$*"
