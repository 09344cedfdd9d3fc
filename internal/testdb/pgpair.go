package testdb

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"
)

// PgPair is a PostgreSQL primary and a standby that streams its WAL, two
// clusters of the test's own on loopback (see Cluster), for failover tests.
// With sync the primary names the standby in synchronous_standby_names and
// commits with synchronous_commit=on: a COMMIT returns only once the
// standby has flushed it. Without it the standby receives the WAL
// asynchronously, as in PostgreSQL's default setup.
//
// The application reaches the pair through DSN, a multi-host DSN with
// target_session_attrs=read-write: pgx tries both servers and keeps the
// one that accepts writes, so after Failover new connections go to the
// promoted standby.
type PgPair struct {
	primary, standby *Cluster // standby is nil once promoted
	ports            [2]int   // of the first primary and of the first standby
}

// pairSettings keep the two clusters small and quick to recover.
var pairSettings = []string{
	"shared_buffers=16MB", "max_connections=60", "max_wal_senders=4", "wal_level=replica",
	"wal_retrieve_retry_interval=100ms", "wal_receiver_status_interval=1s",
}

// NewPgPair makes a primary and a standby made from it with
// pg_basebackup, starts both and waits until the standby streams (and, with
// sync, until the primary counts it as its synchronous standby). Both are
// stopped and deleted when tb ends.
func NewPgPair(tb testing.TB, sync bool) *PgPair {
	tb.Helper()
	primary := emptyCluster(tb)
	if _, err := os.Stat(filepath.Join(primary.bin, "pg_basebackup")); err != nil {
		unavailable(tb, "PostgreSQL standby (pg_basebackup)", err)
	}
	primary.initdb(tb)
	primary.settings = append([]string(nil), pairSettings...)
	if sync {
		primary.settings = append(primary.settings, "synchronous_standby_names=standby", "synchronous_commit=on")
	}
	primary.Start(tb)

	// The standby's own settings leave out synchronous_standby_names: once
	// promoted, it has no standby to wait for.
	standby := emptyCluster(tb)
	standby.settings = append([]string(nil), pairSettings...)
	from := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres application_name=standby", primary.port)
	if err := standby.run("pg_basebackup", "-d", from, "-D", standby.data, "-R", "-X", "stream",
		"--checkpoint=fast", "--no-sync"); err != nil {
		tb.Fatalf("pg_basebackup: %v", err)
	}
	standby.Start(tb)

	p := &PgPair{primary: primary, standby: standby, ports: [2]int{primary.port, standby.port}}
	want := "streaming"
	if sync {
		want = "streaming sync"
	}
	p.waitFor(tb, primary, "the standby to stream", want, `SELECT coalesce(
		(SELECT state || CASE WHEN sync_state = 'sync' THEN ' sync' ELSE '' END
		 FROM pg_stat_replication WHERE application_name = 'standby'), 'none')`)
	return p
}

// DSN is the pair's multi-host DSN: both servers, in the order primary,
// standby, with target_session_attrs=read-write.
func (p *PgPair) DSN() string {
	return fmt.Sprintf("host=127.0.0.1,127.0.0.1 port=%d,%d user=postgres dbname=postgres sslmode=disable"+
		" connect_timeout=2 target_session_attrs=read-write", p.ports[0], p.ports[1])
}

// Open returns a new pool on DSN with the gormlease tables made. It is
// closed when tb ends.
func (p *PgPair) Open(tb testing.TB) *gorm.DB {
	tb.Helper()
	return openPostgresTables(tb, p.DSN())
}

// Primary is the cluster that accepts writes now.
func (p *PgPair) Primary() *Cluster { return p.primary }

// WaitReplayed waits until the standby has replayed everything the primary
// has written so far: what was committed is then visible on the standby,
// and survives a Failover even without sync.
func (p *PgPair) WaitReplayed(tb testing.TB) {
	tb.Helper()
	lsn, err := p.primary.scalar("SELECT pg_current_wal_lsn()::text")
	if err != nil {
		tb.Fatalf("primary's WAL position: %v", err)
	}
	p.waitFor(tb, p.standby, "the standby to replay "+lsn, "true",
		"SELECT (pg_last_wal_replay_lsn() >= $1::pg_lsn)::text", lsn)
}

// DetachStandby stops the standby's WAL receiver, by clearing its
// primary_conninfo, and waits until the primary sees no standby: what the
// primary writes from then on never reaches the standby. With sync, commits
// on the primary then wait (wait event SyncRep) for ever.
func (p *PgPair) DetachStandby(tb testing.TB) {
	tb.Helper()
	for _, stmt := range []string{"ALTER SYSTEM SET primary_conninfo = ''", "SELECT pg_reload_conf()"} {
		if err := p.standby.exec(stmt); err != nil {
			tb.Fatalf("standby: %s: %v", stmt, err)
		}
	}
	p.waitFor(tb, p.standby, "the standby's WAL receiver to stop", "0", "SELECT count(*)::text FROM pg_stat_wal_receiver")
	p.waitFor(tb, p.primary, "the primary to lose its standby", "0", "SELECT count(*)::text FROM pg_stat_replication")
}

// Failover crashes the primary and promotes the standby: Crash, then
// Promote.
func (p *PgPair) Failover(tb testing.TB) {
	tb.Helper()
	p.Crash(tb)
	p.Promote(tb)
}

// Crash stops the primary at once, as a crash would (pg_ctl stop -m
// immediate): connections drop and transactions in flight are lost. It
// stays down; until Promote, no server accepts writes.
func (p *PgPair) Crash(tb testing.TB) {
	tb.Helper()
	if p.standby == nil {
		tb.Fatal("crash: no standby left to promote after it")
	}
	p.primary.Crash(tb)
}

// Promote promotes the standby (pg_ctl promote) after Crash, and waits
// until it accepts writes: it is the primary from then on.
func (p *PgPair) Promote(tb testing.TB) {
	tb.Helper()
	if p.standby == nil {
		tb.Fatal("promote: no standby left")
	}
	if err := p.standby.pgctl("promote", "-w", "-t", "60"); err != nil {
		tb.Fatalf("pg_ctl promote: %v", err)
	}
	p.primary, p.standby = p.standby, nil
}

// waitFor polls query on c until it returns want, failing tb after a minute.
func (p *PgPair) waitFor(tb testing.TB, c *Cluster, what, want, query string, args ...any) {
	tb.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		got, err := c.scalar(query, args...)
		if err == nil && got == want {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s: got %q (error %v), want %q", what, got, err, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// scalar runs query on a connection of its own to c and returns the one
// text value it reads.
func (c *Cluster) scalar(query string, args ...any) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.dsn())
	if err != nil {
		return "", err
	}
	defer conn.Close(ctx)
	var v string
	err = conn.QueryRow(ctx, query, args...).Scan(&v)
	return v, err
}

// exec runs stmt on a connection of its own to c.
func (c *Cluster) exec(stmt string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.dsn())
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, stmt)
	return err
}

// dsn is the DSN of c's postgres database.
func (c *Cluster) dsn() string {
	return fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres sslmode=disable connect_timeout=5", c.port)
}
