#!/usr/bin/env bash
# shm_memory.sh: what a job on one host takes in /dev/shm and in RAM per rank, at several world
# sizes, for one or more builds side by side (e.g. the branch point's build folder beside this one).
#
#   bench/shm_memory.sh BUILD_DIR [BUILD_DIR ...]
#   RANKS="2 8 32 64" SIZE=1M bench/shm_memory.sh ../base/build build
#   TRANSPORT=tcp RANKS="2 8 16" bench/shm_memory.sh ../base/build build
#
# Each job is `tinyddp-run -n N all_reduce_perf -b SIZE -e SIZE --transport shm`: a few all-reduces
# (ITERS timed, default 3, after one warm-up; more at small N so that the job lives long enough to
# be sampled), plus what the perf program itself runs (a barrier and small all-reduces that gather
# its timings). On a 2-core host 64 ranks take a while even so: the numbers are about memory, not
# speed. While the job runs, every worker is sampled every 10 ms:
#   /dev/shm    the tinyddp segments its workers have mapped, each counted once (from
#               /proc/<pid>/maps: they are unlinked early, so `df` alone cannot tell them from
#               other jobs'), at the peak, divided by N
#   segments    the most tinyddp segments one worker maps (its own and its peers')
#   RSS         each worker's peak VmHWM, the median over the workers; and its peak RssShmem (the
#               part that is shared memory, mapped by two ranks each) and RssAnon (its own)
# Prints one Markdown table row per build and N.
set -euo pipefail

[ $# -ge 1 ] || { sed -n 2,20p "$0"; exit 2; }
ranks=${RANKS:-"2 8 32 64"}
size=${SIZE:-1M}
timeout_s=${TIMEOUT:-600}
transport=${TRANSPORT:-shm}  # tcp: the same job over loopback sockets (no /dev/shm; one inbox per peer)

sample() {  # sample LAUNCHER_PID: prints "shm_bytes max_fifos rss_kib shmem_kib anon_kib" at the end
  python3 - "$1" <<'EOF'
import os, sys, time, statistics
root = int(sys.argv[1])
peak_shm, max_fifos, hwm, shmem, anon = 0, 0, {}, {}, {}

def children():
    kids = {}
    for p in os.listdir('/proc'):
        if not p.isdigit(): continue
        try:
            with open(f'/proc/{p}/stat') as f: ppid = int(f.read().rsplit(')', 1)[1].split()[1])
        except OSError: continue
        kids.setdefault(ppid, []).append(int(p))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        for k in kids.get(pid, []): out.append(k); todo.append(k)
    return out

def status(pid):
    fields = {}
    with open(f'/proc/{pid}/status') as f:
        for line in f:
            key, _, value = line.partition(':')
            if key in ('VmHWM', 'RssShmem', 'RssAnon', 'Name'): fields[key] = value.split()[0]
    return fields

while os.path.exists(f'/proc/{root}'):
    segments = {}
    for pid in children():
        try:
            st = status(pid)
            if 'perf' not in st.get('Name', ''): continue
            fifos = 0
            with open(f'/proc/{pid}/maps') as f:
                for line in f:
                    if '/dev/shm/tinyddp-' not in line: continue
                    span, name = line.split()[0], line.split()[5]
                    lo, hi = (int(x, 16) for x in span.split('-'))
                    segments[name] = hi - lo
                    fifos += 1
            max_fifos = max(max_fifos, fifos)
            hwm[pid] = max(hwm.get(pid, 0), int(st['VmHWM']))
            shmem[pid] = max(shmem.get(pid, 0), int(st.get('RssShmem', 0)))
            anon[pid] = max(anon.get(pid, 0), int(st.get('RssAnon', 0)))
        except (OSError, KeyError, ValueError, IndexError):
            continue
    peak_shm = max(peak_shm, sum(segments.values()))
    time.sleep(0.01)
med = lambda d: int(statistics.median(d.values())) if d else 0
print(peak_shm, max_fifos, med(hwm), med(shmem), med(anon))
EOF
}

mib() { awk -v b="$1" 'BEGIN { printf "%.2f", b / 1048576 }'; }

echo "transport $transport, all-reduces of $size"
echo
echo "| build | ranks | /dev/shm per rank (MiB) | segments per rank (max) | RSS per rank (MiB, median peak) | of it shared memory | of it private |"
echo "|---|---:|---:|---:|---:|---:|---:|"
for build in "$@"; do
  bin=$(cd "$build" && pwd)/bin
  [ -x "$bin/tinyddp-run" ] && [ -x "$bin/all_reduce_perf" ] || { echo "build $build first (tinyddp-run, all_reduce_perf)"; exit 2; }
  label=$(git -C "$build/.." rev-parse --short HEAD 2>/dev/null || echo "$build")
  for n in $ranks; do
    iters=${ITERS:-$(( n <= 2 ? 3000 : n <= 8 ? 300 : 3 ))}
    log=$(mktemp)
    timeout "$timeout_s" "$bin/tinyddp-run" -n "$n" "$bin/all_reduce_perf" -b "$size" -e "$size" -n "$iters" -w 1 \
      --transport "$transport" >"$log" 2>&1 &
    job=$!
    read -r shm fifos rss shmem anon < <(sample "$job")
    if ! wait "$job"; then echo "| $label | $n | failed: $(tail -1 "$log") |||||"; rm -f "$log"; continue; fi
    rm -f "$log"
    echo "| $label | $n | $(mib $(( shm / n ))) | $fifos | $(mib $(( rss * 1024 ))) | $(mib $(( shmem * 1024 ))) | $(mib $(( anon * 1024 ))) |"
  done
done
