#!/usr/bin/env bash
# run_local.sh: one peer's all-reduce on WORLD ranks of this host, as the comparisons run it.
#
#   bench/peers/run_local.sh BUILD_DIR mpi|gloo|torch WORLD [MIN_BYTES] [MAX_BYTES]   (default 1K 256M)
#
#   mpi    BUILD_DIR/bin/mpi_all_reduce under mpirun: Open MPI picks shared memory between the ranks
#          of one host
#   gloo   BUILD_DIR/bin/gloo_all_reduce, one process per rank, meeting through a fresh folder
#   torch  bench/peers/torch_all_reduce.py (PyTorch's gloo backend), which spawns its ranks
#
# Prints the peer's header lines ("# ...") and then one row per size from MIN_BYTES to MAX_BYTES,
# float32 sum in place: bytes time_us algbw busbw (GB/s). (mpi_all_reduce prints nccl-tests' in-place
# columns; they are cut to these four here, after checking its #wrong column.) Exits 3 with one line
# saying why when the peer is not there (scripts/deps.sh --bench installs the peers, then the build
# makes their programs), and non-zero when it failed or a result was wrong. A peer runs for at most
# PEER_TIMEOUT seconds (default 900).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ $# -ge 3 ] || { sed -n 2,15p "$0" >&2; exit 2; }
build=$1 peer=$2 world=$3
min=$(numfmt --from=iec "${4:-1K}")
max=$(numfmt --from=iec "${5:-256M}")
limit=${PEER_TIMEOUT:-900}
[[ $world =~ ^[1-9][0-9]*$ ]] || { echo "run_local.sh: WORLD '$world' is not a rank count" >&2; exit 2; }

missing() { echo "run_local.sh: $peer: $*" >&2; exit 3; }

# Keeps the header and the rows of the sizes asked for (a peer that sweeps a fixed range of sizes
# is cut to it).
rows_between() { awk -v min="$min" -v max="$max" '/^#/ || ($1 ~ /^[0-9]+$/ && $1 >= min && $1 <= max)'; }

# nccl-tests' in-place row (size count type redop root time algbw busbw #wrong) as bytes time_us algbw
# busbw; a row with a wrong element ends the table with an error instead.
from_nccl_tests_rows() {
  awk '/^#/ { print; next }
       $1 ~ /^[0-9]+$/ && NF >= 9 && $3 == "float" {
         if ($9 != 0) { print "run_local.sh: mpi: " $9 " wrong elements at " $1 " bytes" > "/dev/stderr"; exit 1 }
         printf "%12d %12s %8s %8s\n", $1, $6, $7, $8 }'
}

case $peer in
  mpi)
    program=$build/bin/mpi_all_reduce
    [ -f "$here/mpi_all_reduce.cpp" ] || missing "this tree has no bench/peers/mpi_all_reduce.cpp"
    [ -x "$program" ] || missing "$program is not built (Open MPI's libopenmpi-dev was not found when cmake ran)"
    command -v mpirun >/dev/null || missing "no mpirun (openmpi-bin)"
    # --allow-run-as-root: these hosts run the benchmarks as root; --oversubscribe: more ranks than cores.
    timeout "$limit" mpirun --allow-run-as-root --oversubscribe -np "$world" "$program" -b "$min" -e "$max" -f 4 |
      from_nccl_tests_rows | rows_between
    ;;
  gloo)
    program=$build/bin/gloo_all_reduce
    [ -x "$program" ] || missing "$program is not built (Gloo's libgloo-dev was not found when cmake ran)"
    store=$(mktemp -d)
    pids=()
    trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$store"' EXIT
    for ((r = 1; r < world; r++)); do
      RANK=$r WORLD_SIZE=$world timeout "$limit" "$program" --store "$store" --min-bytes "$min" --max-bytes "$max" >/dev/null &
      pids+=($!)
    done
    status=0
    RANK=0 WORLD_SIZE=$world timeout "$limit" "$program" --store "$store" --min-bytes "$min" --max-bytes "$max" || status=$?
    for p in "${pids[@]}"; do wait "$p" || { [ "$status" -ne 0 ] || status=1; }; done
    pids=()
    exit "$status"
    ;;
  torch)
    /usr/bin/python3 -c 'import torch.distributed' 2>/dev/null || missing "/usr/bin/python3 does not import torch (python3-torch)"
    timeout "$limit" /usr/bin/python3 "$here/torch_all_reduce.py" --world "$world" --min-bytes "$min" --max-bytes "$max"
    ;;
  *)
    echo "run_local.sh: unknown peer '$peer'; hint: mpi, gloo or torch" >&2
    exit 2
    ;;
esac
