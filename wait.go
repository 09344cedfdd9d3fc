package gormlease

import (
	"context"
	"database/sql"
	"strings"
	"time"

	"github.com/gormlease/gormlease/internal/backend"
	"github.com/gormlease/gormlease/internal/wait"
)

// Waiting, for RunWait and Do: their callers watch the target's row through
// internal/wait, which shares one watch among the callers of the process
// that wait on the same row, and wakes it by notification, by poll, or at
// once when this process ends or saves the generation (wake).

// watch joins the watch on targetID's row, with polls at most the Runner's
// heartbeat interval apart and reads bounded by its operation timeout.
// initial, when given, is the row as the caller just read it.
func (r *Runner[T]) watch(targetID string, initial *backend.State) *wait.Watch {
	return wait.Subscribe(r.repo.waitKey, r.repo.waitSource(), targetID, r.cfg.heartbeatInterval,
		r.cfg.operationTimeout, initial)
}

// wake wakes the watch on the row of lease in this process, if there is
// one: the Runner just ended or saved its generation.
func (r *Runner[T]) wake(lease Lease) { wait.Wake(r.repo.waitKey, lease.row().TargetID) }

// readState reads targetID's row as a waiter needs it, within the
// operation timeout, as the watch's reads are. sent is when the statement
// was sent: on gorm's plain *sql.DB pool, after the read took its
// connection, so that neither a wait for a free connection nor a new
// connection's dial (nor database/sql's attempts on other connections after
// one that broke) comes between sent and the database's answer; on any
// other pool, before the read began.
func (r *Runner[T]) readState(ctx context.Context, targetID string) (st backend.State, sent time.Time, err error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.operationTimeout)
	defer cancel()
	db := r.repo.db
	if pool, ok := db.Statement.ConnPool.(*sql.DB); ok {
		conn, err := pool.Conn(ctx)
		if err != nil {
			return backend.State{}, time.Now(), err
		}
		defer conn.Close()
		db = backend.Session(ctx, db, conn)
	}
	sent = time.Now()
	st, err = r.repo.backend.State(ctx, db, targetID)
	st.Read = time.Now()
	return st, sent, err
}

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
