#!/usr/bin/env bash
# sim_cluster.sh: several hosts on this one machine, for tests and benchmarks that cross a network.
#
# Each simulated host is as separate as Linux lets one machine be: its own network namespace (one
# interface, eth0, on a shared bridge), hostname (UTS namespace), mount namespace with a private
# tmpfs on /dev/shm, and pid namespace. Sharing any of these hides bugs: ranks that share /dev/shm
# or a pid space look like one host to shared memory; a shared hostname makes two hosts one.
#
#   scripts/sim_cluster.sh up NAME K [--rate RATE]   make hosts NAME-0 .. NAME-(K-1)
#   scripts/sim_cluster.sh run NAME I CMD [ARGS...]  run CMD on host I (stdin/stdout/exit status pass through)
#   scripts/sim_cluster.sh addr NAME I               host I's address (10.N.0.(I+1))
#   scripts/sim_cluster.sh rate NAME RATE|none        shape (or unshape) every host's link
#   scripts/sim_cluster.sh down NAME                  remove the hosts and everything they run
#   scripts/sim_cluster.sh with K [--rate RATE] -- CMD [ARGS...]
#       make a cluster, run CMD here with SIM_CLUSTER=NAME and SIM_HOSTS=K in its environment, and
#       remove the cluster afterwards, also when CMD fails or this script is interrupted or killed
#       (a watcher process removes it if this script dies without its EXIT trap).
#
# RATE is tc's syntax (1gbit, 5gbit, 200mbit): every host's egress gets a token bucket (tbf) of that
# rate, so every flow between two hosts is limited once, where it leaves. This kernel has no netem,
# so no delay can be added: the veth latency is what there is.
#
# Needs root (namespaces, veth, a bridge); tests call `sim_cluster.sh check` first and skip with its
# message otherwise. Addresses are 10.N.0.0/24 with N from the cluster's name, inside the namespaces
# only: nothing outside them changes.
set -euo pipefail

STATE_ROOT=${SIM_CLUSTER_STATE:-/run/tinyddp-sim}

die() { echo "sim_cluster.sh: $*" >&2; exit 2; }

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//'; exit 2; }

check() {
  [ "$(id -u)" -eq 0 ] || { echo "needs root (network, mount, pid and UTS namespaces)"; return 1; }
  for tool in ip unshare nsenter tc; do
    command -v "$tool" >/dev/null || { echo "needs '$tool' (Debian: iproute2, util-linux)"; return 1; }
  done
  local probe="tdsim-probe-$$"
  ip netns add "$probe" 2>/dev/null || { echo "cannot create a network namespace here (ip netns add failed)"; return 1; }
  ip netns del "$probe"
  unshare --pid --fork --mount --uts true 2>/dev/null || { echo "cannot create pid/mount/UTS namespaces here (unshare failed)"; return 1; }
}

# The cluster's subnet number, 16..250, from its name (distinct names rarely collide; `up` refuses
# a subnet another live cluster uses).
subnet_of() { echo $(( 16 + $(printf '%s' "$1" | cksum | cut -d' ' -f1) % 235 )); }

state_dir() { echo "$STATE_ROOT/$1"; }
host_ns() { echo "tdsim-$1-$2"; }
bridge_ns() { echo "tdsim-$1-sw"; }

host_pid() {
  local file
  file="$(state_dir "$1")/host$2.pid"
  [ -f "$file" ] || die "cluster '$1' has no host $2 (hosts: $(ls "$(state_dir "$1")" 2>/dev/null | sed -n 's/^host\([0-9]*\)\.pid$/\1/p' | sort -n | tr '\n' ' '))"
  cat "$file"
}

set_rate() {
  local name=$1 rate=$2 i ns
  for pidfile in "$(state_dir "$name")"/host*.pid; do
    i=${pidfile##*/host}; i=${i%.pid}
    ns=$(host_ns "$name" "$i")
    ip -n "$ns" link set eth0 up
    tc -n "$ns" qdisc del dev eth0 root 2>/dev/null || true
    if [ "$rate" != none ]; then
      # burst: enough for the rate at a 1 ms timer tick (and at least 64 KiB), so the bucket, not the
      # timer, sets the rate.
      tc -n "$ns" qdisc add dev eth0 root tbf rate "$rate" burst 1mb latency 100ms
    fi
  done
  echo "$rate" >"$(state_dir "$name")/rate"
}

up() {
  local name=$1 count=$2 rate=none
  shift 2
  while [ $# -gt 0 ]; do
    case $1 in
      --rate) rate=${2:?--rate needs a value (e.g. 1gbit)}; shift 2 ;;
      *) die "up: unknown option '$1'" ;;
    esac
  done
  [[ $name =~ ^[a-z0-9]{1,8}$ ]] || die "cluster name '$name' must be 1-8 lowercase letters or digits (it names interfaces)"
  [[ $count =~ ^[0-9]+$ ]] && [ "$count" -ge 1 ] && [ "$count" -le 64 ] || die "host count '$count' must be 1..64"
  local why
  why=$(check) || die "$why"
  [ -d "$(state_dir "$name")" ] && down "$name" 2>/dev/null
  local subnet
  subnet=$(subnet_of "$name")
  for other in "$STATE_ROOT"/*/subnet; do
    [ -f "$other" ] && [ "$(cat "$other")" = "$subnet" ] && die "subnet 10.$subnet.0.0/24 is taken by cluster '$(basename "$(dirname "$other")")'; pick another name"
  done
  mkdir -p "$(state_dir "$name")"
  echo "$subnet" >"$(state_dir "$name")/subnet"
  echo "$count" >"$(state_dir "$name")/hosts"

  local sw
  sw=$(bridge_ns "$name")
  ip netns add "$sw"
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  for ((i = 0; i < count; i++)); do
    local ns
    ns=$(host_ns "$name" "$i")
    ip netns add "$ns"
    ip link add "td$name$i" type veth peer name eth0 netns "$ns"
    ip link set "td$name$i" netns "$sw"
    ip -n "$sw" link set "td$name$i" master br0 up
    ip -n "$ns" addr add "10.$subnet.0.$((i + 1))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    # The host's own hostname, /dev/shm and pid space live as long as its first process: a
    # pid-namespace init that sleeps. `run` enters all of its namespaces.
    local ready
    ready="$(state_dir "$name")/host$i.ready"
    ip netns exec "$ns" unshare --uts --mount --pid --fork --mount-proc --propagation private \
      bash -c 'hostname "$1"; mount -t tmpfs -o size=4g,mode=1777 tmpfs /dev/shm; echo $$ >"$2"; exec sleep infinity' \
      _ "$name-$i" "$ready" </dev/null >/dev/null 2>&1 &
    local unshare_pid=$!
    for _ in $(seq 200); do [ -s "$ready" ] && break; sleep 0.01; done
    [ -s "$ready" ] || die "host $i did not start"
    # The init's pid as this machine sees it: unshare's only child.
    local init
    init=$(cat "/proc/$unshare_pid/task/$unshare_pid/children" 2>/dev/null | awk '{print $1}')
    [ -n "$init" ] || die "host $i: cannot find its init process"
    echo "$init" >"$(state_dir "$name")/host$i.pid"
    echo "$unshare_pid" >"$(state_dir "$name")/host$i.unshare"
  done
  set_rate "$name" "$rate"
}

down() {
  local name=$1 dir
  dir=$(state_dir "$name")
  if [ -d "$dir" ]; then
    for pidfile in "$dir"/host*.pid "$dir"/host*.unshare; do
      # Killing a pid namespace's init kills everything in it.
      [ -f "$pidfile" ] && kill -KILL "$(cat "$pidfile")" 2>/dev/null || true
    done
  fi
  for ns in $(ip netns list | awk '{print $1}' | grep "^tdsim-$name-" || true); do
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "$dir"
}

run() {
  local name=$1 i=$2
  shift 2
  [ $# -gt 0 ] || die "run: no command given"
  local pid
  pid=$(host_pid "$name" "$i")
  exec nsenter --target "$pid" --net --uts --mount --pid --wd="$PWD" -- "$@"
}

with() {
  local count=$1 rate_args=()
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    case $1 in
      --rate) rate_args=(--rate "${2:?--rate needs a value}"); shift 2 ;;
      *) die "with: unknown option '$1'" ;;
    esac
  done
  [ "${1:-}" = -- ] || die "with: expected -- before the command"
  shift
  local name="w$(( $$ % 100000 ))"
  up "$name" "$count" "${rate_args[@]}"
  # A watcher removes the cluster if this script dies without running its trap (SIGKILL).
  ( trap '' INT TERM; while kill -0 $$ 2>/dev/null; do sleep 1; done; "$0" down "$name" ) </dev/null >/dev/null 2>&1 &
  # The name is written into the trap now: the trap runs after this function returns, when its locals are gone.
  trap "down $name" EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  SIM_CLUSTER=$name SIM_HOSTS=$count "$@"
}

[ $# -ge 1 ] || usage
command=$1
shift
case $command in
  check) check ;;
  up) [ $# -ge 2 ] || usage; up "$@" ;;
  down) [ $# -eq 1 ] || usage; down "$1" ;;
  run) [ $# -ge 3 ] || usage; run "$@" ;;
  addr) [ $# -eq 2 ] || usage; host_pid "$1" "$2" >/dev/null; echo "10.$(cat "$(state_dir "$1")/subnet").0.$(($2 + 1))" ;;
  rate) [ $# -eq 2 ] || usage; [ -d "$(state_dir "$1")" ] || die "no cluster '$1'"; set_rate "$1" "$2" ;;
  with) [ $# -ge 3 ] || usage; with "$@" ;;
  -h|--help|help) usage ;;
  *) die "unknown command '$command' (up, run, addr, rate, down, with, check)" ;;
esac
