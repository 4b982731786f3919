#!/usr/bin/env bash
# bf16_wire.sh: the timings of bench/bf16_results.md: the f32 all-reduce beside the same gradients sent
# as bf16 (bench/bf16_wire.cpp --mode time), over loopback tcp and over simulated hosts whose links
# are shaped (scripts/sim_cluster.sh; needs root), each run REPEATS times.
#
#   bench/bf16_wire.sh [BUILD_DIR]      BUILD_DIR holds bin/bf16_wire and bin/tinyddp-run (default: build)
#   MIB=16 ROUNDS=10 REPEATS=3 RATE=1gbit LAYOUTS="2x1 2x2" bench/bf16_wire.sh build
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
sim="$root/scripts/sim_cluster.sh"
MIB=${MIB:-16}
ROUNDS=${ROUNDS:-10}
REPEATS=${REPEATS:-3}
RATE=${RATE:-1gbit}
LAYOUTS=${LAYOUTS:-"2x1 2x2"}
for program in bf16_wire tinyddp-run; do
  [ -x "$build/bin/$program" ] || { echo "bf16_wire.sh: $build/bin/$program is not built (cmake --build $build --target $program)" >&2; exit 2; }
done
args=(--mode time --mib "$MIB" --rounds "$ROUNDS")

echo "## loopback tcp, 2 ranks on this host"
for ((i = 1; i <= REPEATS; i++)); do
  "$build/bin/tinyddp-run" -n 2 "$build/bin/bf16_wire" "${args[@]}" --transport tcp 2>&1 | sed -n 's/^\[rank 0\] //p'
done

if ! why=$("$sim" check 2>&1); then
  echo "## simulated hosts: not run ($why)"
  exit 0
fi
name="bw$(( $$ % 100000 ))"
trap '"$sim" down "$name" >/dev/null 2>&1 || true' EXIT
"$sim" up "$name" 2 --rate "$RATE" >/dev/null
tmp=$(mktemp -d)
for layout in $LAYOUTS; do
  hosts=${layout%x*}; per_host=${layout#*x}
  echo "## simulated hosts: $hosts hosts x $per_host ranks, links shaped to $RATE (tcp across hosts, shm inside one)"
  for ((i = 1; i <= REPEATS; i++)); do
    pids=()
    for ((h = hosts - 1; h >= 0; h--)); do
      TINYDDP_TOKEN=bw timeout 600 "$sim" run "$name" "$h" "$build/bin/tinyddp-run" -n "$per_host" --nnodes "$hosts" \
        --node-rank "$h" --master-addr "$("$sim" addr "$name" 0)" --master-port 29500 \
        "$build/bin/bf16_wire" "${args[@]}" --transport auto >"$tmp/host$h.txt" 2>&1 &
      pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid" || { cat "$tmp"/host*.txt >&2; exit 1; }; done
    sed -n 's/^\[rank 0\] //p' "$tmp/host0.txt"
  done
done
rm -rf "$tmp"
