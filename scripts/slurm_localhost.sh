#!/usr/bin/env bash
# slurm_localhost.sh: a one-node Slurm cluster on this machine, for the tests that run srun.
#
#   scripts/slurm_localhost.sh check                 say why Slurm cannot run here (exit 1), or nothing
#   scripts/slurm_localhost.sh start DIR [OWNER_PID] start munged, slurmctld and slurmd, all private to
#                                                    DIR; prints "SLURM_CONF=DIR/slurm.conf" once srun works.
#                                                    With OWNER_PID, everything is stopped when it exits.
#   scripts/slurm_localhost.sh stop DIR              stop them and remove DIR
#   scripts/slurm_localhost.sh with -- CMD [ARGS...] start, run CMD with SLURM_CONF set, stop (also when
#                                                    CMD fails or this script is killed)
#   scripts/slurm_localhost.sh start DIR OWNER_PID --sim NAME K
#                                                    the same across the K simulated hosts of
#                                                    scripts/sim_cluster.sh's cluster NAME: nodes node0 ..
#                                                    node(K-1), slurmctld and a slurmd on host 0, a slurmd
#                                                    on each other host; srun works inside the hosts
#                                                    (sim_cluster.sh run NAME I srun ...)
#
# Nothing outside DIR is touched: its own munge key and socket, its own ports (free ones, picked at
# start), state, spool and logs under DIR; clients find it through SLURM_CONF. The node is this host,
# reached at 127.0.0.1, with 8 CPUs declared whatever the hardware (config_overrides), so a test can
# start more tasks than there are cores. Needs root (slurmd starts jobs as their users) and Debian's
# slurmctld, slurmd, slurm-client and munge. With --sim, munged stays on this machine: its socket is a
# file, which processes in any network namespace reach; the Slurm daemons run inside the hosts (their
# pid files hold pids of the hosts' own pid spaces, so they are stopped there).
set -euo pipefail

die() { echo "slurm_localhost.sh: $*" >&2; exit 2; }

sim="$(cd "$(dirname "$0")" && pwd)/sim_cluster.sh"

check() {
  [ "$(id -u)" -eq 0 ] || { echo "needs root (slurmd runs the tasks)"; return 1; }
  for tool in slurmctld slurmd srun sinfo munged; do
    command -v "$tool" >/dev/null || [ -x "/usr/sbin/$tool" ] ||
      { echo "needs '$tool' (Debian: apt-get install slurmctld slurmd slurm-client munge)"; return 1; }
  done
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null ||
    echo $(( 20000 + RANDOM % 10000 ))
}

# The node lines: this host at 127.0.0.1, or with --sim the simulated hosts (node<I>, on host I's
# hostname and address).
node_lines() {
  if [ -z "${sim_name:-}" ]; then
    echo "NodeName=$(hostname) NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN"
    return
  fi
  local i
  for ((i = 0; i < sim_hosts; i++)); do
    echo "NodeName=node$i NodeHostname=$sim_name-$i NodeAddr=$("$sim" addr "$sim_name" "$i") CPUs=8 State=UNKNOWN"
  done
}

write_config() {
  local dir=$1 controller
  controller="$(hostname)(127.0.0.1)"
  [ -n "${sim_name:-}" ] && controller="$sim_name-0($("$sim" addr "$sim_name" 0))"
  cat >"$dir/slurm.conf" <<EOF
ClusterName=tinyddp
SlurmctldHost=$controller
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge.sock
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd-%n.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
$(node_lines)
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
}

# The daemons' pid files: munged's and, unless they ran inside simulated hosts, Slurm's.
local_pidfiles() {
  local dir=$1
  if [ -f "$dir/sim" ]; then
    echo "$dir/munged.pid"
  else
    echo "$dir"/slurmd-*.pid "$dir/slurmctld.pid" "$dir/munged.pid"
  fi
}

stop() {
  local dir=$1
  [ -d "$dir" ] || return 0
  if [ -f "$dir/sim" ]; then
    # Inside the hosts, by the pids their own pid spaces gave (the hosts may already be gone).
    local name hosts i pidfile
    read -r name hosts <"$dir/sim"
    for ((i = 0; i < hosts; i++)); do
      for pidfile in "$dir/slurmd-node$i.pid" "$dir/slurmctld.pid"; do
        [ -f "$pidfile" ] || continue
        [ "$pidfile" = "$dir/slurmctld.pid" ] && [ "$i" -ne 0 ] && continue
        "$sim" run "$name" "$i" kill -KILL "$(cat "$pidfile")" 2>/dev/null || true
      done
    done
  fi
  local pidfiles
  pidfiles=$(local_pidfiles "$dir")
  for pidfile in $pidfiles; do
    [ -f "$pidfile" ] && kill -TERM "$(cat "$pidfile" 2>/dev/null)" 2>/dev/null || true
  done
  for _ in $(seq 50); do
    local alive=0
    for pidfile in $pidfiles; do
      [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile" 2>/dev/null)" 2>/dev/null && alive=1
    done
    [ $alive -eq 0 ] && break
    sleep 0.1
  done
  for pidfile in $pidfiles; do
    [ -f "$pidfile" ] && kill -KILL "$(cat "$pidfile" 2>/dev/null)" 2>/dev/null || true
  done
  rm -rf "$dir"
}

# `ip netns exec` gives each simulated host a sysfs of its own, without this machine's cgroup mounts,
# and slurmd does not start without them: the same hierarchies are mounted there (those missing).
mount_cgroups() {
  local host=$1 mounts
  mounts=$(awk '$2 ~ "^/sys/fs/cgroup" {print $3, $2, $4}' /proc/self/mounts)
  "$sim" run "$sim_name" "$host" sh -c 'echo "$1" | while read -r type dir opts; do
      mountpoint -q "$dir" || { mkdir -p "$dir" && mount -t "$type" -o "$opts" "$type" "$dir"; } || exit 1
    done' _ "$mounts"
}

# Runs a Slurm command where the cluster is: here, or inside simulated host $1.
on_host() {
  local host=$1
  shift
  if [ -n "${sim_name:-}" ]; then "$sim" run "$sim_name" "$host" "$@"; else "$@"; fi
}

start() {
  local dir=$1 owner=${2:-}
  shift $(( $# >= 2 ? 2 : $# ))
  sim_name="" sim_hosts=1
  if [ "${1:-}" = --sim ]; then
    sim_name=${2:?--sim needs the name of the cluster}
    sim_hosts=${3:?--sim needs the number of hosts}
    "$sim" addr "$sim_name" $((sim_hosts - 1)) >/dev/null || die "no simulated host $((sim_hosts - 1)) in cluster '$sim_name'"
  fi
  local why
  why=$(check) || die "$why"
  mkdir -p "$dir/state" "$dir/spool"
  chmod 700 "$dir"
  dir=$(cd "$dir" && pwd)
  [ -n "$sim_name" ] && echo "$sim_name $sim_hosts" >"$dir/sim"
  # A watcher that cleans up when the owner goes, however it goes.
  if [ -n "$owner" ]; then
    ( trap '' INT TERM; while kill -0 "$owner" 2>/dev/null && [ -d "$dir" ]; do sleep 1; done; "$0" stop "$dir" ) \
      </dev/null >/dev/null 2>&1 &
  fi
  head -c 1024 /dev/urandom >"$dir/munge.key"
  chmod 400 "$dir/munge.key"
  /usr/sbin/munged --force --socket="$dir/munge.sock" --key-file="$dir/munge.key" --pid-file="$dir/munged.pid" \
    --log-file="$dir/munged.log" --seed-file="$dir/munged.seed" || die "munged did not start: $(tail -3 "$dir/munged.log" 2>/dev/null)"
  write_config "$dir"
  export SLURM_CONF=$dir/slurm.conf
  on_host 0 /usr/sbin/slurmctld -f "$SLURM_CONF" || die "slurmctld did not start: $(tail -3 "$dir/slurmctld.log" 2>/dev/null)"
  local i node
  for ((i = 0; i < sim_hosts; i++)); do
    node=()
    if [ -n "$sim_name" ]; then
      node=(-N "node$i")
      mount_cgroups "$i" || die "cannot mount the cgroup hierarchies inside simulated host $i"
    fi
    on_host "$i" /usr/sbin/slurmd -f "$SLURM_CONF" "${node[@]}" ||
      die "slurmd did not start on host $i: $(tail -3 "$dir"/slurmd-*.log 2>/dev/null)"
  done
  for _ in $(seq 300); do
    if [ "$(on_host 0 sinfo -h -o %T 2>/dev/null | grep -cE '^(idle|mixed|allocated)')" -ge 1 ] &&
       ! on_host 0 sinfo -h -N -o %T 2>/dev/null | grep -qvE '^(idle|mixed|allocated)'; then
      echo "SLURM_CONF=$SLURM_CONF"
      return 0
    fi
    sleep 0.1
  done
  die "the nodes did not become idle within 30 s: $(on_host 0 sinfo -h -N -o '%N %T %E' 2>&1 | head -4); slurmd logs: $(tail -3 "$dir"/slurmd-*.log 2>/dev/null)"
}

with() {
  [ "${1:-}" = -- ] || die "with: expected -- before the command"
  shift
  with_dir=$(mktemp -d /tmp/tinyddp-slurm.XXXXXX)
  trap 'stop "$with_dir"' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  start "$with_dir" $$ >/dev/null
  SLURM_CONF=$with_dir/slurm.conf "$@"
}

[ $# -ge 1 ] || die "usage: $0 check | start DIR [OWNER_PID] | stop DIR | with -- CMD..."
command=$1
shift
case $command in
  check) check ;;
  start) [ $# -ge 1 ] || die "start needs a directory"; start "$@" ;;
  stop) [ $# -eq 1 ] || die "stop needs the directory"; stop "$1" ;;
  with) with "$@" ;;
  *) die "unknown command '$command' (check, start, stop, with)" ;;
esac
