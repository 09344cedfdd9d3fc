#!/usr/bin/env bash
# scripts/history.sh: the history checker's long run (history/, see
# docs/reliability.md). Worker processes call Run, Do and RunWait on
# PostgreSQL, MariaDB, SQLite, the Patroni cluster (which fails over) and a
# Galera cluster of three nodes (one of which crashes and rejoins) while
# faults are injected, among them refused connections (not on SQLite,
# which has no server); the checker then verifies every log and the
# database's records. Then the mutations, which the checker must catch:
# the fence broken (on PostgreSQL, MariaDB, the Patroni cluster and the
# Galera cluster), Do's first-read rule dropped (the workers built
# with -tags gormlease_mutation_do_first_read; on PostgreSQL and MariaDB),
# and, after a clean run, the event table of the lease table's history
# corrupted (on PostgreSQL, MariaDB and SQLite).
#
#   scripts/history.sh [DURATION]     each run's length (default 5m), every database at once
#
# HISTORY_RUNS (default 1) runs per database; GORMLEASE_HISTORY_SEED
# repeats a run's settings and fault schedule (not its timing);
# GORMLEASE_HISTORY_DIR keeps the logs (and porcupine's drawings of the
# histories that are not linearizable); HISTORY_MUTATION=0 leaves the
# mutations out. GORMLEASE_HISTORY_GALERA_SYNC_WAIT (the workers'
# wsrep_sync_wait, default 0), GORMLEASE_HISTORY_GALERA_FLUSH (the nodes'
# innodb_flush_log_at_trx_commit, default 0) and
# GORMLEASE_HISTORY_GALERA_WRITERS (spread or one; by default chosen by the
# seed) set the Galera run's settings (docs/scaling.md). The databases are
# those of the tests (internal/testdb): start them, install Patroni
# (scripts/install-patroni.sh) and galera-4 with rsync, as .ci/run does.
# Exits non-zero on any violation. A 5-minute run per database is the
# default, `scripts/history.sh 5m`.
set -euo pipefail
cd "$(dirname "$0")/../history"
duration="${1:-5m}"
runs="${HISTORY_RUNS:-1}"
for i in $(seq "$runs"); do
  echo "== history run $i of $runs, $duration per database"
  GORMLEASE_HISTORY_DURATION="$duration" go test -race -count=1 -v -parallel 5 -timeout 0 \
    -run '^TestHistory_(Postgres|MariaDB|SQLite|Patroni|Galera)$' ./
done
if [ "${HISTORY_MUTATION:-1}" != 0 ]; then
  echo "== the fence, Do and event mutations, $duration per database: the checker must report violations"
  GORMLEASE_HISTORY_DURATION="$duration" go test -race -count=1 -v -parallel 9 -timeout 0 \
    -run '^TestHistory_Mutated((Fence|Do)IsCaught|EventsAreCaught)_' ./
fi
