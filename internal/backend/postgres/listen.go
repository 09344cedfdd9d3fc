package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease/internal/backend"
)

// listenPing is how long Listen waits for a notification before it checks
// that its connection still answers.
const listenPing = 15 * time.Second

// Listen opens a connection of its own, outside db's pool, with the
// settings of the pool's connections, so that waiting takes no connection
// from the application's pool, however small. It listens on Channel and
// reports each notification until ctx is done or the connection fails,
// then closes the connection. It does not listen through a connection
// pooler such as PgBouncer, nor with a driver other than pgx: it returns
// backend.ErrCannotListen then.
func (b *Backend) Listen(ctx context.Context, db *gorm.DB, ready func(), notified func(table, targetID string)) error {
	cfg, err := b.connConfig(ctx, db)
	if err != nil {
		return err
	}
	pc, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pc.Close(context.WithoutCancel(ctx))
	if _, err := pc.Exec(ctx, "LISTEN "+Channel); err != nil {
		return err
	}
	ready()
	for {
		wctx, cancel := context.WithTimeout(ctx, listenPing)
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
			if table, target, ok := strings.Cut(n.Payload, " "); ok {
				notified(table, target)
			}
		}
	}
}

// connConfig returns the settings of db's pool's connections, borrowing one
// of them, for a moment, the first time.
func (b *Backend) connConfig(ctx context.Context, db *gorm.DB) (*pgx.ConnConfig, error) {
	b.mu.Lock()
	cfg := b.config
	b.mu.Unlock()
	if cfg != nil {
		return cfg.Copy(), nil
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, backend.ErrCannotListen
	}
	conn, err := sqlDB.Conn(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	err = conn.Raw(func(dc any) error {
		c, ok := dc.(interface{ Conn() *pgx.Conn })
		if !ok {
			return fmt.Errorf("%w: the driver is not pgx", backend.ErrCannotListen)
		}
		own, err := ownSession(ctx, c.Conn())
		if err != nil {
			return err
		}
		if !own {
			return fmt.Errorf("%w: the connections go through a pooler", backend.ErrCannotListen)
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
	b.mu.Lock()
	b.config = cfg
	b.mu.Unlock()
	return cfg.Copy(), nil
}

// ownSession reports whether pc's statements run in the PostgreSQL session
// that pc opened: whether the server process that answers is the one that
// pc's connection announced. A connection pooler such as PgBouncer announces
// a process of its own, and runs the statements on its server connections.
// Through one, a LISTEN must not run: in transaction pooling it succeeds on
// whichever server connection ran it, and stays there when PgBouncer hands
// that connection to other clients, which then receive the notifications,
// while the listener receives none and would claim to listen; in session
// pooling it would hold one of PgBouncer's server connections, outside the
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
