#!/usr/bin/env bash
# ab-bench.sh [-n ROUNDS] REV... -- BENCH-FLAGS...: compares gormlease at
# other revisions with the working tree's, on the working tree's bench
# harness (bench/), so that every revision is measured the same way. For
# each REV it builds the harness against that revision's library (a
# detached worktree under $OUT), then runs the builds in turn, ROUNDS
# times (default 2), each with BENCH-FLAGS (default: the lock section,
# gormlease and the plain-SQL lease, in slices of 4 s: at 32 workers the
# harness's default slices of 200 ms, each on a fresh pool, measure the
# pool's opening more than the lease). Each run writes its report to
# $OUT/REV-K.md (OUT defaults to /tmp/gormlease-ab); compare the ratios
# to the plain lease of runs next to each other in time. "HEAD" stands
# for the working tree.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${OUT:-/tmp/gormlease-ab}
rounds=2
if [ "${1:-}" = "-n" ]; then rounds=$2; shift 2; fi
revs=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do revs+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
flags=("$@")
[ ${#flags[@]} -eq 0 ] && flags=(-sections lock -impls '^gormlease$|plain' -duration 12s -rounds 3)
[ ${#revs[@]} -eq 0 ] && { echo "usage: $0 [-n ROUNDS] REV... [-- BENCH-FLAGS...]" >&2; exit 2; }
mkdir -p "$out"
for rev in "${revs[@]}"; do
  lib=$root
  if [ "$rev" != HEAD ]; then
    lib=$out/lib-$rev
    [ -d "$lib" ] || git worktree add -q --detach "$lib" "$rev"
  fi
  rm -rf "$out/bench-$rev"
  cp -r bench "$out/bench-$rev"
  (cd "$out/bench-$rev" && go mod edit -replace "github.com/gormlease/gormlease=$lib" && go build -o "$out/bin-$rev" .)
done
for k in $(seq "$rounds"); do
  for rev in "${revs[@]}"; do
    echo "round $k: $rev (load $(cut -d' ' -f1 /proc/loadavg))"
    "$out/bin-$rev" "${flags[@]}" -schema "ab_$(echo "$rev" | tr -c 'a-zA-Z0-9\n' _)" -out "$out/$rev-$k.md" >"$out/$rev-$k.log" 2>&1
    grep -E '^\| (acquire\+release|full job|contended)' "$out/$rev-$k.md" | grep -E '×' | sed "s/^/  $rev-$k /" || true
  done
done
