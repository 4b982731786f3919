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
#
# Nothing outside DIR is touched: its own munge key and socket, its own ports (free ones, picked at
# start), state, spool and logs under DIR; clients find it through SLURM_CONF. The node is this host,
# reached at 127.0.0.1, with 8 CPUs declared whatever the hardware (config_overrides), so a test can
# start more tasks than there are cores. Needs root (slurmd starts jobs as their users) and Debian's
# slurmctld, slurmd, slurm-client and munge.
set -euo pipefail

die() { echo "slurm_localhost.sh: $*" >&2; exit 2; }

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

write_config() {
  local dir=$1 host
  host=$(hostname)
  cat >"$dir/slurm.conf" <<EOF
ClusterName=tinyddp
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge.sock
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
NodeName=$host NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
}

stop() {
  local dir=$1
  [ -d "$dir" ] || return 0
  for pidfile in "$dir"/slurmd.pid "$dir"/slurmctld.pid "$dir"/munged.pid; do
    [ -f "$pidfile" ] && kill -TERM "$(cat "$pidfile" 2>/dev/null)" 2>/dev/null || true
  done
  for _ in $(seq 50); do
    local alive=0
    for pidfile in "$dir"/slurmd.pid "$dir"/slurmctld.pid "$dir"/munged.pid; do
      [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile" 2>/dev/null)" 2>/dev/null && alive=1
    done
    [ $alive -eq 0 ] && break
    sleep 0.1
  done
  for pidfile in "$dir"/slurmd.pid "$dir"/slurmctld.pid "$dir"/munged.pid; do
    [ -f "$pidfile" ] && kill -KILL "$(cat "$pidfile" 2>/dev/null)" 2>/dev/null || true
  done
  rm -rf "$dir"
}

start() {
  local dir=$1 owner=${2:-}
  local why
  why=$(check) || die "$why"
  mkdir -p "$dir/state" "$dir/spool"
  chmod 700 "$dir"
  dir=$(cd "$dir" && pwd)
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
  /usr/sbin/slurmctld -f "$SLURM_CONF" || die "slurmctld did not start: $(tail -3 "$dir/slurmctld.log" 2>/dev/null)"
  /usr/sbin/slurmd -f "$SLURM_CONF" || die "slurmd did not start: $(tail -3 "$dir/slurmd.log" 2>/dev/null)"
  for _ in $(seq 300); do
    if sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
      echo "SLURM_CONF=$SLURM_CONF"
      return 0
    fi
    sleep 0.1
  done
  die "the node did not become idle within 30 s: $(sinfo -h -o '%T %E' 2>&1 | head -2); slurmd log: $(tail -3 "$dir/slurmd.log" 2>/dev/null)"
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
