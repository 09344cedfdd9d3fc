package gormlease

import (
	"context"
	"database/sql"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Waiting. A caller that waits for a target (Runner.RunWait, Runner.Do)
// watches the target's lease row until the generation it waits for ends.
// All callers in one process that wait for the same target on the same
// pool and table (and gorm logger: see hubKey) share one watch: one goroutine that reads the row, publishes what it
// read, and sleeps until it is woken or its poll comes due. The watch
// starts with its first waiter and is stopped, and awaited, by its last;
// it holds no connection between its reads.
//
// A watch is woken three ways:
//   - in-process: a release or a fenced commit of this process, on the same
//     pool and table, wakes the target's watch at once (wakeWaiters);
//   - by notification, on PostgreSQL: one listener per hub (see
//     pgListener) receives the notifications that ending a waited-for
//     generation sends, and wakes the target's watch;
//   - by poll: after each read it sleeps for a jittered pause (0.4 to 0.9
//     of a base that doubles from a quarter of the heartbeat interval up to
//     the interval, and starts again from a quarter after every change; four
//     intervals once the row is marked for notifications and the listener
//     listens). Without notifications (MySQL, SQLite, PgBouncer or another
//     pooler, lib/pq) a waiter so learns of the end within one interval; a
//     notification lost on a marked row delays it by four at most. Nothing
//     strands it.

// leaseState is a lease row as a waiter reads it, with ages on the
// database's clock.
type leaseState struct {
	found      bool
	generation int64
	released   bool
	// savedGeneration is the last generation that saved a result, 0 when
	// none did; savedAge is the time since then, when one did.
	savedGeneration int64
	savedAge        time.Duration
	// failure is the failure that the generation was released with, if any.
	failure string
	// age is the time since the last acquire or heartbeat.
	age time.Duration
	// waiting reports whether the row is marked as waited on (PostgreSQL).
	waiting bool
	// timeout is the lease timeout that the generation's holder recorded,
	// 0 when the row records none.
	timeout time.Duration
}

// live reports whether the generation that st shows is held and not
// expired, judged, as the acquire judges it, by the timeout its holder
// recorded, or by fallback when the row records none.
func (st leaseState) live(fallback time.Duration) bool {
	timeout := st.timeout
	if timeout <= 0 {
		timeout = fallback
	}
	return st.found && !st.released && st.age <= timeout
}

// readState reads targetID's row, as a waiter needs it.
func (r *Repository) readState(ctx context.Context, targetID string) (leaseState, error) {
	var (
		st            leaseState
		failure       sql.NullString
		age, savedAge sql.NullFloat64
		timeoutMS     sql.NullInt64
	)
	found, err := queryRowSQL(ctx, r.db, r.dialect.stateSQL(), []any{targetID},
		&st.generation, &st.released, &st.savedGeneration, &failure, &age, &savedAge, &st.waiting, &timeoutMS)
	if err != nil || !found {
		return leaseState{}, err
	}
	st.found = true
	st.failure = failure.String
	st.timeout = time.Duration(timeoutMS.Int64) * time.Millisecond
	st.age = seconds(age.Float64)
	st.savedAge = -1
	if savedAge.Valid {
		st.savedAge = seconds(savedAge.Float64)
	}
	return st, nil
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// maxFailureLength is how much of a failed job's error its lease row keeps,
// in bytes, for the callers that waited for the job.
const maxFailureLength = 255

// failureText is the text that a lease row keeps of err, the error a job
// failed with: its message, without the package's prefix, cut to
// maxFailureLength bytes. It is kept short on purpose. It travels to other
// callers, possibly other users' requests, in other processes, where its
// types are lost anyway: it is there to say what went wrong, not to carry
// the holder's error; that stays with the holder, whose Run returns it.
func failureText(err error) string {
	msg := strings.TrimPrefix(err.Error(), "gormlease: ")
	msg = strings.ReplaceAll(msg, "\x00", "")
	if len(msg) > maxFailureLength {
		msg = truncateUTF8(msg, maxFailureLength-3) + "..."
	}
	if msg == "" {
		msg = "failed"
	}
	return msg
}

// hubKey says which waiters may share watches: those that read the same
// table on the same pool, and report the reads to the same gorm logger.
type hubKey struct {
	pool   any // the pool, or for a pool that cannot be a map key its Repository
	logger any // gorm's logger, or for one that cannot be a map key that Repository
	table  string
}

// keyOf returns the hubKey of repo's waiters.
func keyOf(repo *Repository) hubKey {
	k := hubKey{pool: repo.db.ConnPool, logger: repo.db.Logger, table: repo.tables.lease}
	if t := reflect.TypeOf(k.pool); t == nil || !t.Comparable() {
		k.pool = repo
	}
	if t := reflect.TypeOf(k.logger); t != nil && !t.Comparable() {
		k.logger = repo
	}
	return k
}

// hub holds the watches of the waiters of one hubKey, by target, and its
// listener where there is one. Its reads go through the Repository of the
// waiter that started it: any of them reads the same rows the same way.
type hub struct {
	key      hubKey
	repo     *Repository
	watches  map[string]*watch
	listener *pgListener // nil but on PostgreSQL
}

// hubs holds the hubs that have watches; its mutex also guards every hub's
// watches and every watch's subscribers and settings.
var hubs = struct {
	sync.Mutex
	m map[hubKey]*hub
}{m: map[hubKey]*hub{}}

// watching counts the live watches of the process, for the tests' leak
// checks, and so that a release with no waiter skips its hub's mutex.
var watching atomic.Int64

// watch follows one lease row for the callers that wait on it.
type watch struct {
	hub    *hub
	target string
	subs   int
	// maxPause is the longest pause between polls, and readTimeout bounds
	// each read: the shortest heartbeat interval, and operation timeout, of
	// the subscribers, so that each waiter is served at least as its own
	// settings ask.
	maxPause, readTimeout time.Duration
	wake                  chan struct{} // buffered: a wake-up is never lost, never blocks
	// listening is signalled, like wake, when the hub's listener starts
	// listening.
	listening chan struct{}

	mu      sync.Mutex
	state   leaseState
	read    bool          // state was read at least once
	changed chan struct{} // closed, and replaced, at every read

	cancel context.CancelFunc
	done   chan struct{}
}

// subscribe joins the watch on targetID's row of repo, starting it when
// there is none, with polls at most interval apart and reads bounded by
// readTimeout. A new watch starts from initial, the row as the caller just
// read it, when given, rather than read it again. Call unsubscribe when
// done waiting.
func subscribe(repo *Repository, targetID string, interval, readTimeout time.Duration, initial *leaseState) *watch {
	hubs.Lock()
	defer hubs.Unlock()
	k := keyOf(repo)
	h := hubs.m[k]
	if h == nil {
		h = &hub{key: k, repo: repo, watches: map[string]*watch{}}
		h.listener = newPGListener(h)
		hubs.m[k] = h
	}
	w := h.watches[targetID]
	if w == nil {
		ctx, cancel := context.WithCancel(context.Background())
		w = &watch{hub: h, target: targetID, maxPause: interval, readTimeout: readTimeout,
			wake: make(chan struct{}, 1), listening: make(chan struct{}, 1),
			changed: make(chan struct{}), cancel: cancel, done: make(chan struct{})}
		h.watches[targetID] = w
		watching.Add(1)
		if len(h.watches) == 1 && h.listener != nil {
			h.listener.start()
		}
		if initial != nil {
			w.state, w.read = *initial, true
		}
		go w.loop(ctx, initial)
	}
	w.subs++
	w.maxPause = min(w.maxPause, interval)
	w.readTimeout = min(w.readTimeout, readTimeout)
	return w
}

// unsubscribe leaves the watch. The last subscriber stops the watch, and
// the hub's listener when it was the hub's last watch, and waits for them.
func (w *watch) unsubscribe() {
	hubs.Lock()
	w.subs--
	if w.subs > 0 {
		hubs.Unlock()
		return
	}
	h := w.hub
	delete(h.watches, w.target)
	watching.Add(-1)
	var l *pgListener
	if len(h.watches) == 0 {
		delete(hubs.m, h.key)
		l = h.listener
	}
	hubs.Unlock()
	w.cancel()
	<-w.done
	if l != nil {
		l.stop()
	}
}

// current returns the last state read, whether there was one, and a
// channel that is closed at the next read.
func (w *watch) current() (leaseState, bool, <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.state, w.read, w.changed
}

// poke makes the watch read the row again now.
func (w *watch) poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// next waits until the watch reads the row again, or ctx is done.
func (w *watch) next(ctx context.Context, changed <-chan struct{}) error {
	select {
	case <-changed:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// notifiedPolls is how many heartbeat intervals apart a watch polls a row
// that is marked as waited on while the listener listens: the notification
// will wake it, and the poll only covers a notification that is lost.
const notifiedPolls = 4

// loop reads the row until ctx is cancelled: at once (unless initial,
// read by the first subscriber, is given), then whenever it is woken or its
// poll comes due. When the listener (re)starts listening it marks the row
// as waited on instead of reading it: a mark that finds the generation
// still live guarantees a notification when it ends.
func (w *watch) loop(ctx context.Context, initial *leaseState) {
	defer close(w.done)
	h := w.hub
	hubs.Lock()
	maxPause, readTimeout := w.maxPause, w.readTimeout
	hubs.Unlock()
	pause := maxPause / 4
	var last leaseState
	read := true
	if initial != nil {
		last, read = *initial, false // subscribe published it
	}
	for {
		if read {
			rctx, cancel := context.WithTimeout(ctx, readTimeout)
			st, err := h.repo.readState(rctx, w.target)
			cancel()
			if ctx.Err() != nil {
				return
			}
			if err == nil {
				if st.generation != last.generation || st.released != last.released ||
					st.savedGeneration != last.savedGeneration {
					pause = maxPause / 4
				}
				last = st
				w.publish(st)
			}
		}
		if ended := h.markWaiting(ctx, w, &last); ended {
			read = true // the generation ended since the row was read
			continue
		}
		wait := pause
		if last.waiting && h.listener.listening() {
			wait = notifiedPolls * maxPause
		}
		// Jittered between 0.4 and 0.9 of wait, so that a waiter woken by
		// a poll has read the row, and loaded its result, within wait.
		t := time.NewTimer(wait*2/5 + rand.N(wait/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-w.wake:
			t.Stop()
			read = true
		case <-w.listening:
			// The listener listens again: notifications may have been lost
			// meanwhile, on a row marked before; an unmarked row gets the
			// mark, which checks it.
			t.Stop()
			read = last.waiting
		case <-t.C:
			read = true
		}
		hubs.Lock()
		maxPause, readTimeout = w.maxPause, w.readTimeout
		hubs.Unlock()
		pause = min(2*pause, maxPause)
	}
}

// publish makes st the watch's state and tells the subscribers.
func (w *watch) publish(st leaseState) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.state, w.read = st, true
	close(w.changed)
	w.changed = make(chan struct{})
}

// wakeWaiters wakes the watch on targetID's row of repo's table, if this
// process has one: a release or fenced commit through repo just ended or
// saved its generation.
func wakeWaiters(repo *Repository, targetID string) {
	if watching.Load() == 0 {
		return
	}
	hubs.Lock()
	defer hubs.Unlock()
	if h := hubs.m[keyOf(repo)]; h != nil {
		if w := h.watches[targetID]; w != nil {
			w.poke()
		}
	}
}

// listenerReady tells every watch of h that its listener has just started
// listening, and notifications sent before may have been missed.
func (h *hub) listenerReady() {
	hubs.Lock()
	defer hubs.Unlock()
	for _, w := range h.watches {
		select {
		case w.listening <- struct{}{}:
		default:
		}
	}
}

// wakeTarget wakes h's watch on target's row, if there is one.
func (h *hub) wakeTarget(target string) {
	hubs.Lock()
	defer hubs.Unlock()
	if w := h.watches[target]; w != nil {
		w.poke()
	}
}

// markWaiting marks the row that w read as *st as waited on, when it shows
// a live generation not marked yet and h's listener listens, so that the
// statement that ends the generation notifies (PostgreSQL only). It
// reports whether the mark found that generation ended.
func (h *hub) markWaiting(ctx context.Context, w *watch, st *leaseState) (ended bool) {
	if h.listener == nil || !st.found || st.released || st.waiting || !h.listener.listening() {
		return false
	}
	d, ok := h.repo.dialect.(postgresDialect)
	if !ok {
		return false
	}
	_, n, err := execSQL(ctx, h.repo.db, d.markWaitingSQL(), w.target, st.generation)
	if err != nil {
		return false // the polls go on
	}
	st.waiting = n == 1
	return n == 0
}
