package gormlease_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
)

// The fuzz targets feed arbitrary target IDs, results and option values
// through the public API. Every input must either work end to end or be
// refused with an error wrapping ErrInvalidArgument that writes nothing;
// nothing may panic and nothing may be left half written. Their seed corpus
// is in testdata/fuzz and runs in every plain go test; to fuzz, run for
// instance:
//
//	go test -run='^$' -fuzz=FuzzRun_TargetAndResult -fuzztime=60s
//
// The fuzz targets do not run in parallel with other tests, so the row
// counts they compare are theirs alone (and each fuzz worker process has a
// schema of its own).

// FuzzRun_TargetAndResult runs the work for any target ID and saves any
// string result with SaveJSON.
func FuzzRun_TargetAndResult(f *testing.F) {
	f.Add("order-42", "done")
	s := testdb.Postgres(f)
	db := s.DB(f)
	r, err := gormlease.NewRunner[string](db)
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, target, result string) {
		before := tableCounts(t, db)
		got, err := r.Run(context.Background(), target, func(ctx context.Context) (string, error) {
			return result, nil
		}, gormlease.SaveJSON[string])
		if err != nil {
			require.ErrorIs(t, err, gormlease.ErrInvalidArgument, "target %q, result %q", target, result)
			if strings.Contains(err.Error(), "SaveJSON") {
				// A result that cannot be stored is refused by the saver,
				// after the work ran: nothing saved, and the lease released.
				var saved []gormlease.JobResult
				require.NoError(t, db.Where("target_id = ? AND generation = ?", target,
					leaseRow(t, db, target).Generation).Find(&saved).Error)
				assert.Empty(t, saved, "result saved")
				assert.NotNil(t, leaseRow(t, db, target).ReleasedAt, "lease left held")
				return
			}
			assert.Equal(t, before, tableCounts(t, db), "a refused Run wrote rows")
			return
		}
		assert.Equal(t, result, got)
		loaded, row, err := gormlease.LoadJSON[string](context.Background(), db, target)
		require.NoError(t, err)
		// JSON stores text as valid UTF-8: invalid bytes come back as U+FFFD.
		assert.Equal(t, []rune(string([]rune(result))), []rune(loaded))
		lease := leaseRow(t, db, target)
		assert.Equal(t, lease.Generation, row.Generation)
		assert.NotNil(t, lease.ReleasedAt, "lease left held")
		assert.True(t, utf8.ValidString(target))
	})
}

// FuzzNewRunner_Options builds a Runner from any option values, and runs
// instant work with every Runner it accepts.
func FuzzNewRunner_Options(f *testing.F) {
	f.Add(int64(30*time.Second), int64(2*time.Minute), int64(0), int64(10*time.Second), "worker-1")
	s := testdb.Postgres(f)
	db := s.DB(f)
	f.Fuzz(func(t *testing.T, interval, timeout, margin, operation int64, holder string) {
		opts := []gormlease.Option{
			gormlease.WithHeartbeatInterval(time.Duration(interval)),
			gormlease.WithLeaseTimeout(time.Duration(timeout)),
			gormlease.WithOperationTimeout(time.Duration(operation)),
			gormlease.WithHolder(holder),
		}
		if margin != 0 {
			opts = append(opts, gormlease.WithSafetyMargin(time.Duration(margin)))
		}
		r, err := gormlease.NewRunner[string](db, opts...)
		if err != nil {
			require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
			return
		}
		if time.Duration(operation) < 100*time.Millisecond {
			// Valid, but too short for any database call to finish: the
			// calls fail with a deadline, which says nothing about safety.
			return
		}
		target := newTarget(t)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err = r.Run(ctx, target, func(context.Context) (string, error) { return "ok", nil },
			func(tx *gorm.DB, v string) error { return gormlease.SaveJSON(tx, v) })
		saved := countRows(t, db, &gormlease.JobResult{}, target)
		switch {
		case err == nil:
			assert.EqualValues(t, 1, saved)
		case errors.Is(err, gormlease.ErrLeaseLost):
			// A trust window shorter than a round trip fences the work at
			// once: a clear refusal, with nothing saved.
			assert.Zero(t, saved)
		default:
			t.Fatalf("options %v %v %v %v %q: %v", interval, timeout, margin, operation, holder, err)
		}
		if lease := leaseRow(t, db, target); lease.ReleasedAt == nil {
			t.Errorf("lease left held: %+v", lease)
		}
	})
}

// tableCounts counts the rows of both tables.
func tableCounts(t *testing.T, db *gorm.DB) [2]int64 {
	t.Helper()
	var c [2]int64
	require.NoError(t, db.Model(&gormlease.JobLease{}).Count(&c[0]).Error)
	require.NoError(t, db.Model(&gormlease.JobResult{}).Count(&c[1]).Error)
	return c
}

// FuzzRepository_ForgedLease hands Heartbeat, CommitIfOwner and Release a
// Lease that Acquire never returned: any target ID, token and generation,
// next to a real lease on a target of the same name when the ID is valid.
// Each step must refuse with ErrInvalidArgument or ErrLeaseLost, never call
// the saver, and never change the real lease.
func FuzzRepository_ForgedLease(f *testing.F) {
	f.Add("order-42", []byte("0123456789abcdef"), int64(1))
	s := testdb.Postgres(f)
	db := s.DB(f)
	repo, err := gormlease.NewRepository(db)
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, target string, token []byte, generation int64) {
		forged := gormlease.Lease{TargetID: target, Generation: generation}
		copy(forged.Token[:], token)
		held, err := repo.Acquire(context.Background(), target, time.Hour)
		if err != nil {
			require.ErrorIs(t, err, gormlease.ErrInvalidArgument)
		} else {
			defer repo.Release(context.Background(), held)
			if forged.Token == held.Token {
				return // a forger that guessed the token is the holder
			}
		}
		var before gormlease.JobLease
		if err == nil {
			before = leaseRow(t, db, target)
		}
		check := func(step string, err error) {
			if !errors.Is(err, gormlease.ErrInvalidArgument) && !errors.Is(err, gormlease.ErrLeaseLost) {
				t.Fatalf("%s with a forged lease %+v: %v", step, forged, err)
			}
		}
		check("heartbeat", repo.Heartbeat(context.Background(), forged))
		check("commit", repo.CommitIfOwner(context.Background(), forged, func(*gorm.DB) error {
			t.Fatal("the saver ran for a forged lease")
			return nil
		}))
		check("release", repo.Release(context.Background(), forged))
		if err == nil {
			assert.Equal(t, before, leaseRow(t, db, target), "a forged lease changed the real one")
		}
	})
}
