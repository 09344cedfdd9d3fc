package gormlease_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/testdb"
	"github.com/gormlease/gormlease/leasetest"
)

// AutoMigrate makes the event table only with WithHistory, named after the
// lease table; again, and several at once, it changes nothing; without
// WithHistory it leaves an existing history alone. The lease table gets
// end_cause and ended_by either way.
func TestAutoMigrate_WithHistoryMakesEventTable(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		ctx := context.Background()
		db := s.OpenEmpty(t, nil)
		require.NoError(t, gormlease.AutoMigrate(ctx, db))
		assert.False(t, db.Migrator().HasTable("job_lease_event"), "an event table without WithHistory")
		cols := leaseColumns(t, db)
		assert.Contains(t, cols, "end_cause")
		assert.Contains(t, cols, "ended_by")

		require.NoError(t, migrateAtOnce(db, 4, gormlease.WithHistory()))
		assert.True(t, db.Migrator().HasTable("job_lease_event"))
		require.NoError(t, gormlease.AutoMigrate(ctx, db), "without WithHistory after it")
		assert.True(t, db.Migrator().HasTable("job_lease_event"), "AutoMigrate without WithHistory dropped the history")

		names := gormlease.WithTableNames("hist_lease", "hist_result")
		require.NoError(t, gormlease.AutoMigrate(ctx, db, names, gormlease.WithHistory()))
		assert.True(t, db.Migrator().HasTable("hist_lease_event"))

		// Names qualified by the schema (PostgreSQL), database (MySQL) or
		// attached database (SQLite): the event table, and the index,
		// triggers and functions, are made in the lease table's, and the
		// triggers write the events there.
		var space string
		switch s.Name {
		case "postgres":
			require.NoError(t, db.Raw("SELECT current_schema()").Scan(&space).Error)
		case "mysql":
			require.NoError(t, db.Raw("SELECT DATABASE()").Scan(&space).Error)
		default:
			space = "main"
		}
		qualified := []gormlease.MigrateOption{gormlease.WithTableNames(space+".qual_lease", space+".qual_result"), gormlease.WithHistory()}
		require.NoError(t, gormlease.AutoMigrate(ctx, db, qualified...))
		require.NoError(t, gormlease.AutoMigrate(ctx, db, qualified...), "again")
		r, err := gormlease.NewRunner[string](db, gormlease.WithTableNames(space+".qual_lease", space+".qual_result"), gormlease.WithHolder("q"))
		require.NoError(t, err)
		target := newTarget(t)
		_, err = r.Run(ctx, target, func(context.Context) (string, error) { return "v", nil }, gormlease.SaveJSON[string])
		require.NoError(t, err)
		assert.Equal(t, []event{
			{Kind: "acquired", Generation: 1, Holder: "q", How: "new"},
			{Kind: "ended", Generation: 1, Holder: "q", How: "saved"},
		}, readEvents(t, db, space+".qual_lease_event", target))
	})
}

// AutoMigrate refuses a nil option, writing nothing.
func TestAutoMigrate_NilOption(t *testing.T) {
	t.Parallel()
	db := testdb.SQLite(t).OpenEmpty(t, nil)
	err := gormlease.AutoMigrate(context.Background(), db, gormlease.WithHistory(), nil)
	require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "option 1 is nil")
	assert.False(t, db.Migrator().HasTable("job_lease"))
}

// event is an event of the history as a test expects it: what the event
// table holds but for its seq (the list's order) and times.
type event struct {
	Kind, Holder, How, Operator, Detail string
	Generation, From                    int64
}

// atoi is s as an int, which it must be.
func atoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	require.NoError(t, err)
	return n
}

// readEvents reads the events of key (a target's own row, or a slot's) of
// the lease table whose event table is table, oldest first, as
// admin.Operator.History returns them, page by page, and checks what every
// list must be: seq 1, 2, ... and times that never go back, and an
// acquisition time on each ended event, not after its end.
func readEvents(t *testing.T, db *gorm.DB, table, key string) []event {
	t.Helper()
	lease := strings.TrimSuffix(table, "_event")
	repo, err := gormlease.NewRepository(db, gormlease.WithTableNames(lease, lease+"_result"))
	require.NoError(t, err)
	op := admin.New(repo)
	target, slot := key, 0
	if i := strings.LastIndexByte(key, 0x1f); i >= 0 { // a slot's row (backend.SlotKey)
		target, slot = key[:i], atoi(t, key[i+1:])
	}
	var all []admin.Event
	for before := int64(0); ; {
		page, err := op.History(context.Background(), target, admin.HistoryOptions{Slot: slot, Before: before, Limit: 7})
		require.NoError(t, err)
		all = append(all, page...)
		if len(page) < 7 {
			break
		}
		before = page[len(page)-1].Seq
	}
	var (
		out  []event
		last time.Time
	)
	for i := len(all) - 1; i >= 0; i-- {
		a := all[i]
		e := event{Kind: string(a.Kind), Holder: a.Holder, How: a.How, Operator: a.Operator, Detail: a.Detail,
			Generation: a.Generation, From: a.FromGeneration}
		require.EqualValues(t, len(out)+1, a.Seq, "seq of event %+v", e)
		assert.False(t, a.At.Before(last), "event %d at %v, before the one before it (%v)", a.Seq, a.At, last)
		last = a.At
		if e.Kind == "ended" && assert.NotNil(t, a.AcquiredAt, "acquired_at of ended event %d", a.Seq) {
			assert.False(t, a.At.Before(*a.AcquiredAt), "event %d ended at %v, before its acquisition at %v", a.Seq, a.At, *a.AcquiredAt)
		}
		out = append(out, e)
	}
	return out
}

// historyDB returns a pool on an empty schema (PostgreSQL), database
// (MySQL) or file (SQLite) of s whose tables AutoMigrate made with
// WithHistory.
func historyDB(t *testing.T, s *testdb.Server) *gorm.DB {
	t.Helper()
	db := s.OpenEmpty(t, nil)
	require.NoError(t, gormlease.AutoMigrate(context.Background(), db, gormlease.WithHistory()))
	return db
}

// The scripted sequence on one target: a Run that saves, a lease
// that saves with CommitIfOwner and then expires, taken over by a Run that
// fails, a lease that an operator pauses, asks to stop and releases by
// force, and the resume. The event table holds exactly those events, in
// order, with their generations, holders, hows, operators and details,
// although no process was given any history option: the schema keeps
// the history.
func TestHistory_ScriptedSequence(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		ctx := context.Background()
		db := historyDB(t, s)
		target := newTarget(t)
		opts := fast(100*time.Millisecond, 20*time.Second)

		_, err := newRunner(t, db, append(opts, gormlease.WithHolder("h1"))...).Run(ctx, target,
			func(context.Context) (string, error) { return "v1", nil }, gormlease.SaveJSON[string])
		require.NoError(t, err)

		repo2, err := gormlease.NewRepository(db, gormlease.WithHolder("h2"))
		require.NoError(t, err)
		l2, err := repo2.Acquire(ctx, target, time.Hour)
		require.NoError(t, err)
		require.NoError(t, repo2.CommitIfOwner(ctx, l2, func(tx *gorm.DB) error { return gormlease.SaveJSON(tx, "v2") }))
		age(t, s, db, target, 2*time.Hour)

		_, err = newRunner(t, db, append(opts, gormlease.WithHolder("h3"))...).Run(ctx, target,
			func(context.Context) (string, error) { return "", errors.New("boom") }, gormlease.SaveJSON[string])
		require.ErrorContains(t, err, "boom")
		failure := leaseRow(t, db, target).Failure
		require.NotNil(t, failure)

		repo4, err := gormlease.NewRepository(db, gormlease.WithHolder("h4"))
		require.NoError(t, err)
		_, err = repo4.Acquire(ctx, target, time.Hour)
		require.NoError(t, err)
		op := admin.New(repo4)
		require.NoError(t, op.As("alice").Pause(ctx, target, "deploy"))
		require.NoError(t, op.As("bob").RequestStop(ctx, target, "runaway"))
		forced, err := op.As("carol").ForceRelease(ctx, target)
		require.NoError(t, err)
		require.NotNil(t, forced.Failure)
		if assert.NotNil(t, forced.EndCause) {
			assert.Equal(t, "forced", *forced.EndCause)
		}
		if assert.NotNil(t, forced.EndedBy) {
			assert.Equal(t, "carol", *forced.EndedBy)
		}
		require.NoError(t, op.As("dave").Resume(ctx, target))

		assert.Equal(t, []event{
			{Kind: "acquired", Generation: 1, Holder: "h1", How: "new"},
			{Kind: "ended", Generation: 1, Holder: "h1", How: "saved"},
			{Kind: "acquired", Generation: 2, Holder: "h2", How: "released", From: 1},
			{Kind: "saved", Generation: 2, Holder: "h2"},
			{Kind: "ended", Generation: 2, Holder: "h2", How: "expired"},
			{Kind: "acquired", Generation: 3, Holder: "h3", How: "expired", From: 2},
			{Kind: "ended", Generation: 3, Holder: "h3", How: "failed", Detail: *failure},
			{Kind: "acquired", Generation: 4, Holder: "h4", How: "released", From: 3},
			{Kind: "paused", Generation: 4, Holder: "h4", Operator: "alice", Detail: "deploy"},
			{Kind: "stop_requested", Generation: 4, Holder: "h4", Operator: "bob", Detail: "runaway"},
			{Kind: "ended", Generation: 4, Holder: "h4", How: "forced", Operator: "carol", Detail: *forced.Failure},
			{Kind: "resumed", Generation: 5, Holder: "h4", Operator: "dave"},
		}, readEvents(t, db, "job_lease_event", target))
		assert.Contains(t, *failure, "boom")
	})
}

// Each way a Run ends is the how of its generation's ended event, with the
// failure as its detail: a panic, the caller's context, the saver's
// failure, the max hold, an operator's stop; a minimum hold ends the
// generation when the hold begins, so that the takeover after it writes
// no second ended event; a takeover of a live lease (leasetest.TakeOver)
// is a seizure; a Release that saved nothing is a release; a slot's
// first acquisition is new.
func TestHistory_EndCauses(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		ctx := context.Background()
		db := historyDB(t, s)
		opts := append(fast(100*time.Millisecond, 20*time.Second), gormlease.WithHolder("h"))
		events := func(t *testing.T, key string) []event { return readEvents(t, db, "job_lease_event", key) }
		failure := func(t *testing.T, target string) string {
			row := leaseRow(t, db, target)
			require.NotNil(t, row.Failure, "the row's failure")
			return *row.Failure
		}
		// ended is the list of a Run of generation 1 that ended with how and
		// the row's failure, if any, after the events between.
		ended := func(t *testing.T, target, how string, between ...event) []event {
			detail := ""
			if how != "saved" {
				detail = failure(t, target)
			}
			list := append([]event{{Kind: "acquired", Generation: 1, Holder: "h", How: "new"}}, between...)
			return append(list, event{Kind: "ended", Generation: 1, Holder: "h", How: how, Detail: detail})
		}
		// blocked runs a Run whose work blocks until its context ends, and
		// returns its error once started and then then have run.
		blocked := func(t *testing.T, ctx context.Context, r *gormlease.Runner[string], target string, then func()) error {
			started := make(chan struct{})
			done := make(chan error, 1)
			go func() {
				_, err := r.Run(ctx, target, func(ctx context.Context) (string, error) {
					close(started)
					<-ctx.Done()
					return "", ctx.Err()
				}, noSave(t))
				done <- err
			}()
			recv(t, started, 20*time.Second, "the work to start")
			then()
			return recv(t, done, 20*time.Second, "the Run to end")
		}

		t.Run("panic", func(t *testing.T) {
			target := newTarget(t)
			_, err := newRunner(t, db, opts...).Run(ctx, target, func(context.Context) (string, error) { panic("oops") }, noSave(t))
			require.ErrorContains(t, err, "oops")
			assert.Equal(t, ended(t, target, "panic"), events(t, target))
		})
		t.Run("cancelled", func(t *testing.T) {
			target := newTarget(t)
			cctx, cancel := context.WithCancel(ctx)
			err := blocked(t, cctx, newRunner(t, db, opts...), target, cancel)
			require.ErrorIs(t, err, context.Canceled)
			assert.Equal(t, ended(t, target, "cancelled"), events(t, target))
		})
		t.Run("save_failed", func(t *testing.T) {
			target := newTarget(t)
			_, err := newRunner(t, db, opts...).Run(ctx, target, func(context.Context) (string, error) { return "v", nil },
				func(*gorm.DB, string) error { return errors.New("disk full") })
			require.ErrorContains(t, err, "disk full")
			assert.Equal(t, ended(t, target, "save_failed"), events(t, target))
		})
		t.Run("max_hold", func(t *testing.T) {
			target := newTarget(t)
			err := blocked(t, ctx, newRunner(t, db, append(opts, gormlease.WithMaxHold(200*time.Millisecond))...), target, func() {})
			require.ErrorIs(t, err, gormlease.ErrMaxHoldExceeded)
			assert.Equal(t, ended(t, target, "max_hold"), events(t, target))
		})
		t.Run("stopped", func(t *testing.T) {
			target := newTarget(t)
			op := admin.New(newRepository(t, db)).As("bob")
			err := blocked(t, ctx, newRunner(t, db, opts...), target, func() {
				require.NoError(t, op.RequestStop(ctx, target, "enough"))
			})
			require.ErrorIs(t, err, gormlease.ErrStopRequested)
			assert.Equal(t, ended(t, target, "stopped",
				event{Kind: "stop_requested", Generation: 1, Holder: "h", Operator: "bob", Detail: "enough"}), events(t, target))
		})
		t.Run("min_hold", func(t *testing.T) {
			target := newTarget(t)
			held := newRunner(t, db, append(opts, gormlease.WithMinHold(time.Hour))...)
			_, err := held.Run(ctx, target, func(context.Context) (string, error) { return "v", nil }, gormlease.SaveJSON[string])
			require.NoError(t, err)
			_, err = held.Run(ctx, target, func(context.Context) (string, error) { return "v", nil }, gormlease.SaveJSON[string])
			require.ErrorIs(t, err, gormlease.ErrLeaseHeld, "the minimum hold")
			age(t, s, db, target, 2*time.Hour)
			_, err = held.Run(ctx, target, func(context.Context) (string, error) { return "", errors.New("nope") }, noSave(t))
			require.ErrorContains(t, err, "nope")
			assert.Equal(t, []event{
				{Kind: "acquired", Generation: 1, Holder: "h", How: "new"},
				{Kind: "saved", Generation: 1, Holder: "h"},
				{Kind: "ended", Generation: 1, Holder: "h", How: "saved"},
				{Kind: "acquired", Generation: 2, Holder: "h", How: "released", From: 1},
				{Kind: "ended", Generation: 2, Holder: "h", How: "failed", Detail: failure(t, target)},
			}, events(t, target))
		})
		t.Run("seized_and_released", func(t *testing.T) {
			target := newTarget(t)
			repo, err := gormlease.NewRepository(db, gormlease.WithHolder("h"))
			require.NoError(t, err)
			_, err = repo.Acquire(ctx, target, time.Hour)
			require.NoError(t, err)
			l := leasetest.TakeOver(t, db, target)
			require.NoError(t, leasetestRepository(t, db).Release(ctx, l))
			assert.Equal(t, []event{
				{Kind: "acquired", Generation: 1, Holder: "h", How: "new"},
				{Kind: "ended", Generation: 1, Holder: "h", How: "seized"},
				{Kind: "acquired", Generation: 2, Holder: leasetest.Holder, How: "seized", From: 1},
				{Kind: "ended", Generation: 2, Holder: leasetest.Holder, How: "released"},
			}, events(t, target))
		})
		t.Run("slot", func(t *testing.T) {
			target := newTarget(t)
			var key string
			_, err := newRunner(t, db, append(opts, gormlease.WithSlots(2))...).Run(ctx, target, func(ctx context.Context) (string, error) {
				l, _ := gormlease.LeaseFromContext(ctx)
				key = slotKey(target, l.Slot)
				return "v", nil
			}, gormlease.SaveJSON[string])
			require.NoError(t, err)
			assert.Equal(t, []event{
				{Kind: "acquired", Generation: 1, Holder: "h", How: "new"},
				{Kind: "ended", Generation: 1, Holder: "h", How: "saved"},
			}, events(t, key))
			assert.Empty(t, events(t, target), "the target's own row: SetSlots made no event")
		})
	})
}

// leasetestRepository is a Repository with the test kit's holder name.
func leasetestRepository(t *testing.T, db *gorm.DB) *gormlease.Repository {
	t.Helper()
	repo, err := gormlease.NewRepository(db, gormlease.WithHolder(leasetest.Holder))
	require.NoError(t, err)
	return repo
}

// Whether a table keeps history is its schema's: a Runner made with no
// option at all records events on a table migrated with WithHistory, and
// none on a table migrated without it, which has no event table; a
// heartbeat writes no event.
func TestHistory_DecidedBySchema(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		ctx := context.Background()
		for _, history := range []bool{true, false} {
			db := s.OpenEmpty(t, nil)
			var opts []gormlease.MigrateOption
			if history {
				opts = append(opts, gormlease.WithHistory())
			}
			require.NoError(t, gormlease.AutoMigrate(ctx, db, opts...))
			r, err := gormlease.NewRunner[string](db)
			require.NoError(t, err)
			target := newTarget(t)
			repo := r.Repository()
			l, err := repo.Acquire(ctx, target, time.Hour)
			require.NoError(t, err)
			for range 3 {
				require.NoError(t, repo.Heartbeat(ctx, l))
			}
			require.NoError(t, repo.Release(ctx, l))
			_, err = r.Run(ctx, target, func(context.Context) (string, error) { return "v", nil }, gormlease.SaveJSON[string])
			require.NoError(t, err)
			if !history {
				assert.False(t, db.Migrator().HasTable("job_lease_event"), "an event table without WithHistory")
				continue
			}
			holder := leaseRow(t, db, target).Holder
			assert.Equal(t, []event{
				{Kind: "acquired", Generation: 1, Holder: holder, How: "new"},
				{Kind: "ended", Generation: 1, Holder: holder, How: "released"},
				{Kind: "acquired", Generation: 2, Holder: holder, How: "released", From: 1},
				{Kind: "ended", Generation: 2, Holder: holder, How: "saved"},
			}, readEvents(t, db, "job_lease_event", target))
		}
	})
}

// With history kept, a full job sends the same statements as without it,
// on every database but MySQL (not MariaDB): the triggers write the events
// inside the statements that the job sends anyway. On MySQL an acquire
// reads its generation back by its token, as on any table with a trigger
// that runs a statement (see TestMySQL_TriggersOnTheLeaseTable): one
// statement more per acquire.
func TestHistory_FullJobSameStatements(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		ctx := context.Background()
		// shapes returns each statement of a job's as its first words,
		// its values left out, for each of three jobs on one target after
		// one that made its row.
		shapes := func(t *testing.T, history bool) (jobs [3][]string, events int) {
			db := s.OpenEmpty(t, nil)
			var opts []gormlease.MigrateOption
			if history {
				opts = append(opts, gormlease.WithHistory())
			}
			require.NoError(t, gormlease.AutoMigrate(ctx, db, opts...))
			rec, st := recording(db)
			r := newRunner(t, rec)
			target := newTarget(t)
			job := func() {
				_, err := r.Run(ctx, target, func(context.Context) (string, error) { return "v", nil }, gormlease.SaveJSON[string])
				require.NoError(t, err)
			}
			job()
			st.take()
			for i := range jobs {
				job()
				for _, sql := range steps(st) {
					words := strings.Fields(sql)
					jobs[i] = append(jobs[i], strings.Join(words[:min(len(words), 4)], " "))
				}
			}
			if history {
				events = len(readEvents(t, db, "job_lease_event", target))
			}
			return jobs, events
		}
		without, _ := shapes(t, false)
		with, events := shapes(t, true)
		assert.Equal(t, 8, events, "two events per job")
		for i := range with {
			if flavour(s) == "mysql" {
				assert.Len(t, with[i], len(without[i])+1, "job %d: %q against %q", i, with[i], without[i])
				continue
			}
			assert.Equal(t, without[i], with[i], "job %d's statements", i)
		}
		t.Logf("%s: %d statements a job: %q", s.Name, len(with[0]), with[0])
	})
}

// On MySQL and MariaDB, a migrating user without the TRIGGER privilege
// gets an error that names it, from AutoMigrate with WithHistory, and the
// lease table keeps working without a history.
func TestAutoMigrate_MySQLHistoryWithoutTriggerPrivilege(t *testing.T) {
	t.Parallel()
	s := testdb.MySQL(t)
	ctx := context.Background()
	cfg, err := mysqldriver.ParseDSN(s.EmptyDSN(t))
	require.NoError(t, err)
	root := s.DB(t)
	user := fmt.Sprintf("gl_notrigger_%d", os.Getpid())
	require.NoError(t, root.Exec("CREATE USER IF NOT EXISTS '"+user+"'@'%' IDENTIFIED BY 'pw'").Error)
	t.Cleanup(func() { root.Exec("DROP USER IF EXISTS '" + user + "'@'%'") })
	require.NoError(t, root.Exec("GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, ALTER, INDEX ON `"+cfg.DBName+"`.* TO '"+user+"'@'%'").Error)
	cfg.User, cfg.Passwd = user, "pw"
	db, err := gorm.Open(gormmysql.Open(cfg.FormatDSN()), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	sqlDB, err := db.DB()
	require.NoError(t, err)
	t.Cleanup(func() { sqlDB.Close() })

	err = gormlease.AutoMigrate(ctx, db, gormlease.WithHistory())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "grant the TRIGGER privilege")
	assert.Contains(t, err.Error(), "docs/operating.md")
	_, err = newRunner(t, db).Run(ctx, newTarget(t), func(context.Context) (string, error) { return "v", nil }, gormlease.SaveJSON[string])
	require.NoError(t, err, "the tables work without the history")
}

// On PostgreSQL a generation that nothing interrupts is one row of the
// event table: its acquisition stays pending in the lease row, which
// History reads, until the statement that ends it writes both events in
// one row, which History reads as two. Heartbeats write nothing. An
// operator's step while the lease is held writes the acquisition as a row
// of its own first; a lease row deleted while its acquisition is pending
// (as Prune deletes one) writes it as it goes.
func TestHistory_PostgresOneRowPerGeneration(t *testing.T) {
	t.Parallel()
	s := testdb.Postgres(t)
	ctx := context.Background()
	db := historyDB(t, s)
	target := newTarget(t)
	stored := func() int64 {
		t.Helper()
		var n int64
		require.NoError(t, db.Table("job_lease_event").Where("target_id = ?", target).Count(&n).Error)
		return n
	}
	repo, err := gormlease.NewRepository(db, gormlease.WithHolder("h"))
	require.NoError(t, err)
	op := admin.New(repo)

	l1, err := repo.Acquire(ctx, target, time.Hour)
	require.NoError(t, err)
	assert.Zero(t, stored(), "the acquisition of a new row was written at once")
	assert.Equal(t, []event{{Kind: "acquired", Generation: 1, Holder: "h", How: "new"}},
		readEvents(t, db, "job_lease_event", target), "the pending acquisition")
	require.NoError(t, repo.Release(ctx, l1))
	assert.EqualValues(t, 1, stored(), "rows for generation 1")

	// A job whose work waits for two heartbeats.
	r := newRunner(t, db, append(fast(50*time.Millisecond, 20*time.Second), gormlease.WithHolder("r"))...)
	_, err = r.Run(ctx, target, func(ctx context.Context) (string, error) {
		acquired := leaseRow(t, db, target).UpdatedAt
		waitFor(t, 10*time.Second, "two heartbeats", func() bool {
			return leaseRow(t, db, target).UpdatedAt.Sub(acquired) >= 90*time.Millisecond
		})
		return "v", nil
	}, gormlease.SaveJSON[string])
	require.NoError(t, err)
	assert.EqualValues(t, 2, stored(), "rows after generation 2, a job with heartbeats")

	_, err = repo.Acquire(ctx, target, time.Hour)
	require.NoError(t, err)
	require.NoError(t, op.As("alice").Pause(ctx, target, "deploy"))
	assert.EqualValues(t, 4, stored(), "the pause of a held lease writes its acquisition, then itself")
	require.NoError(t, op.As("alice").Resume(ctx, target))
	_, err = op.ForceRelease(ctx, target)
	require.NoError(t, err)
	assert.EqualValues(t, 6, stored(), "rows after generation 3")

	_, err = repo.Acquire(ctx, target, time.Hour) // generation 5: the forced release left the row at 4
	require.NoError(t, err)
	assert.EqualValues(t, 6, stored(), "the acquisition of a released row was written at once")
	require.NoError(t, db.Exec("DELETE FROM job_lease WHERE target_id = ?", target).Error)
	assert.EqualValues(t, 7, stored(), "the row deleted while pending")

	assert.Equal(t, []event{
		{Kind: "acquired", Generation: 1, Holder: "h", How: "new"},
		{Kind: "ended", Generation: 1, Holder: "h", How: "released"},
		{Kind: "acquired", Generation: 2, Holder: "r", How: "released", From: 1},
		{Kind: "ended", Generation: 2, Holder: "r", How: "saved"},
		{Kind: "acquired", Generation: 3, Holder: "h", How: "released", From: 2},
		{Kind: "paused", Generation: 3, Holder: "h", Operator: "alice", Detail: "deploy"},
		{Kind: "resumed", Generation: 3, Holder: "h", Operator: "alice"},
		{Kind: "ended", Generation: 3, Holder: "h", How: "forced", Detail: "released by force by an operator"},
		{Kind: "acquired", Generation: 5, Holder: "h", How: "released", From: 4},
	}, readEvents(t, db, "job_lease_event", target))
}

// On PostgreSQL a lease held when the history was turned on gets its
// record in the row (event_gen) at the first statement that calls the
// trigger's function, its first heartbeat, and later heartbeats then
// leave the function alone; its end is written as an ended event of its
// own (its acquisition was never recorded), and the next acquisition is
// pending as any other.
func TestHistory_PostgresLeaseHeldWhenHistoryBegan(t *testing.T) {
	t.Parallel()
	s := testdb.Postgres(t)
	ctx := context.Background()
	db := s.OpenEmpty(t, nil)
	require.NoError(t, gormlease.AutoMigrate(ctx, db))
	target := newTarget(t)
	repo, err := gormlease.NewRepository(db, gormlease.WithHolder("h"))
	require.NoError(t, err)
	l, err := repo.Acquire(ctx, target, time.Hour)
	require.NoError(t, err)
	require.NoError(t, gormlease.AutoMigrate(ctx, db, gormlease.WithHistory()))
	eventGen := func() *int64 {
		t.Helper()
		var g *int64
		require.NoError(t, db.Raw("SELECT event_gen FROM job_lease WHERE target_id = ?", target).Scan(&g).Error)
		return g
	}
	require.Nil(t, eventGen(), "event_gen before any statement")
	require.NoError(t, repo.Heartbeat(ctx, l))
	if g := eventGen(); assert.NotNil(t, g, "event_gen after a heartbeat") {
		assert.EqualValues(t, 1, *g)
	}
	require.NoError(t, repo.Release(ctx, l))
	_, err = repo.Acquire(ctx, target, time.Hour)
	require.NoError(t, err)
	assert.Equal(t, []event{
		{Kind: "ended", Generation: 1, Holder: "h", How: "released"},
		{Kind: "acquired", Generation: 2, Holder: "h", How: "released", From: 1},
	}, readEvents(t, db, "job_lease_event", target))
}
