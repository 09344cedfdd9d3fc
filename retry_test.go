package gormlease_test

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// The drivers' own error values: which are serialization failures, retried,
// and which are the server's answer, as opposed to a lost connection.
// (TestFault_MySQLDeadlockIsRetried and TestFault_StrictIsolation* meet
// them on the servers.)
func TestErrorClassifiers(t *testing.T) {
	t.Parallel()
	state := func(s string) (b [5]byte) { copy(b[:], s); return b }
	deadlock := &mysql.MySQLError{Number: 1213, SQLState: state("40001"), Message: "Deadlock found when trying to get lock"}
	cases := []struct {
		name            string
		err             error
		retry, answered bool
	}{
		{"MySQLDeadlock", deadlock, true, true},
		{"MySQLDeadlockWithoutSQLState", &mysql.MySQLError{Number: 1213}, true, true},
		{"MySQLSQLState40001", &mysql.MySQLError{Number: 3101, SQLState: state("40001")}, true, true},
		{"MariaDBSnapshotConflict", &mysql.MySQLError{Number: 1020, SQLState: state("HY000")}, true, true},
		{"TiDBWriteConflict", &mysql.MySQLError{Number: 9007, SQLState: state("HY000")}, true, true},
		{"MySQLDuplicateKey", &mysql.MySQLError{Number: 1062, SQLState: state("23000")}, false, true},
		{"MySQLLockWaitTimeout", &mysql.MySQLError{Number: 1205, SQLState: state("HY000")}, false, true},
		{"MySQLWrapped", fmt.Errorf("take over: %w", deadlock), true, true},
		{"MySQLJoined", errors.Join(errors.New("other"), deadlock), true, true},
		{"PostgresSerialization", &pgconn.PgError{Code: "40001"}, true, true},
		{"PostgresDeadlock", fmt.Errorf("x: %w", &pgconn.PgError{Code: "40P01"}), true, true},
		{"PostgresUniqueViolation", &pgconn.PgError{Code: "23505"}, false, true},
		{"Cancelled", context.Canceled, false, false},
		{"BadConnection", driver.ErrBadConn, false, false},
		{"MySQLConnectionLost", mysql.ErrInvalidConn, false, false},
	}
	for _, tc := range cases {
		assert.Equal(t, tc.retry, gormlease.IsSerializationFailure(tc.err), "%s: serialization failure", tc.name)
		assert.Equal(t, tc.answered, gormlease.AnsweredByServer(tc.err), "%s: answered by the server", tc.name)
	}
}

// An acquire that the server answered with an error (here: there is no
// table) took nothing, so it releases nothing after: only an acquire whose
// answer was lost may have taken the lease unknown to anyone (see
// TestFault_AcquireAnswerLost). On MySQL, the driver's *MySQLError is such
// an answer, although it has no SQLState method.
func TestAcquire_AnsweredFailureReleasesNothing(t *testing.T) {
	t.Parallel()
	eachServerDB(t, func(t *testing.T, s *testdb.Server, _ *gorm.DB) {
		db, st := recording(s.OpenEmpty(t, nil))
		repo := newRepository(t, db)
		_, err := repo.Acquire(context.Background(), newTarget(t), time.Minute)
		require.Error(t, err)
		assert.NotErrorIs(t, err, gormlease.ErrLeaseHeld)
		for _, sql := range st.take() {
			assert.NotContains(t, sql, "SET released_at", "a release after an answered acquire")
		}
		assert.Equal(t, 1, strings.Count(err.Error(), "gormlease:"), err.Error())
	})
}
