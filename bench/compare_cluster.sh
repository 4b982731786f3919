#!/usr/bin/env bash
# compare_cluster.sh: all-reduce across simulated hosts (scripts/sim_cluster.sh), ours per algorithm
# beside the peers of bench/peers/: Gloo (gloo_all_reduce), PyTorch's gloo (torch_all_reduce.py) and
# Open MPI over its TCP transport (mpi_all_reduce, started on the hosts by bench/cluster_mpi_agent.sh),
# in the same run, on shaped links; then the bytes that cross hosts, read from the interfaces'
# counters, against the cost model's count; and the model's predictions beside the measured times.
#
#   bench/compare_cluster.sh [BUILD_DIR]          (root: namespaces and tc)
#   LAYOUTS="4x1 2x2" PROFILES="1gbit 5gbit none" PHASES="times bytes" MAX=16M ROUNDS=1 \
#     bench/compare_cluster.sh build
#   MIN=1K MAX=64K ALGOS="ring rd auto" PEERS="gloo" OUT=/tmp/small bench/compare_cluster.sh build
#     (PEERS: any of gloo torch mpi)
#
# Layout HxL: H hosts of L ranks each (rank r on host r / L), launched as on a real cluster:
# tinyddp-run --nnodes H --node-rank i on each host; Gloo and PyTorch one process per rank.
# Profiles: tc tbf rate on every host's egress (sim_cluster.sh rate); "none": unshaped veth.
# Writes OUT/<layout>-<profile>.txt (the raw tables; OUT defaults to BUILD_DIR/bench-cluster),
# <layout>-<profile>-model.txt (the model auto measured at startup), <layout>-<profile>.svg (busbw
# against size, every line; bench/plot_cluster.gp) and prints a summary (bench/cluster_summary.py).
# The published run's files are in docs/results/cluster/, its summary in docs/results.md.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
sim="$root/scripts/sim_cluster.sh"
LAYOUTS=${LAYOUTS:-"4x1 2x2"}
PROFILES=${PROFILES:-"1gbit 5gbit none"}
MAX=${MAX:-16M}
ROUNDS=${ROUNDS:-1}
ITERS=${ITERS:-20}
PHASES=${PHASES:-"times bytes"}
MIN=${MIN:-1K}
PEERS=${PEERS-"gloo torch mpi"}  # empty: ours only
out=${OUT:-$build/bench-cluster}
mkdir -p "$out"
tmp=$(mktemp -d)
name="cc$(( $$ % 100000 ))"
trap '"$sim" down "$name" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT

for program in all_reduce_perf tinyddp-run collective_model; do
  [ -x "$build/bin/$program" ] || { echo "compare_cluster.sh: $build/bin/$program is not built (cmake --build $build --target $program)" >&2; exit 2; }
done
max_bytes=$(numfmt --from=iec "$MAX")
min_bytes=$(numfmt --from=iec "$MIN")
# The peers asked for must be there: scripts/deps.sh --bench installs them, the build makes their programs.
for peer in $PEERS; do
  case $peer in
    gloo|mpi) program=$build/bin/${peer}_all_reduce
      [ -x "$program" ] || { echo "compare_cluster.sh: PEERS names $peer but $program is not built; hint:" \
        "scripts/deps.sh --bench, then cmake --build $build (or leave $peer out of PEERS)" >&2; exit 2; } ;;
    torch) /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null || { echo "compare_cluster.sh: PEERS names torch" \
        "but /usr/bin/python3 does not import torch; hint: scripts/deps.sh --bench (or leave torch out of PEERS)" >&2; exit 2; } ;;
    *) echo "compare_cluster.sh: unknown peer '$peer' in PEERS; hint: gloo, torch, mpi" >&2; exit 2 ;;
  esac
done

# The model `auto` chooses with: measured when the ranks start (TINYDDP_COST_MODEL=probe: the link
# probe, comm/algorithms/link_probe.h); rank 0 logs it (TINYDDP_DEBUG=INFO) and ours() keeps it in
# $out/<layout>-<profile>-model.txt, which the summary's predictions use. MODEL=builtin or a file
# runs auto with that instead.
MODEL=${MODEL:-probe}

# ours ALGO: all_reduce_perf on every host through tinyddp-run; node 0's report on stdout.
ours() {
  local algo=$1 model=$2 hosts=$3 per_host=$4 min=${5:-$MIN} max=${6:-$MAX} iters=${7:-$ITERS} pids=() i
  for ((i = hosts - 1; i >= 0; i--)); do
    TINYDDP_TOKEN=cc TINYDDP_COST_MODEL=$model TINYDDP_DEBUG=INFO timeout 600 "$sim" run "$name" "$i" \
      "$build/bin/tinyddp-run" -n "$per_host" --nnodes "$hosts" --node-rank "$i" --master-addr "$("$sim" addr "$name" 0)" \
      --master-port 29500 "$build/bin/all_reduce_perf" -b "$min" -e "$max" -f 4 -n "$iters" -w 2 --algo "$algo" \
      >"$tmp/ours$i.txt" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || { cat "$tmp"/ours*.txt >&2; return 1; }; done
  # The measured model, as cost_model.h's "key value" lines.
  grep -o 'cost model measured in .*' "$tmp/ours0.txt" | sed 's/^.* ms: //' | xargs -n 2 >"$tmp/model.txt" || true
  cat "$tmp/ours0.txt"
}

# Runs the command once per rank, on rank r's host (r / L), RANK, WORLD_SIZE and HOST_ADDR (the
# host's address) in its environment, the last rank first; rank 0's output on stdout.
per_rank() {
  local tag=$1 hosts=$2 per_host=$3 world=$(( $2 * $3 )) pids=() r
  shift 3
  for ((r = world - 1; r >= 0; r--)); do
    RANK=$r WORLD_SIZE=$world HOST_ADDR=$("$sim" addr "$name" $((r / per_host))) timeout 600 \
      "$sim" run "$name" $((r / per_host)) "$@" >"$tmp/$tag$r.txt" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || { cat "$tmp/$tag"*.txt >&2; return 1; }; done
  cat "$tmp/${tag}0.txt"
}

# gloo: bench/peers/gloo_all_reduce, each rank bound to its host's address; a file store in /tmp (the
# simulated hosts share the file system, not /dev/shm).
gloo() {
  rm -rf "$tmp/gstore"; mkdir -p "$tmp/gstore"
  per_rank gloo "$1" "$2" bash -c 'exec "$0" --address "$HOST_ADDR" "$@"' "$build/bin/gloo_all_reduce" \
    --store "$tmp/gstore" --min-bytes "$min_bytes" --max-bytes "$max_bytes" --iters "$ITERS"
}

# torch: PyTorch gloo (bench/peers/torch_all_reduce.py, one rank a process), torchrun's environment variables.
torch_gloo() {
  MASTER_ADDR=$("$sim" addr "$name" 0) MASTER_PORT=29511 GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 \
    per_rank torch "$1" "$2" /usr/bin/python3 "$here/peers/torch_all_reduce.py" --min-bytes "$min_bytes" \
    --max-bytes "$max_bytes" --iters "$ITERS"
}

# mpi: bench/peers/mpi_all_reduce, L ranks on each host, over TCP only (btl tcp,self: ranks of one host
# talk over loopback TCP). mpirun runs in host 0's network namespace (but this machine's pid,
# mount and UTS ones: the agent's nsenter must see the other hosts' pids) and starts its daemons on
# the other hosts through bench/cluster_mpi_agent.sh, as it would through ssh.
mpi() {
  local hosts=$1 per_host=$2 list="" i
  for ((i = 0; i < hosts; i++)); do list+="$("$sim" addr "$name" "$i"):$per_host,"; done
  SIM_CLUSTER=$name timeout 900 ip netns exec "tdsim-$name-0" mpirun --allow-run-as-root --oversubscribe \
    --mca plm_rsh_agent "$here/cluster_mpi_agent.sh" --mca btl tcp,self --mca btl_tcp_if_include eth0 \
    --mca oob_tcp_if_include eth0 --host "${list%,}" -np $((hosts * per_host)) "$build/bin/mpi_all_reduce" \
    -b "$min_bytes" -e "$max_bytes" -f 4 -n "$ITERS"
}

# Bytes every host's eth0 sent: "bytes packets" summed over the hosts.
tx_counters() {
  local hosts=$1 i bytes=0 packets=0 b p
  for ((i = 0; i < hosts; i++)); do
    read -r b p < <(ip -n "tdsim-$name-$i" -s -j link show eth0 | python3 -c \
      'import json,sys; s=json.load(sys.stdin)[0]["stats64"]["tx"]; print(s["bytes"], s["packets"])')
    bytes=$((bytes + b)); packets=$((packets + p))
  done
  echo "$bytes $packets"
}

algorithms_for() {
  if [ "$2" -gt 1 ]; then echo "ring rd rabenseifner direct hier auto"; else echo "ring rd rabenseifner direct auto"; fi
}

for layout in $LAYOUTS; do
  hosts=${layout%x*}; per_host=${layout#*x}
  "$sim" up "$name" "$hosts" >/dev/null
  for profile in $PROFILES; do
    [[ " $PHASES " == *" times "* ]] || break
    "$sim" rate "$name" "$profile"
    file="$out/$layout-$profile.txt"
    : >"$file"
    : >"$out/$layout-$profile-model.txt"
    for ((round = 1; round <= ROUNDS; round++)); do
      for algo in ${ALGOS:-$(algorithms_for "$hosts" "$per_host")}; do
        echo "## ours $algo round $round" >>"$file"
        ours "$algo" "$MODEL" "$hosts" "$per_host" | sed 's/^\[rank 0\] //' | grep -E '^ *[0-9]+ +[0-9]+ +float|Avg bus' >>"$file"
        if [ "$algo" = auto ] && [ -s "$tmp/model.txt" ]; then
          { echo "# measured by the link probe, round $round"; cat "$tmp/model.txt"; } >>"$out/$layout-$profile-model.txt"
        fi
      done
      for peer in $PEERS; do
        echo "## $peer round $round" >>"$file"
        case $peer in
          gloo) gloo "$hosts" "$per_host" ;;
          torch) torch_gloo "$hosts" "$per_host" ;;
          mpi) mpi "$hosts" "$per_host" ;;
          *) echo "compare_cluster.sh: unknown peer '$peer' in PEERS; hint: gloo, torch, mpi" >&2; exit 2 ;;
        esac | grep -E '^ *[0-9]' >>"$file"
      done
    done
    echo "$layout $profile: $file"
  done
  # Bytes across hosts per all-reduce of 4 MiB: the counters' growth between a run of 2 and one of
  # 12 iterations, divided by 20 (each iteration is two all-reduces, out of place and in place, as
  # in nccl-tests), so that setup and the perf program's own checks cancel out.
  if [[ " $PHASES " != *" bytes "* ]]; then "$sim" down "$name"; continue; fi
  "$sim" rate "$name" none
  file="$out/$layout-bytes.txt"
  echo "# algo measured_payload_bytes measured_wire_bytes model_bytes (per 4 MiB all-reduce, all hosts' eth0 tx)" >"$file"
  for algo in $(algorithms_for "$hosts" "$per_host"); do
    [ "$algo" = auto ] && continue
    read -r b0 p0 < <(tx_counters "$hosts"); ours "$algo" builtin "$hosts" "$per_host" 4M 4M 2 >/dev/null
    read -r b1 p1 < <(tx_counters "$hosts"); ours "$algo" builtin "$hosts" "$per_host" 4M 4M 12 >/dev/null
    read -r b2 p2 < <(tx_counters "$hosts")
    wire=$(( ((b2 - b1) - (b1 - b0)) / 20 ))
    # Payload: minus each frame's Ethernet, IPv4 and TCP headers with timestamps (14 + 20 + 32 bytes).
    payload=$(( ((b2 - b1) - (b1 - b0) - 66 * ((p2 - p1) - (p1 - p0))) / 20 ))
    theory=$("$build/bin/collective_model" --hosts "$hosts" --per-host "$per_host" --algos "$algo" -b 4M -e 4M |
             awk '$1 ~ /^[0-9]/ {print $3}')
    echo "$algo $payload $wire $theory" >>"$file"
  done
  cat "$file"
  "$sim" down "$name"
done
python3 "$here/cluster_summary.py" "$out" "$build/bin/collective_model"
# busbw against size, one plot per layout and profile (gnuplot: scripts/deps.sh gnuplot-nox).
if "$root/scripts/deps.sh" gnuplot-nox >/dev/null 2>&1 && command -v gnuplot >/dev/null; then
  for data in "$out"/*x*-*.dat; do
    base=$(basename "$data" .dat); hosts=${base%%x*}; rest=${base#*x}
    gnuplot -e "datafile='$data'; outfile='$out/$base.svg'; heading='$hosts hosts x ${rest%%-*} per host, link ${rest#*-}'" \
      "$here/plot_cluster.gp"
  done
else
  echo "compare_cluster.sh: gnuplot could not be installed (scripts/deps.sh gnuplot-nox): no plots" >&2
fi
