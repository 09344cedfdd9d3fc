package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
)

// savedReport is a row of leasedemo_saves: the demo's saver appends one for
// every save that commits, so the verdict can see every save, not only the
// last one.
type savedReport struct {
	ID         string // a UUID
	TargetID   string
	Generation int64
	Tab        string
	Body       string
}

// TableName returns "leasedemo_saves".
func (savedReport) TableName() string { return "leasedemo_saves" }

// savesTable is the DDL of leasedemo_saves, the same on every database.
// Unlike gorm's AutoMigrate, it is safe to run from two demos at once on
// SQLite, where the write lock serialises it.
const savesTable = `CREATE TABLE IF NOT EXISTS leasedemo_saves (
	id          varchar(36)  NOT NULL PRIMARY KEY,
	target_id   varchar(255) NOT NULL,
	generation  bigint       NOT NULL,
	tab         varchar(255) NOT NULL,
	body        text         NOT NULL
)`

// migrateSaves creates leasedemo_saves. On PostgreSQL, two CREATE TABLE IF
// NOT EXISTS at once can fail for the one that loses: it is fine when the
// table is there afterwards.
func migrateSaves(ctx context.Context, db *gorm.DB) error {
	err := db.WithContext(ctx).Exec(savesTable).Error
	if err != nil && !db.Migrator().HasTable(&savedReport{}) {
		return fmt.Errorf("create leasedemo_saves: %w", err)
	}
	return nil
}

// story is one run of the demo on one target.
type story struct {
	cfg    config
	d      *database
	db     *gorm.DB // a direct pool, for the watcher and the verdict
	repo   *gormlease.Repository
	target string
	tl     *timeline

	winOnce    sync.Once
	won        chan struct{} // closed when the first tab wins the lease
	freezeOnce sync.Once
	frozenWho  string        // the frozen tab and its generation; set before frozen is closed
	frozen     chan struct{} // closed when the first holder freezes
	takenOver  chan struct{} // closed when a tab takes the expired lease over
	takeOnce   sync.Once
	waited     atomic.Int32 // tabs that waited for the report in the first rush
	fenced     atomic.Int32 // holders fenced off at their save
	failures   atomic.Int32 // unexpected errors
	bg         sync.WaitGroup

	mu       sync.Mutex
	reports  map[string]tabReport // the report each tab got, by tab
	apiCalls map[int64]int        // the fake API's calls, by the generation that made them
}

// tabReport is the report a tab got from Do, and whether it was shared:
// made by another tab's job.
type tabReport struct {
	body   string
	shared bool
}

func newStory(ctx context.Context, out io.Writer, cfg config, d *database) (*story, error) {
	db, err := d.gorm(d.pool)
	if err != nil {
		return nil, fmt.Errorf("open gorm: %w", err)
	}
	if err := gormlease.AutoMigrate(ctx, db); err != nil {
		return nil, err
	}
	if err := migrateSaves(ctx, db); err != nil {
		return nil, err
	}
	repo, err := gormlease.NewRepository(db)
	if err != nil {
		return nil, err
	}
	return &story{
		cfg:       cfg,
		d:         d,
		db:        db,
		repo:      repo,
		target:    "report/user-42/" + uuid.NewString()[:8],
		tl:        &timeline{out: out},
		won:       make(chan struct{}),
		frozen:    make(chan struct{}),
		takenOver: make(chan struct{}),
		reports:   map[string]tabReport{},
		apiCalls:  map[int64]int{},
	}, nil
}

// play acts out the story and then checks the verdict.
func (s *story) play(ctx context.Context) error {
	c := s.cfg
	fmt.Fprintf(s.tl.out, "leasedemo: %d browser tabs ask at once for the same slow report\n", c.tabs)
	fmt.Fprintf(s.tl.out, "  database  %s\n", s.d.about)
	fmt.Fprintf(s.tl.out, "  lease     heartbeat every %v; taken over after %v without one\n", c.interval, c.timeout)
	fmt.Fprintf(s.tl.out, "  tabs      each in a process of its own, calling gormlease's Runner.Do\n")
	fmt.Fprintf(s.tl.out, "  API       answers in %v\n", c.latency)
	fmt.Fprintf(s.tl.out, "  target    %s\n", s.target)
	fmt.Fprintf(s.tl.out, "  times     seconds since the start; a heartbeat's is the database's own (job_lease.updated_at)\n\n")

	// The start on both clocks: the demo's, for what the tabs do, and the
	// database's, for the heartbeats it records. Read in this order, a
	// heartbeat's time since the start on the database's clock is never
	// later than on the demo's.
	s.tl.start = time.Now()
	dbStart, err := s.d.now(ctx)
	if err != nil {
		return err
	}
	stopWatch := s.watch(ctx, dbStart)
	start := make(chan struct{})
	var rush, reload sync.WaitGroup
	for i := 1; i <= c.tabs; i++ {
		rush.Go(func() {
			<-start
			s.request(ctx, i, false)
		})
	}
	close(start)
	rushDone := make(chan struct{})
	reload.Go(func() { s.reload(ctx, c.tabs+1, rushDone) })
	rush.Wait()
	close(rushDone)
	reload.Wait()
	s.bg.Wait()
	stopWatch()
	return s.verdict(ctx)
}

func tabName(tab int) string { return fmt.Sprintf("tab %d", tab) }

// request is one tab's request: Do the report. The tab that wins the
// lease makes it; the others wait for it and get the saved report. A
// reload comes after the holder froze.
func (s *story) request(ctx context.Context, tab int, reload bool) {
	who := tabName(tab)
	conn, err := newStallable(s.d)
	if err != nil {
		s.fail(who, err)
		return
	}
	defer conn.close()
	db, err := s.d.gorm(conn)
	if err != nil {
		s.fail(who, err)
		return
	}
	r, err := gormlease.NewRunner[string](db,
		gormlease.WithHeartbeatInterval(s.cfg.interval),
		gormlease.WithLeaseTimeout(s.cfg.timeout),
		gormlease.WithHolder(who),
		// A report saved in the last minute is the page's answer: a tab
		// that asks after the save, as a slow reload may, gets it too.
		gormlease.WithReuseFor(time.Minute),
		// The commit of a frozen tab waits for it to thaw, longer than the
		// default 10 s would allow with long settings.
		gormlease.WithOperationTimeout(time.Minute+2*s.cfg.timeout))
	if err != nil {
		s.fail(who, err)
		return
	}
	if !reload {
		s.tl.log(who, "asks for the report")
	}
	asked := time.Now()
	var generation int64
	var worked atomic.Bool
	type outcome struct {
		report string
		shared bool
		err    error
	}
	done := make(chan outcome, 1)
	go func() {
		report, shared, err := r.Do(ctx, s.target, func(ctx context.Context) (string, error) {
			worked.Store(true)
			l, _ := gormlease.LeaseFromContext(ctx)
			generation = l.Generation
			return s.work(ctx, who, l, conn)
		}, s.save(who), s.load)
		done <- outcome{report, shared, err}
	}()
	// Another tab holds the lease: in the rush once one has won it; for a
	// reload, the frozen tab, whose lease has not timed out yet.
	held := s.won
	if reload {
		held = s.frozen
	}
	var o outcome
	select {
	case o = <-done:
	case <-held:
		select {
		case o = <-done:
		default:
			if !worked.Load() {
				if reload {
					s.tl.log(who, "waits too: the frozen tab's lease has not timed out yet")
				} else {
					s.waited.Add(1)
					s.tl.log(who, "waits for the report in progress, holding no connection; shows \"in progress\"")
				}
			}
			o = <-done
		}
	}
	switch {
	case o.err == nil && o.shared:
		s.got(who, o.report, true)
		s.tl.log(who, "gets the shared report after %.1fs: %q", time.Since(asked).Seconds(), o.report)
	case o.err == nil:
		s.got(who, o.report, false)
		s.tl.log(who, "saved its report and released the lease (generation %d)", generation)
	case errors.Is(o.err, gormlease.ErrLeaseLost):
		s.fenced.Add(1)
		s.tl.log(who, "FENCED OFF by the database: %v", o.err)
		s.tl.log(who, "its stale result is discarded; nothing was written")
	default:
		s.fail(who, o.err)
	}
}

// got records the report that who got.
func (s *story) got(who, report string, shared bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reports[who] = tabReport{body: report, shared: shared}
}

// work is the slow part of a request: the external API call. The first
// holder to get its answer then freezes, before it can save.
func (s *story) work(ctx context.Context, who string, l gormlease.Lease, conn *stallable) (string, error) {
	select {
	case <-s.won:
		// Any lease after the first is a takeover of an expired one: the
		// first holder releases only with its save, after which the others
		// load the report. It is usually the frozen tab's; on a machine that
		// stalls the first holder's process for longer than the lease
		// timeout before it freezes, it is taken over all the same.
		s.tl.log(who, "TAKES OVER the expired lease: generation %d; calls the API, %v", l.Generation, s.cfg.latency)
		s.takeOnce.Do(func() { close(s.takenOver) })
	default:
		s.tl.log(who, "wins the lease: generation %d; calls the API, %v", l.Generation, s.cfg.latency)
		s.winOnce.Do(func() { close(s.won) })
	}
	s.mu.Lock()
	s.apiCalls[l.Generation]++
	s.mu.Unlock()
	select {
	case <-time.After(s.cfg.latency):
	case <-ctx.Done():
		return "", context.Cause(ctx)
	}
	report := fmt.Sprintf("report for user 42, made by %s under generation %d", who, l.Generation)
	s.freezeOnce.Do(func() {
		s.frozenWho = fmt.Sprintf("%s (generation %d)", who, l.Generation)
		conn.freeze() // after a heartbeat on its way has landed
		s.tl.log(who, "gets the API answer, then FREEZES before saving (simulated stall: no heartbeats, no database calls)")
		close(s.frozen)
		s.bg.Go(func() { s.thawLater(ctx, who, conn) })
	})
	return report, nil
}

// thawLater wakes the frozen tab one interval after another tab took its
// lease over (or, if none does, after long enough for the verdict to fail).
func (s *story) thawLater(ctx context.Context, who string, conn *stallable) {
	frozenAt := time.Now()
	select {
	case <-s.takenOver:
		time.Sleep(s.cfg.interval)
	case <-time.After(3*s.cfg.timeout + 2*s.cfg.latency):
	case <-ctx.Done():
	}
	s.tl.log(who, "wakes up after %.1fs frozen, and tries to save its result", time.Since(frozenAt).Seconds())
	conn.thaw()
}

// reload is the request that comes once the holder is frozen: the user
// reloads the page, half an interval later, while the frozen tab's lease
// is still live. When the first requests are all over (rushDone) and none
// froze, the story went wrong, and there is nothing to reload for.
func (s *story) reload(ctx context.Context, tab int, rushDone <-chan struct{}) {
	who := tabName(tab)
	select {
	case <-s.frozen:
	case <-rushDone:
		s.fail(who, errors.New("the holder never froze"))
		return
	case <-ctx.Done():
		return
	}
	select {
	case <-time.After(s.cfg.interval / 2):
	case <-ctx.Done():
		return
	}
	s.tl.log(who, "the user reloads the page: one more request for the report")
	s.request(ctx, tab, true)
}

// save is the saver of a tab: it appends to leasedemo_saves and stores the
// result with gormlease.SaveJSON, inside the fenced commit.
func (s *story) save(who string) func(tx *gorm.DB, report string) error {
	return func(tx *gorm.DB, report string) error {
		l, _ := gormlease.LeaseFromContext(tx.Statement.Context)
		row := savedReport{ID: uuid.NewString(), TargetID: s.target, Generation: l.Generation, Tab: who, Body: report}
		if err := tx.Create(&row).Error; err != nil {
			return err
		}
		return gormlease.SaveJSON(tx, report)
	}
}

// load is the loader of the tabs that waited: it reads back what SaveJSON
// stored, in the transaction that Do gives it.
func (s *story) load(tx *gorm.DB) (string, error) {
	report, _, err := gormlease.LoadJSON[string](tx.Statement.Context, tx, s.target)
	return report, err
}

// watch prints each heartbeat that the database records, at the time the
// database recorded it (dbStart is the story's start on the database's
// clock), until the returned function is called. After each look at the
// database, it lets the timeline print its lines up to lag before the look:
// a heartbeat stamped that long before has committed, so it was seen, and
// takes its place among them.
func (s *story) watch(ctx context.Context, dbStart time.Time) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	lag := max(s.cfg.interval/2, 250*time.Millisecond)
	go func() {
		defer close(done)
		var last gormlease.JobLease
		tick := time.NewTicker(s.cfg.interval / 5)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			looked := s.tl.now()
			row, ok, err := admin.New(s.repo).Get(ctx, s.target)
			if err != nil {
				continue
			}
			if ok && row.Generation == last.Generation && row.ReleasedAt == nil && row.UpdatedAt.After(last.UpdatedAt) {
				s.tl.logAt(row.UpdatedAt.Sub(dbStart), "db", "heartbeat from %s renews generation %d", row.Holder, row.Generation)
			}
			if ok {
				last = row
			}
			s.tl.release(looked - lag)
		}
	}()
	return func() {
		cancel()
		<-done
		s.tl.release(math.MaxInt64)
	}
}

func (s *story) fail(who string, err error) {
	s.failures.Add(1)
	s.tl.log(who, "ERROR: %v", err)
}

// verdict reads the outcome from the database and checks the invariant:
// exactly one saved result, written by the holder of the current (last)
// generation, and nothing saved by a stale holder; every tab that got a
// report got that saved one; and the external API was called once per
// generation, as the fake API counted its calls.
func (s *story) verdict(ctx context.Context) error {
	lease, ok, err := admin.New(s.repo).Get(ctx, s.target)
	if err != nil {
		return err
	}
	if !ok {
		return s.judge([]string{"no lease row"}, "")
	}
	var saves []savedReport
	if err := s.db.WithContext(ctx).Where("target_id = ?", s.target).Order("generation").Find(&saves).Error; err != nil {
		return fmt.Errorf("read leasedemo_saves: %w", err)
	}
	var problems []string
	if len(saves) != 1 {
		problems = append(problems, fmt.Sprintf("%d saved results, want 1", len(saves)))
	}
	for _, sv := range saves {
		switch {
		case sv.Generation != lease.Generation:
			problems = append(problems, fmt.Sprintf("a stale holder saved: %s under generation %d, the current is %d",
				sv.Tab, sv.Generation, lease.Generation))
		case sv.Tab != lease.Holder:
			problems = append(problems, fmt.Sprintf("saved by %s, but generation %d is held by %s",
				sv.Tab, lease.Generation, lease.Holder))
		}
	}
	saved, res, err := gormlease.LoadJSON[string](ctx, s.db, s.target)
	if err != nil {
		problems = append(problems, fmt.Sprintf("job_result: %v", err))
	} else if res.Generation != lease.Generation {
		problems = append(problems, fmt.Sprintf("job_result holds generation %d, the current is %d",
			res.Generation, lease.Generation))
	}
	if lease.ReleasedAt == nil {
		problems = append(problems, "the lease is still held")
	}
	if n := s.waited.Load(); int(n) != s.cfg.tabs-1 {
		problems = append(problems, fmt.Sprintf("%d of %d tabs waited in the rush, want %d", n, s.cfg.tabs, s.cfg.tabs-1))
	}
	if s.fenced.Load() != 1 {
		problems = append(problems, "the frozen tab was not fenced off")
	}
	s.mu.Lock()
	problems = append(problems, s.checkReports(saved, lease.Holder)...)
	problems = append(problems, s.checkAPICalls(lease.Generation)...)
	nReports := len(s.reports)
	s.mu.Unlock()
	if n := s.failures.Load(); n > 0 {
		problems = append(problems, fmt.Sprintf("%d unexpected errors (above)", n))
	}
	summary := fmt.Sprintf("1 saved result, by %s under generation %d, the current one; "+
		"nothing saved by the stale holder %s; all %d other tabs got that same report; "+
		"the API was called once per generation (%d calls)",
		lease.Holder, lease.Generation, s.frozenWho, nReports, lease.Generation)
	return s.judge(problems, summary)
}

// checkReports says what is wrong with the reports that the tabs got: each
// tab but the frozen one, the reload included, must have got the saved
// report, and only its maker, holder, as its own. The caller holds s.mu.
func (s *story) checkReports(saved, holder string) []string {
	var problems []string
	if want := s.cfg.tabs; len(s.reports) != want {
		problems = append(problems, fmt.Sprintf("%d tabs got a report, want %d (all but the frozen one)", len(s.reports), want))
	}
	for _, who := range slices.Sorted(maps.Keys(s.reports)) {
		r := s.reports[who]
		switch {
		case r.body != saved:
			problems = append(problems, fmt.Sprintf("%s got %q, but the database holds %q", who, r.body, saved))
		case r.shared == (who == holder):
			problems = append(problems, fmt.Sprintf("%s got the report with shared %v, but %s made it", who, r.shared, holder))
		}
	}
	return problems
}

// checkAPICalls says what is wrong with the fake API's calls: one by each
// generation up to current, none by another. The caller holds s.mu.
func (s *story) checkAPICalls(current int64) []string {
	var problems []string
	for _, g := range slices.Sorted(maps.Keys(s.apiCalls)) {
		if g < 1 || g > current {
			problems = append(problems, fmt.Sprintf("the API was called under generation %d, which the lease row never had", g))
		}
	}
	for g := int64(1); g <= current; g++ {
		if n := s.apiCalls[g]; n != 1 {
			problems = append(problems, fmt.Sprintf("generation %d called the API %d times, want once", g, n))
		}
	}
	return problems
}

// judge prints the verdict line, and returns an error wrapping errVerdict
// when there are problems.
func (s *story) judge(problems []string, summary string) error {
	fmt.Fprintln(s.tl.out)
	if len(problems) > 0 {
		fmt.Fprintf(s.tl.out, "VERDICT FAILED (read from the database): %s\n", strings.Join(problems, "; "))
		return fmt.Errorf("%w: %s", errVerdict, strings.Join(problems, "; "))
	}
	fmt.Fprintf(s.tl.out, "VERDICT OK (read from the database): %s\n", summary)
	return nil
}

// timeline prints events in the order they happened, each with its time
// since start. It holds the lines back until release, since the
// database's heartbeats are seen a while after they happen.
type timeline struct {
	mu      sync.Mutex
	out     io.Writer
	start   time.Time
	pending []event // sorted by at
}

// event is a line of the timeline.
type event struct {
	at   time.Duration // since the start
	who  string
	what string
}

// now is the time since the start.
func (t *timeline) now() time.Duration { return time.Since(t.start) }

// log adds an event that happens now.
func (t *timeline) log(who, format string, args ...any) {
	t.logAt(t.now(), who, format, args...)
}

// logAt adds an event that happened at.
func (t *timeline) logAt(at time.Duration, who, format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.add(event{at: at, who: who, what: fmt.Sprintf(format, args...)})
}

// add inserts e after the events that happened no later than it.
func (t *timeline) add(e event) {
	i := sort.Search(len(t.pending), func(i int) bool { return t.pending[i].at > e.at })
	t.pending = slices.Insert(t.pending, i, e)
}

// release prints the events that happened no later than until.
func (t *timeline) release(until time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for ; n < len(t.pending) && t.pending[n].at <= until; n++ {
		e := t.pending[n]
		fmt.Fprintf(t.out, "%6.2fs  %-6s  %s\n", e.at.Seconds(), e.who, e.what)
	}
	t.pending = slices.Delete(t.pending, 0, n)
}
