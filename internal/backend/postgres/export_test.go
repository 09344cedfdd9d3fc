package postgres

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// Literal and RefusesQueries expose the simple-protocol literal and the
// recogniser of a driver's refusal to the black-box tests.
var (
	Literal        = literal
	RefusesQueries = refusesQueries
)

// ReadAnswer sends query as one simple query on conn and reads its answer
// as the backend does, its reads ended by ctx; it returns the rows
// affected.
func ReadAnswer(ctx context.Context, conn *pgconn.PgConn, query string) (int64, error) {
	conn.Frontend().Send(&pgproto3.Query{String: query})
	if err := conn.Frontend().Flush(); err != nil {
		return 0, err
	}
	var res simpleResult
	err := readAnswer(ctx, conn, &res)
	return res.n, err
}

// WatchEnded watches ctx for conn's reads as readAnswer does, waits until
// ctx has ended and the watch has set the read deadline, and stops the
// watch, as readAnswer would with its answer read whole just then.
func WatchEnded(ctx context.Context, cancel func(), conn *pgconn.PgConn) error {
	w := watch(ctx, conn)
	cancel()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		w.mu.Lock()
		set := w.deadline
		w.mu.Unlock()
		if set {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("the watch set no deadline within 10s of its context's end")
		}
	}
	w.stop()
	return nil
}
