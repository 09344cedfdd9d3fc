package gormlease_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease/internal/testdb"
)

// A target whose ID holds a single quote is written into the text of the
// PostgreSQL statements that carry literals (the batched heartbeat, the
// fenced commit's one-query BEGIN) in a form that the server reads whatever
// its settings: with backslash_quote off, which refuses a quote escaped by
// a backslash, the lease is renewed and the result saved, and so are those
// of the other leases that share its heartbeat batch.
func TestRun_QuoteInTargetUnderBackslashQuoteOff(t *testing.T) {
	t.Parallel()
	s := testdb.Postgres(t)
	db := s.Open(t, map[string]string{"backslash_quote": "off"})
	r := newRunner(t, db, fast(100*time.Millisecond, 2*time.Second)...)
	suffix := uuid.NewString()[:8]
	targets := []string{"o'brien-" + suffix, `back\slash'-` + suffix, "plain-" + suffix}
	var wg sync.WaitGroup
	errs := make(chan error, len(targets))
	for _, target := range targets {
		wg.Go(func() {
			_, err := r.Run(context.Background(), target, func(ctx context.Context) (string, error) {
				return "done", waitRenewals(ctx, s.DB(t), target, 2)
			}, func(tx *gorm.DB, v string) error { return nil })
			if err != nil {
				err = errors.Join(errors.New(target), err)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// waitRenewals returns once target's row has been renewed n times since it
// was first read, or an error when 10 s pass first or ctx ends.
func waitRenewals(ctx context.Context, db *gorm.DB, target string, n int) error {
	deadline := time.Now().Add(10 * time.Second)
	var last time.Time
	for seen := -1; seen < n; {
		var at time.Time
		if err := db.WithContext(ctx).Raw("SELECT updated_at FROM job_lease WHERE target_id = ?", target).Row().Scan(&at); err != nil {
			return err
		}
		if !at.Equal(last) {
			seen, last = seen+1, at
			continue
		}
		if time.Now().After(deadline) {
			return errors.New("the lease was not renewed within 10s")
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}
