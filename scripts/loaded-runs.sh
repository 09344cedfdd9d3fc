#!/usr/bin/env bash
# loaded-runs.sh N [LOAD]: runs the README's test command N times in a row
# while LOAD (default 2) busy loops keep the cores loaded, and stops at the
# first failing run. Each run's output goes to $OUT (default
# /tmp/gormlease-loaded)/run-K.log; a summary line per run to stdout.
set -uo pipefail
cd "$(dirname "$0")/.."
n=${1:-20}
load=${2:-2}
out=${OUT:-/tmp/gormlease-loaded}
mkdir -p "$out"
pids=()
for _ in $(seq "$load"); do
  ( while :; do :; done ) &
  pids+=($!)
done
trap 'kill "${pids[@]}" 2>/dev/null' EXIT
for k in $(seq "$n"); do
  begin=$(date +%s)
  go test -race -count=1 -timeout 30m ./... >"$out/run-$k.log" 2>&1
  status=$?
  echo "run $k: exit $status in $(( $(date +%s) - begin ))s, load $(cut -d' ' -f1 /proc/loadavg)"
  if [ "$status" -ne 0 ]; then
    grep -E -- '--- FAIL|^FAIL|panic' "$out/run-$k.log" | head -20
    exit 1
  fi
done
echo "$n runs passed in a row with $load busy loops"
