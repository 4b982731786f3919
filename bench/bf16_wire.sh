#!/usr/bin/env bash
# bf16_wire.sh: the timings of docs/results.md's "bf16 on the wire", over loopback tcp and over simulated hosts whose
# links are shaped (scripts/sim_cluster.sh; needs root), each run REPEATS times. MODES picks what runs:
#   time   the f32 all-reduce beside the same gradients sent as bf16 (bench/bf16_wire.cpp --mode time);
#   hooks  DDP's built-in comm hooks on one bucket (bf16_wire --mode hooks), each run followed by
#          PyTorch's hooks on the same bucket size over gloo (bench/peers/torch_comm_hook.py), where
#          /usr/bin/python3 (or TORCH_PYTHON, or python3) imports torch; skipped, saying so, otherwise.
#
#   bench/bf16_wire.sh [BUILD_DIR]      BUILD_DIR holds bin/bf16_wire and bin/tinyddp-run (default: build)
#   MIB=16 ROUNDS=10 REPEATS=3 RATE=1gbit LAYOUTS="2x1 2x2" MODES="time hooks" bench/bf16_wire.sh build
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
MODES=${MODES:-"time hooks"}
tmp_out=$(mktemp)
trap 'rm -f "$tmp_out"' EXIT
for program in bf16_wire tinyddp-run; do
  [ -x "$build/bin/$program" ] || { echo "bf16_wire.sh: $build/bin/$program is not built (cmake --build $build --target $program)" >&2; exit 2; }
done
torch_python=""
for candidate in ${TORCH_PYTHON:-} /usr/bin/python3 python3; do
  if "$candidate" -c 'import torch.distributed.algorithms.ddp_comm_hooks' 2>/dev/null; then torch_python=$candidate; break; fi
done
torch_args=("$here/peers/torch_comm_hook.py" "$MIB" "$ROUNDS")

# torch_ranks WORLD FIRST COUNT ADDR [RUN...]: ranks FIRST..FIRST+COUNT-1 of PyTorch's side, in the
# background (through RUN, a command prefix such as a simulated host's `sim_cluster.sh run`); their
# process ids are added to torch_pids.
torch_pids=()
torch_ranks() {
  local world=$1 first=$2 count=$3 addr=$4
  shift 4
  for ((r = first; r < first + count; r++)); do
    RANK=$r WORLD_SIZE=$world MASTER_ADDR=$addr MASTER_PORT=29511 timeout 600 "$@" "$torch_python" "${torch_args[@]}" &
    torch_pids+=($!)
  done
}
# Waits for torch_ranks' processes; fails when one did.
wait_torch() {
  local pid status=0
  for pid in "${torch_pids[@]}"; do wait "$pid" || status=1; done
  torch_pids=()
  return $status
}

for mode in $MODES; do
  echo "## loopback tcp, 2 ranks on this host, --mode $mode (load: $(uptime | sed 's/.*load/load/'))"
  for ((i = 1; i <= REPEATS; i++)); do
    "$build/bin/tinyddp-run" -n 2 "$build/bin/bf16_wire" --mode "$mode" --mib "$MIB" --rounds "$ROUNDS" --transport tcp 2>&1 |
      sed -n 's/^\[rank 0\] //p'
    [ "$mode" = hooks ] || continue
    if [ -z "$torch_python" ]; then echo "PyTorch's hooks: skipped, no python3 here imports torch"; continue; fi
    torch_ranks 2 0 2 127.0.0.1 >"$tmp_out" 2>&1
    wait_torch || { cat "$tmp_out" >&2; exit 1; }
    grep -v '^\[W' "$tmp_out" || true
  done
done

if ! why=$("$sim" check 2>&1); then
  echo "## simulated hosts: not run ($why)"
  exit 0
fi
name="bw$(( $$ % 100000 ))"
trap '"$sim" down "$name" >/dev/null 2>&1 || true; rm -f "$tmp_out"' EXIT
"$sim" up "$name" 2 --rate "$RATE" >/dev/null
tmp=$(mktemp -d)
for mode in $MODES; do
  for layout in $LAYOUTS; do
    hosts=${layout%x*}; per_host=${layout#*x}
    echo "## simulated hosts: $hosts hosts x $per_host ranks, links shaped to $RATE (tcp across hosts, shm inside one)," \
         "--mode $mode (load: $(uptime | sed 's/.*load/load/'))"
    for ((i = 1; i <= REPEATS; i++)); do
      pids=()
      for ((h = hosts - 1; h >= 0; h--)); do
        TINYDDP_TOKEN=bw timeout 600 "$sim" run "$name" "$h" "$build/bin/tinyddp-run" -n "$per_host" --nnodes "$hosts" \
          --node-rank "$h" --master-addr "$("$sim" addr "$name" 0)" --master-port 29500 \
          "$build/bin/bf16_wire" --mode "$mode" --mib "$MIB" --rounds "$ROUNDS" --transport auto >"$tmp/host$h.txt" 2>&1 &
        pids+=($!)
      done
      for pid in "${pids[@]}"; do wait "$pid" || { cat "$tmp"/host*.txt >&2; exit 1; }; done
      sed -n 's/^\[rank 0\] //p' "$tmp/host0.txt"
      [ "$mode" = hooks ] && [ -n "$torch_python" ] || continue
      # PyTorch's gloo: tcp between every pair of ranks, inside a host too, on the host's one interface.
      for ((h = hosts - 1; h >= 0; h--)); do
        torch_ranks $((hosts * per_host)) $((h * per_host)) "$per_host" "$("$sim" addr "$name" 0)" \
          "$sim" run "$name" "$h" env GLOO_SOCKET_IFNAME=eth0 >"$tmp/torch$h.txt" 2>&1
      done
      wait_torch || { cat "$tmp"/torch*.txt >&2; exit 1; }
      grep -v '^\[W' "$tmp/torch0.txt" || true
    done
  done
done
rm -rf "$tmp"
