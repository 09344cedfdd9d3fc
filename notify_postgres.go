package gormlease

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgNotifyChannel is the channel on which the statements that end a
// waited-for generation notify, with the lease table's name and the
// target, separated by a space, as the payload.
const pgNotifyChannel = "gormlease"

const (
	// listenerPing is how long the listener waits for a notification before
	// it checks that its connection still answers.
	listenerPing = 15 * time.Second
	// listenerRetry is the first pause before the listener connects again
	// after a failure; it doubles, with jitter, up to listenerMaxRetry.
	listenerRetry    = 50 * time.Millisecond
	listenerMaxRetry = 5 * time.Second
)

// errNoListen says that the pool cannot receive notifications: its driver
// is not pgx (lib/pq, for one), or its connections go through a pooler.
// Its hub's waiters then only poll.
var errNoListen = errors.New("cannot listen")

// pgListener receives, on PostgreSQL with pgx, the notifications that wake
// one hub's watches. It has one connection of its own, outside the pool:
// it opens it, with the settings of the pool's connections, when somebody
// in the process starts waiting on the pool, and closes it when the last
// one stops. So waiting takes no connection from the application's pool,
// however small. It does not listen through a connection pooler such as
// PgBouncer (see ownSession). When the connection fails it connects again, with
// backoff; each time it has started listening it wakes every watch, since
// it may have missed notifications meanwhile. The watches poll in any case.
type pgListener struct {
	hub   *hub
	ready atomic.Bool

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
	config *pgx.ConnConfig // the pool's connection settings, once read
}

// newPGListener returns the listener for h, or nil when h's pool is not
// PostgreSQL.
func newPGListener(h *hub) *pgListener {
	if _, ok := h.repo.dialect.(postgresDialect); !ok {
		return nil
	}
	return &pgListener{hub: h}
}

// listening reports whether l receives notifications now.
func (l *pgListener) listening() bool { return l != nil && l.ready.Load() }

// start starts l's goroutine.
func (l *pgListener) start() {
	l.mu.Lock()
	defer l.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel, l.done = cancel, make(chan struct{})
	go l.run(ctx)
}

// stop stops l's goroutine and waits for it; its connection is closed.
func (l *pgListener) stop() {
	l.mu.Lock()
	cancel, done := l.cancel, l.done
	l.mu.Unlock()
	cancel()
	<-done
}

// run listens until ctx is cancelled, connecting again after failures.
func (l *pgListener) run(ctx context.Context) {
	defer close(l.done)
	b := backoff{pause: listenerRetry, max: listenerMaxRetry}
	for {
		err := l.listen(ctx)
		l.ready.Store(false)
		if ctx.Err() != nil || errors.Is(err, errNoListen) || !b.wait(ctx) {
			return
		}
	}
}

// listen opens the listener's connection, listens on it and dispatches
// notifications until ctx is cancelled or the connection fails; then it
// closes the connection.
func (l *pgListener) listen(ctx context.Context) error {
	cfg, err := l.connConfig(ctx)
	if err != nil {
		return err
	}
	pc, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pc.Close(context.WithoutCancel(ctx))
	return l.receive(ctx, pc)
}

// connConfig returns the settings of the pool's connections, borrowing one
// of them, for a moment, the first time.
func (l *pgListener) connConfig(ctx context.Context) (*pgx.ConnConfig, error) {
	l.mu.Lock()
	cfg := l.config
	l.mu.Unlock()
	if cfg != nil {
		return cfg.Copy(), nil
	}
	sqlDB, err := l.hub.repo.db.DB()
	if err != nil {
		return nil, errNoListen
	}
	conn, err := sqlDB.Conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	err = conn.Raw(func(dc any) error {
		c, ok := dc.(interface{ Conn() *pgx.Conn })
		if !ok {
			return fmt.Errorf("%w: the driver is not pgx", errNoListen)
		}
		own, err := ownSession(ctx, c.Conn())
		if err != nil {
			return err
		}
		if !own {
			return fmt.Errorf("%w: the connections go through a pooler", errNoListen)
		}
		cfg = c.Conn().Config().Copy()
		// The copy would hand notifications to the pool connection's buffer:
		// the listener's connection must keep its own.
		cfg.OnNotification = nil
		return nil
	})
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	l.config = cfg
	l.mu.Unlock()
	return cfg.Copy(), nil
}

// ownSession reports whether pc's statements run in the PostgreSQL session
// that pc opened: whether the server process that answers is the one that
// pc's connection announced. A connection pooler such as PgBouncer announces
// a process of its own, and runs the statements on its server connections.
// Through one, a LISTEN must not run: in transaction pooling it succeeds on
// whichever server connection ran it, and stays there when PgBouncer hands
// that connection to other clients, which then receive the notifications
// (pgx keeps them in memory until the connection closes), while the
// listener receives none and would claim to listen; in session pooling it
// would hold one of PgBouncer's server connections, outside the
// application's pool, for as long as somebody waits. The statement runs in
// the simple protocol, which every query mode and pooler accept.
func ownSession(ctx context.Context, pc *pgx.Conn) (bool, error) {
	res, err := pc.PgConn().Exec(ctx, "SELECT pg_backend_pid()").ReadAll()
	if err != nil {
		return false, err
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 1 {
		return false, errors.New("pg_backend_pid: no answer")
	}
	pid, err := strconv.ParseUint(string(res[0].Rows[0][0]), 10, 32)
	if err != nil {
		return false, fmt.Errorf("pg_backend_pid: %w", err)
	}
	return uint32(pid) == pc.PgConn().PID(), nil
}

// receive listens on pc and wakes the hub's watches as notifications come.
func (l *pgListener) receive(ctx context.Context, pc *pgx.Conn) error {
	if _, err := pc.Exec(ctx, "LISTEN "+pgNotifyChannel); err != nil {
		return err
	}
	l.ready.Store(true)
	l.hub.listenerReady()
	for {
		wctx, cancel := context.WithTimeout(ctx, listenerPing)
		n, err := pc.WaitForNotification(wctx)
		quiet := wctx.Err() != nil
		cancel()
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil && quiet:
			// Nothing came for a while: check that the connection is alive.
			if err := pc.Ping(ctx); err != nil {
				return err
			}
		case err != nil:
			return err
		case n == nil:
			return errors.New("notification lost by the driver")
		default:
			// Every table's notifications come on the channel: this
			// hub's Repository has one.
			if table, target, ok := strings.Cut(n.Payload, " "); ok && table == l.hub.repo.tables.lease {
				l.hub.wakeTarget(target)
			}
		}
	}
}
