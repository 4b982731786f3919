#!/usr/bin/env bash
# cluster_startup_soak.sh: does a multi-host job start every time? N startups per layout and
# transport on simulated hosts (scripts/sim_cluster.sh), each the way a user starts one on a real
# cluster: `tinyddp-run -n R --nnodes H --node-rank i --master-addr <host 0> --master-port P` on every
# host at once, running all_reduce_perf for one small checked all-reduce. Prints N_ok/N per case and
# the startup times; the suite runs each case once (test/cluster), this runs them many times.
#
#   test/soak/cluster_startup_soak.sh [BUILD_DIR] [RUNS]          (defaults: build, 20)
#   LAYOUTS="2x2 3x1" TRANSPORTS="auto tcp" test/soak/cluster_startup_soak.sh build 20
#
# A run fails when any node's launcher exits non-zero, when it takes longer than TIMEOUT seconds
# (default 60; the store's own timeouts are minutes), or when the all-reduce's results are wrong; the
# first lines of each failure's output are kept in $OUT (default /tmp/cluster_startup_soak).
# Needs root (namespaces).
set -euo pipefail

build=${1:-build}
runs=${2:-20}
layouts=${LAYOUTS:-"2x2 3x1"}
transports=${TRANSPORTS:-"auto tcp"}
timeout_s=${TIMEOUT:-60}
out=${OUT:-/tmp/cluster_startup_soak}
here=$(cd "$(dirname "$0")/../.." && pwd)
sim=$here/scripts/sim_cluster.sh
bin=$(cd "$build" && pwd)/bin
[ -x "$bin/tinyddp-run" ] && [ -x "$bin/all_reduce_perf" ] || { echo "build $build first (tinyddp-run, all_reduce_perf)"; exit 2; }
why=$("$sim" check) || { echo "cluster_startup_soak: $why"; exit 2; }
mkdir -p "$out"

# One job across the cluster's hosts; prints its wall time in ms, or fails.
one_job() {
  local name=$1 hosts=$2 per_host=$3 transport=$4 log=$5
  local master pids=() start end status=0
  master=$("$sim" addr "$name" 0)
  start=$(date +%s%N)
  for ((i = hosts - 1; i >= 0; i--)); do
    TINYDDP_TOKEN=soak timeout "$timeout_s" "$sim" run "$name" "$i" "$bin/tinyddp-run" -n "$per_host" \
      --nnodes "$hosts" --node-rank "$i" --master-addr "$master" --master-port 29500 \
      "$bin/all_reduce_perf" -b 1M -e 1M -n 1 -w 0 --transport "$transport" >"$log.node$i" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  end=$(date +%s%N)
  grep -q "Out of bounds values : 0 OK" "$log.node0" || status=1
  echo $(((end - start) / 1000000))
  return $status
}

printf "%-16s %-9s %8s %10s %10s %10s\n" layout transport started "median ms" "max ms" "failures"
for layout in $layouts; do
  hosts=${layout%x*}
  per_host=${layout#*x}
  name="soak$$"
  name=${name:0:8}
  "$sim" up "$name" "$hosts" >/dev/null
  trap '"$sim" down "$name" >/dev/null 2>&1' EXIT
  for transport in $transports; do
    ok=0 times=() failures=""
    for ((run = 1; run <= runs; run++)); do
      log="$out/$layout-$transport-$run"
      if ms=$(one_job "$name" "$hosts" "$per_host" "$transport" "$log"); then
        ok=$((ok + 1))
        times+=("$ms")
        rm -f "$log".node*
      else
        failures+=" $run"
        for f in "$log".node*; do head -c 4000 "$f" >"$f.head" && mv "$f.head" "$f"; done
      fi
    done
    sorted=$(printf "%s\n" "${times[@]:-0}" | sort -n)
    median=$(echo "$sorted" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    max=$(echo "$sorted" | tail -1)
    printf "%-16s %-9s %5d/%-2d %10s %10s %10s\n" "$hosts hosts x $per_host" "$transport" "$ok" "$runs" "$median" "$max" \
      "${failures:- none}"
  done
  "$sim" down "$name" >/dev/null
  trap - EXIT
done
echo "(failed runs' output, if any: $out)"
