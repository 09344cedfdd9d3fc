package recipes_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/testdb"
	"github.com/gormlease/gormlease/leasetest"
	"github.com/gormlease/gormlease/observe"
)

// TestMain runs the tests; goroutine leaks fail the run (testdb.Main).
func TestMain(m *testing.M) { testdb.Main(m) }

// fast are lease settings for the tests: a heartbeat every 200ms, a 2s
// timeout, which a loaded machine keeps.
func fast(opts ...gormlease.Option) []gormlease.Option {
	return append([]gormlease.Option{gormlease.WithHeartbeatInterval(200 * time.Millisecond),
		gormlease.WithLeaseTimeout(2 * time.Second)}, opts...)
}

func newTarget(t *testing.T) string { return fmt.Sprintf("%s-%s", t.Name(), uuid.NewString()[:8]) }

// eachDB runs fn as a parallel subtest on PostgreSQL, MariaDB and SQLite.
func eachDB(t *testing.T, fn func(t *testing.T, s *testdb.Server, db *gorm.DB)) {
	t.Helper()
	for _, s := range testdb.All(t) {
		t.Run(s.Name, func(t *testing.T) {
			t.Parallel()
			fn(t, s, s.DB(t))
		})
	}
}

// refusals is an Observer that counts the acquires refused because the
// target was held: each is a caller that now waits, snoozes or skips.
type refusals struct {
	n    atomic.Int64
	wake chan struct{}
}

func newRefusals() *refusals { return &refusals{wake: make(chan struct{}, 1)} }

func (r *refusals) Start(ctx context.Context, _ observe.Span) (context.Context, func(error)) {
	return ctx, func(error) {}
}

func (r *refusals) Record(_ context.Context, e observe.Event) {
	if e.Kind == observe.EventAcquire && errors.Is(e.Err, gormlease.ErrLeaseHeld) {
		r.n.Add(1)
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
}

// waitFor waits until at least n acquires were refused.
func (r *refusals) waitFor(t *testing.T, n int64) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for r.n.Load() < n {
		select {
		case <-r.wake:
		case <-deadline:
			t.Fatalf("%d acquires refused in 20s, want %d", r.n.Load(), n)
		}
	}
}

// inFlight tracks how many calls are inside a section at once.
type inFlight struct{ now, most atomic.Int64 }

func (f *inFlight) enter() {
	n := f.now.Add(1)
	for m := f.most.Load(); n > m && !f.most.CompareAndSwap(m, n); m = f.most.Load() {
	}
}

func (f *inFlight) leave() { f.now.Add(-1) }

func newRunner[T any](t *testing.T, db *gorm.DB, opts ...gormlease.Option) *gormlease.Runner[T] {
	t.Helper()
	r, err := gormlease.NewRunner[T](db, fast(opts...)...)
	require.NoError(t, err)
	return r
}

// nestedRefusals are the refusals that a job's own code meets when it
// calls Run on another target: held by another holder, or paused by an
// operator. Each prepares that other target on db.
var nestedRefusals = []struct {
	name    string
	prepare func(t *testing.T, db *gorm.DB, other string)
}{
	{"Held", func(t *testing.T, db *gorm.DB, other string) { leasetest.Occupy(t, db, other) }},
	{"Paused", func(t *testing.T, db *gorm.DB, other string) {
		repo, err := gormlease.NewRepository(db)
		require.NoError(t, err)
		require.NoError(t, admin.New(repo).Pause(context.Background(), other, "maintenance"))
	}},
}

// nestedArgs is a job whose own code calls Run on the target Other, held
// or paused, and fails with that refusal: it returns it, or, with Panic,
// panics with it. The job runs under the lease of Target.
type nestedArgs struct {
	Name   string `json:"name"`
	Target string `json:"target"`
	Other  string `json:"other"`
	Panic  bool   `json:"panic"`
}

func (nestedArgs) Kind() string { return "nested" }

// nestedJobs returns the jobs of a test of nested refusals, their other
// targets prepared on db: for each of nestedRefusals, one that returns the
// refusal and one that panics with it, each with a target of its own.
func nestedJobs(t *testing.T, db *gorm.DB) []nestedArgs {
	t.Helper()
	var jobs []nestedArgs
	for _, nested := range nestedRefusals {
		other := newTarget(t)
		nested.prepare(t, db, other)
		for _, panics := range []bool{false, true} {
			name := nested.name + map[bool]string{false: "Returned", true: "Panicked"}[panics]
			jobs = append(jobs, nestedArgs{Name: name, Target: newTarget(t), Other: other, Panic: panics})
		}
	}
	return jobs
}

// run is the job's own code: it calls runner.Run on a.Other and fails
// with its refusal.
func (a nestedArgs) run(ctx context.Context, runner *gormlease.Runner[struct{}]) error {
	_, err := runner.Run(ctx, a.Other, func(context.Context) (struct{}, error) { return struct{}{}, nil },
		func(*gorm.DB, struct{}) error { return nil })
	if err == nil {
		return fmt.Errorf("%s: Run on %q was not refused", a.Name, a.Other)
	}
	if a.Panic {
		panic(err)
	}
	return err
}
