#!/usr/bin/env bash
# Names every skip a `make test` run recorded (TINYDDP_SKIP_LOG, one tab-separated line a skip:
# suite, skipped|partly, test case, reason), each once: the nn suite runs under several CPU GEMM caps
# and would list its skips once a run.
#
#   scripts/list_skips.sh build/skipped.log
set -euo pipefail
log=$1
if [ ! -s "$log" ]; then
  echo "make test: nothing was skipped"
  exit 0
fi
count=$(sort -u "$log" | wc -l)
echo "make test: $count skip(s), each with its reason (a test skipped counts as passed in the totals above):"
sort -u "$log" | awk -F'\t' '{ printf "  %-14s %-8s \"%s\": %s\n", $1, $2, $3, $4 }'
