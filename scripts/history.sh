#!/usr/bin/env bash
# scripts/history.sh: the history checker's long run (history/, see
# docs/reliability.md). Worker processes run Run loops on PostgreSQL,
# MariaDB, SQLite and the Patroni cluster (which fails over) while faults
# are injected; the checker then verifies every log and the database's
# records. Then the fence mutation, which the checker must catch (on
# PostgreSQL, MariaDB and the Patroni cluster).
#
#   scripts/history.sh [DURATION]     each run's length (default 5m), every database at once
#
# HISTORY_RUNS (default 1) runs per database; GORMLEASE_HISTORY_SEED
# repeats a run's settings and fault schedule (not its timing);
# GORMLEASE_HISTORY_DIR keeps the logs (and porcupine's drawings of the
# histories that are not linearizable); HISTORY_MUTATION=0 leaves the
# mutation out. The databases are those of the tests (internal/testdb):
# start them, and install Patroni (scripts/install-patroni.sh), as .ci/run
# does. Exits non-zero on any violation.
set -euo pipefail
cd "$(dirname "$0")/../history"
duration="${1:-5m}"
runs="${HISTORY_RUNS:-1}"
for i in $(seq "$runs"); do
  echo "== history run $i of $runs, $duration per database"
  GORMLEASE_HISTORY_DURATION="$duration" go test -race -count=1 -v -parallel 4 -timeout 0 \
    -run '^TestHistory_(Postgres|MariaDB|SQLite|Patroni)$' ./
done
if [ "${HISTORY_MUTATION:-1}" != 0 ]; then
  echo "== the fence mutation, $duration per database: the checker must report violations"
  GORMLEASE_HISTORY_DURATION="$duration" go test -race -count=1 -v -parallel 3 -timeout 0 \
    -run '^TestHistory_MutatedFenceIsCaught_' ./
fi
