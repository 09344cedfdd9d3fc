// Package wait watches the lease rows that callers wait on (RunWait, Do),
// holding no connection while they wait: it owns the watch goroutines and
// the notification listeners, and their lifetimes are all here.
//
// All callers in one process that wait for the same target of the same Key
// share one watch: one goroutine that reads the row, publishes what it
// read, and sleeps until it is woken or its poll comes due. The watch starts
// with its first waiter and is stopped, and awaited, by its last; it holds
// no connection between its reads.
//
// A watch is woken three ways:
//   - in-process: a release or a fenced commit of this process, on the same
//     Key, wakes the target's watch at once (Wake);
//   - by notification, where the backend has them: one listener per hub
//     receives the notifications that ending a waited-for generation sends,
//     and wakes the target's watch;
//   - by poll: after each read it sleeps for a jittered pause (0.4 to 0.9
//     of a base that doubles from a quarter of the heartbeat interval up to
//     the interval, and starts again from a quarter after every change; four
//     intervals once the row is marked for notifications and the listener
//     listens). Without notifications a waiter so learns of the end within
//     one interval; a notification lost on a marked row delays it by four at
//     most. Nothing strands it.
package wait

import (
	"context"
	"errors"
	"math/rand/v2"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/gormlease/gormlease/internal/backend"
)

// Key says which waiters may share watches: those that read the same table
// on the same pool, and report the reads to the same gorm logger. Pool and
// Logger must be comparable.
type Key struct {
	Pool, Logger any
	Table        string
}

// Source is what a hub reads its rows through: any waiter's of one Key
// reads the same rows the same way.
type Source struct {
	Backend backend.Backend
	DB      *gorm.DB
}

// hub holds the watches of one Key, by target, and its listener where the
// backend has notifications.
type hub struct {
	key      Key
	src      Source
	watches  map[string]*Watch
	listener *listener // nil without notifications
}

// hubs holds the hubs that have watches; its mutex also guards every hub's
// watches and every watch's subscribers and settings.
var hubs = struct {
	sync.Mutex
	m map[Key]*hub
}{m: map[Key]*hub{}}

// watching counts the live watches of the process, so that a release with
// no waiter skips the hubs' mutex.
var watching atomic.Int64

// Watching returns the number of live watches of the process: zero
// whenever no caller waits on a row.
func Watching() int64 { return watching.Load() }

// notifiedPolls is how many heartbeat intervals apart a watch polls a row
// that is marked as waited on while the listener listens: the notification
// will wake it, and the poll only covers a notification that is lost.
const notifiedPolls = 4

// Watch follows one lease row for the callers that wait on it.
type Watch struct {
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
	state   backend.State
	read    bool          // state was read at least once
	changed chan struct{} // closed, and replaced, at every read
	// err is the error of the last read, when it failed in a way that
	// waiting cannot cure (a closed pool, a missing table): the waiters
	// stop waiting with it.
	err error

	cancel context.CancelFunc
	done   chan struct{}
}

// Subscribe joins the watch on targetID's row of k, starting it when there
// is none, with polls at most interval apart and reads bounded by
// readTimeout. A new watch starts from initial, the row as the caller just
// read it, when given, rather than read it again. Call Unsubscribe when
// done waiting.
func Subscribe(k Key, src Source, targetID string, interval, readTimeout time.Duration, initial *backend.State) *Watch {
	hubs.Lock()
	defer hubs.Unlock()
	h := hubs.m[k]
	if h == nil {
		h = &hub{key: k, src: src, watches: map[string]*Watch{}}
		if src.Backend.Capabilities().Notify {
			h.listener = &listener{hub: h}
		}
		hubs.m[k] = h
	}
	w := h.watches[targetID]
	if w == nil {
		ctx, cancel := context.WithCancel(context.Background())
		w = &Watch{hub: h, target: targetID, maxPause: interval, readTimeout: readTimeout,
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

// Unsubscribe leaves the watch. The last subscriber stops the watch, and
// the hub's listener when it was the hub's last watch, and waits for them.
func (w *Watch) Unsubscribe() {
	hubs.Lock()
	w.subs--
	if w.subs > 0 {
		hubs.Unlock()
		return
	}
	h := w.hub
	delete(h.watches, w.target)
	watching.Add(-1)
	var l *listener
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

// Current returns the last state read, whether there was one, and a channel
// that is closed at the next read.
func (w *Watch) Current() (backend.State, bool, <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.state, w.read, w.changed
}

// Poke makes the watch read the row again now.
func (w *Watch) Poke() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// Next waits until the watch reads the row again after changed, or ctx is
// done. It returns the read's error when the read failed in a way that
// waiting cannot cure (see Err).
func (w *Watch) Next(ctx context.Context, changed <-chan struct{}) error {
	select {
	case <-changed:
		return w.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Err returns the error of the watch's last read when it failed in a way
// that waiting cannot cure (a closed pool, a missing table, a permission),
// and nil otherwise: a read that could not reach the database is simply
// tried again at the next poll.
func (w *Watch) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// NextAny waits until one of the watches whose channels changed are, as
// Current returned them, reads its row again, and returns its index; or
// until ctx is done.
func NextAny(ctx context.Context, changed []<-chan struct{}) (int, error) {
	cases := make([]reflect.SelectCase, len(changed)+1)
	cases[0] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())}
	for i, c := range changed {
		cases[i+1] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(c)}
	}
	chosen, _, _ := reflect.Select(cases)
	if chosen == 0 {
		return 0, ctx.Err()
	}
	return chosen - 1, nil
}

// loop reads the row until ctx is cancelled: at once (unless initial, read
// by the first subscriber, is given), then whenever it is woken or its poll
// comes due. When the listener (re)starts listening it marks the row as
// waited on instead of reading it: a mark that finds the generation still
// live guarantees a notification when it ends.
func (w *Watch) loop(ctx context.Context, initial *backend.State) {
	defer close(w.done)
	h := w.hub
	hubs.Lock()
	maxPause, readTimeout := w.maxPause, w.readTimeout
	hubs.Unlock()
	pause := maxPause / 4
	var last backend.State
	read := true
	if initial != nil {
		last, read = *initial, false // Subscribe published it
	}
	for {
		if read {
			rctx, cancel := context.WithTimeout(ctx, readTimeout)
			st, err := h.src.Backend.State(rctx, h.src.DB, w.target)
			st.Read = time.Now()
			cancel()
			if ctx.Err() != nil {
				return
			}
			switch {
			case err == nil:
				if st.Generation != last.Generation || st.Released != last.Released ||
					st.SavedGeneration != last.SavedGeneration || st.Paused != last.Paused {
					pause = maxPause / 4
				}
				last = st
				w.publish(st, nil)
			case !backend.Unreachable(err):
				w.publish(last, err)
			}
		}
		if ended := h.markWaiting(ctx, w, &last, readTimeout); ended {
			read = true // the generation ended since the row was read
			continue
		}
		wait := pause
		if last.Waiting && h.listener.listens() {
			wait = notifiedPolls * maxPause
		}
		// Jittered between 0.4 and 0.9 of wait, so that a waiter woken by a
		// poll has read the row, and loaded its result, within wait.
		sleep := wait*2/5 + rand.N(wait/2+1)
		// A live generation expires, unless renewed, when the timeout its
		// holder recorded has passed since its last heartbeat: read it
		// again then, so that the waiters of a holder that died take over
		// at once, rather than at their next poll (no notification tells
		// of an expiry).
		if d, ok := untilExpiry(last); ok && d < sleep {
			sleep = d
		}
		t := time.NewTimer(sleep)
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
			read = last.Waiting
		case <-t.C:
			read = true
		}
		hubs.Lock()
		maxPause, readTimeout = w.maxPause, w.readTimeout
		hubs.Unlock()
		pause = min(2*pause, maxPause)
	}
}

// expirySlack is how long after a lease's expiry, by the age a watch read,
// the watch reads the row again: the database must see it expired.
const expirySlack = 5 * time.Millisecond

// untilExpiry returns how long from the read of st its live generation has
// until it expires, when st shows one, live, that records its timeout. A
// row already expired when read gets the ordinary polls: its waiters take
// it over, and the watch must not spin while they try.
func untilExpiry(st backend.State) (time.Duration, bool) {
	if !st.Found || st.Released || st.Timeout <= 0 || st.Age > st.Timeout {
		return 0, false
	}
	return st.Timeout - st.Age + expirySlack, true
}

// publish makes st the watch's state, and err the error of the read that
// waiting cannot cure (nil after a read that worked), and tells the
// subscribers.
func (w *Watch) publish(st backend.State, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.state, w.err = st, err
	w.read = w.read || err == nil
	close(w.changed)
	w.changed = make(chan struct{})
}

// Wake wakes the watch on targetID's row of k, if this process has one: a
// release or fenced commit just ended or saved its generation.
func Wake(k Key, targetID string) {
	if watching.Load() == 0 {
		return
	}
	hubs.Lock()
	defer hubs.Unlock()
	if h := hubs.m[k]; h != nil {
		if w := h.watches[targetID]; w != nil {
			w.Poke()
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

// notified wakes h's watch on target's row of table, if it is h's table
// and there is one.
func (h *hub) notified(table, target string) {
	if table != h.key.Table {
		return
	}
	hubs.Lock()
	defer hubs.Unlock()
	if w := h.watches[target]; w != nil {
		w.Poke()
	}
}

// markWaiting marks the row that w read as *st as waited on, when it shows
// a live generation, or a paused target, not marked yet and h's listener
// listens, so that the
// statement that ends the generation notifies. The statement is bounded by
// timeout, as the reads are. It reports whether the mark found that
// generation ended.
func (h *hub) markWaiting(ctx context.Context, w *Watch, st *backend.State, timeout time.Duration) (ended bool) {
	if !h.listener.listens() || !st.Found || (st.Released && !st.Paused) || st.Waiting {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	marked, ended, err := h.src.Backend.MarkWaiting(ctx, h.src.DB, w.target, st.Generation)
	if err != nil {
		return false // the polls go on
	}
	st.Waiting = marked
	return ended
}

// Listening reports whether this process has a listener on the pool of
// db that listens now: its waiters on that pool are woken by
// notifications, and poll only to cover a lost one.
func Listening(db *gorm.DB) bool {
	hubs.Lock()
	defer hubs.Unlock()
	for _, h := range hubs.m {
		if h.src.DB.ConnPool == db.ConnPool && h.listener.listens() {
			return true
		}
	}
	return false
}

// Report describes one watch of a lease row.
type Report struct {
	// Subscribers is the number of waiters that share the watch.
	Subscribers int
	// State is the row as the watch last read it, when Read is true.
	State backend.State
	Read  bool
}

// Watches reports the watches of this process on target's row of the
// lease table table: one for each pool whose waiters watch it.
func Watches(table, target string) []Report {
	hubs.Lock()
	defer hubs.Unlock()
	var out []Report
	for _, h := range hubs.m {
		if w := h.watches[target]; w != nil && h.key.Table == table {
			st, read, _ := w.Current()
			out = append(out, Report{Subscribers: w.subs, State: st, Read: read})
		}
	}
	return out
}

const (
	// listenerRetry is the first pause before the listener connects again
	// after a failure; it doubles, with jitter, up to listenerMaxRetry.
	listenerRetry    = 50 * time.Millisecond
	listenerMaxRetry = 5 * time.Second
)

// listener receives, through the backend's Listen, the notifications that
// wake one hub's watches. It runs while the hub has watches; when its
// connection fails it connects again, with backoff, and each time it has
// started listening it wakes every watch, since it may have missed
// notifications meanwhile. The watches poll in any case.
type listener struct {
	hub   *hub
	ready atomic.Bool

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// listens reports whether l receives notifications now.
func (l *listener) listens() bool { return l != nil && l.ready.Load() }

// start starts l's goroutine.
func (l *listener) start() {
	l.mu.Lock()
	defer l.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel, l.done = cancel, make(chan struct{})
	go l.run(ctx)
}

// stop stops l's goroutine and waits for it; its connection is closed.
func (l *listener) stop() {
	l.mu.Lock()
	cancel, done := l.cancel, l.done
	l.mu.Unlock()
	cancel()
	<-done
}

// run listens until ctx is cancelled, connecting again after failures, or
// until the backend says the pool cannot listen.
func (l *listener) run(ctx context.Context) {
	defer close(l.done)
	b := backend.Backoff{Pause: listenerRetry, Max: listenerMaxRetry}
	src := l.hub.src
	for {
		err := src.Backend.Listen(ctx, src.DB, func() {
			l.ready.Store(true)
			l.hub.listenerReady()
		}, l.hub.notified)
		l.ready.Store(false)
		if ctx.Err() != nil || errors.Is(err, backend.ErrCannotListen) || !b.Wait(ctx) {
			return
		}
	}
}
