#!/usr/bin/env bash
# cluster_train.sh: data-parallel training across simulated hosts (scripts/sim_cluster.sh):
# train_bench's data-parallel part on H hosts x L ranks (tinyddp-run --nnodes H on each host, as on a
# real cluster) beside PyTorch DDP with gloo (bench/peers/torch_train_rank.py, one process per rank) on the
# same layout, link and job, rounds alternating; then one traced run of ours, whose last full step
# scripts/trace_to_svg.py draws and summarises (how much of the all-reduce the backward pass hid).
#
#   bench/cluster_train.sh [BUILD_DIR]                      (root: namespaces and tc)
#   LAYOUT=2x2 PROFILE=1gbit ROUNDS=3 JOB="784 1024 10 16384 256 2" bench/cluster_train.sh build
#
# JOB: IN HIDDEN OUT SAMPLES BATCH-PER-RANK EPOCHS (train_bench's defaults). Writes the raw lines to
# OUT/train-<layout>-<profile>.txt and the traced step to OUT/train-<layout>-<profile>.svg (OUT defaults
# to BUILD_DIR/bench-cluster; the published run's are in docs/results/cluster/).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
sim="$root/scripts/sim_cluster.sh"
LAYOUT=${LAYOUT:-2x2}
PROFILE=${PROFILE:-1gbit}
ROUNDS=${ROUNDS:-3}
JOB=${JOB:-"784 1024 10 16384 256 2"}
read -r in hidden classes samples batch epochs <<<"$JOB"
hosts=${LAYOUT%x*}; per_host=${LAYOUT#*x}; world=$((hosts * per_host))
for program in train_bench tinyddp-run; do
  [ -x "$build/bin/$program" ] || { echo "cluster_train.sh: $build/bin/$program is not built (cmake --build $build --target $program)" >&2; exit 2; }
done
/usr/bin/python3 -c 'import torch.distributed' 2>/dev/null ||
  { echo "cluster_train.sh: /usr/bin/python3 does not import torch; hint: scripts/deps.sh --bench installs python3-torch" >&2; exit 2; }
out=${OUT:-$build/bench-cluster}; mkdir -p "$out"
file="$out/train-$LAYOUT-$PROFILE.txt"
tmp=$(mktemp -d)
name="ct$(( $$ % 100000 ))"
trap '"$sim" down "$name" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
"$sim" up "$name" "$hosts" >/dev/null
"$sim" rate "$name" "$PROFILE"
master=$("$sim" addr "$name" 0)

# ours [ENV...]: train_bench's data-parallel part on every host; node 0's report line on stdout.
ours() {
  local pids=() i
  for ((i = hosts - 1; i >= 0; i--)); do
    timeout 600 "$sim" run "$name" "$i" env TINYDDP_TOKEN=ct "$@" \
      "$build/bin/tinyddp-run" -n "$per_host" --nnodes "$hosts" --node-rank "$i" --master-addr "$master" --master-port 29500 \
      "$build/bin/train_bench" --world-size "$world" --in "$in" --hidden "$hidden" --out "$classes" --samples "$samples" \
      --batch-size "$batch" --epochs "$epochs" >"$tmp/ours$i.txt" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || { cat "$tmp"/ours*.txt >&2; return 1; }; done
  grep -hE 'data-parallel|time in collectives|cost model' "$tmp/ours0.txt" | sed 's/^\[rank 0\] //'
}

# torch: PyTorch DDP, one process per rank on its host.
torch_ddp() {
  local pids=() r
  for ((r = world - 1; r >= 0; r--)); do
    RANK=$r WORLD_SIZE=$world MASTER_ADDR=$master MASTER_PORT=29511 GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 timeout 600 \
      "$sim" run "$name" $((r / per_host)) /usr/bin/python3 "$here/peers/torch_train_rank.py" "$in" "$hidden" "$classes" "$samples" \
      "$batch" "$epochs" >"$tmp/torch$r.txt" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || { cat "$tmp"/torch*.txt >&2; return 1; }; done
  grep -h 'samples/s' "$tmp/torch0.txt"
}

{
  echo "# $LAYOUT, link $PROFILE, job $JOB, $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
  for ((round = 1; round <= ROUNDS; round++)); do
    echo "## round $round"
    ours TINYDDP_DEBUG=INFO TINYDDP_COST_MODEL=probe
    torch_ddp
  done
} | tee "$file"

# One traced run: the timeline of every rank, merged by rank 0 (the hosts share /tmp).
ours TINYDDP_TRACE="$tmp/trace.json" TINYDDP_COST_MODEL=probe >/dev/null
python3 "$root/scripts/trace_to_svg.py" "$tmp/trace.json" -o "$out/train-$LAYOUT-$PROFILE.svg" --step 4 | tee -a "$file"
