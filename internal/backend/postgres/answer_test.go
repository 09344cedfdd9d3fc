package postgres_test

import (
	"context"
	"database/sql/driver"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gormlease/gormlease/internal/backend/postgres"
	"github.com/gormlease/gormlease/internal/testdb"
)

// connect opens a connection of its own to the test server.
func connect(t *testing.T) *pgconn.PgConn {
	t.Helper()
	s := testdb.Postgres(t)
	s.DB(t)
	conn, err := pgconn.Connect(context.Background(), s.DSN)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// A context that ends while an answer is read ends the read at once, as
// an error of the connection (the rest of the answer is still on its way,
// so database/sql closes it), and the statement is cancelled on the
// server.
func TestReadAnswer_EndsWithItsContext(t *testing.T) {
	t.Parallel()
	conn := connect(t)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	_, err := postgres.ReadAnswer(ctx, conn, "SELECT pg_sleep(60)")
	require.Error(t, err)
	assert.ErrorIs(t, err, driver.ErrBadConn)
	assert.ErrorIs(t, err, context.Canceled, "the error does not say that the context ended")
	assert.Less(t, time.Since(start), 30*time.Second, "the read outlived its context")
	// The statement was cancelled: its backend is no longer running it.
	other := connect(t)
	require.Eventually(t, func() bool {
		res := other.ExecParams(context.Background(),
			"SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND state = 'active'",
			[][]byte{[]byte(strconv.Itoa(int(conn.PID())))}, nil, nil, nil).Read()
		return res.Err == nil && len(res.Rows) == 0
	}, 20*time.Second, 20*time.Millisecond, "pg_sleep still runs")
}

// When the context ends just as an answer has been read whole, the
// connection's read deadline that ended the reads is cleared: the
// connection answers the next statement.
func TestReadAnswer_ConnectionOutlivesAContextEndedAfterTheAnswer(t *testing.T) {
	t.Parallel()
	conn := connect(t)
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, postgres.WatchEnded(ctx, cancel, conn))
	n, err := postgres.ReadAnswer(context.Background(), conn, "SELECT 1 FROM generate_series(1, 3)")
	require.NoError(t, err, "the ended watch left its deadline on the connection")
	assert.EqualValues(t, 3, n)
}
