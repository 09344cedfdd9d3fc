package gormlease_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/testdb"
	"github.com/gormlease/gormlease/leasetest"
)

// nestedRefusals are the ways a work meets a refusal of a lease of its own:
// it calls Run on another target, which another holder holds, or which an
// operator paused. Each prepares the other target on db.
var nestedRefusals = []struct {
	name    string
	prepare func(t *testing.T, db *gorm.DB, other string)
	is      error
}{
	{"Held", func(t *testing.T, db *gorm.DB, other string) { leasetest.Occupy(t, db, other) }, gormlease.ErrLeaseHeld},
	{"Paused", func(t *testing.T, db *gorm.DB, other string) {
		repo, err := gormlease.NewRepository(db)
		require.NoError(t, err)
		require.NoError(t, admin.New(repo).Pause(context.Background(), other, "maintenance"))
	}, gormlease.ErrPaused},
}

// eachNestedRefusal runs fn as a parallel subtest for each of
// nestedRefusals on every database, with a target of its own and the other
// target, prepared; is is the sentinel that the inner refusal matches.
func eachNestedRefusal(t *testing.T, fn func(t *testing.T, db *gorm.DB, target, other string, is error)) {
	t.Helper()
	for _, nested := range nestedRefusals {
		t.Run(nested.name, func(t *testing.T) {
			t.Parallel()
			eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
				target, other := newTarget(t), newTarget(t)
				nested.prepare(t, db, other)
				fn(t, db, target, other, nested.is)
			})
		})
	}
}

// nestedWork returns a work that runs r.Run on other, counts its calls in
// runs, and returns that Run's error: a refusal, when other is held or
// paused.
func nestedWork(r *gormlease.Runner[string], other string, runs *atomic.Int32) func(context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		runs.Add(1)
		return r.Run(ctx, other, func(context.Context) (string, error) { return "inner", nil }, gormlease.SaveJSON[string])
	}
}

// nestedPanic is nestedWork, except that it panics with the refusal.
func nestedPanic(r *gormlease.Runner[string], other string, runs *atomic.Int32) func(context.Context) (string, error) {
	work := nestedWork(r, other, runs)
	return func(ctx context.Context) (string, error) {
		if _, err := work(ctx); err != nil {
			panic(err)
		}
		return "", nil
	}
}

// A work that panics with a refusal it met ends RunWait's call with a
// *PanicError that matches neither ErrLeaseHeld nor ErrPaused.
func TestRunWait_WorkPanickingWithARefusalRunsOnce(t *testing.T) {
	t.Parallel()
	eachNestedRefusal(t, func(t *testing.T, db *gorm.DB, target, other string, is error) {
		r := newRunner(t, db, fast(100*time.Millisecond, time.Second)...)
		var runs atomic.Int32
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, err := r.RunWait(ctx, target, nestedPanic(r, other, &runs), gormlease.SaveJSON[string])
		require.NoError(t, ctx.Err(), "RunWait ran until its context ended (%d runs)", runs.Load())
		assert.EqualValues(t, 1, runs.Load(), "runs of the work")
		var p *gormlease.PanicError
		require.ErrorAs(t, err, &p)
		assert.ErrorIs(t, p.Value.(error), is, "the panic's value")
		assert.NotErrorIs(t, err, gormlease.ErrLeaseHeld)
		assert.NotErrorIs(t, err, gormlease.ErrPaused)
	})
}

// assertWorkFailedWithRefusal asserts that err is a *WorkError of the work,
// which neither matches ErrLeaseHeld nor holds a *HeldError or
// *PausedError for errors.As, while its Err is the nested refusal.
func assertWorkFailedWithRefusal(t *testing.T, err error, refusal error) {
	t.Helper()
	var we *gormlease.WorkError
	require.ErrorAs(t, err, &we)
	assert.Equal(t, "work", we.Step)
	assert.ErrorIs(t, we.Err, refusal, "the work's own error")
	assert.NotErrorIs(t, err, gormlease.ErrLeaseHeld, "a work's refusal was taken for the call's own")
	assert.NotErrorIs(t, err, gormlease.ErrPaused, "a work's refusal was taken for the call's own")
	var held *gormlease.HeldError
	var paused *gormlease.PausedError
	assert.False(t, errors.As(err, &held), "errors.As found the work's *HeldError")
	assert.False(t, errors.As(err, &paused), "errors.As found the work's *PausedError")
}

// A work that calls Run on another target and returns its refusal ends
// RunWait's call: RunWait runs it once, and returns a *WorkError, rather
// than take the refusal for its own and run the work again until its
// context ends.
func TestRunWait_WorkRefusedInsideRunsOnce(t *testing.T) {
	t.Parallel()
	eachNestedRefusal(t, func(t *testing.T, db *gorm.DB, target, other string, is error) {
		r := newRunner(t, db, fast(100*time.Millisecond, time.Second)...)
		var runs atomic.Int32
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, err := r.RunWait(ctx, target, nestedWork(r, other, &runs), gormlease.SaveJSON[string])
		require.NoError(t, ctx.Err(), "RunWait ran until its context ended (%d runs)", runs.Load())
		assert.EqualValues(t, 1, runs.Load(), "runs of the work")
		assertWorkFailedWithRefusal(t, err, is)
	})
}

// A work of Do that is refused inside fails the call that ran it: Do
// returns its *WorkError, not a SharedJobError of a job it waited for.
func TestDo_WorkRefusedInsideIsTheCallersFailure(t *testing.T) {
	t.Parallel()
	eachNestedRefusal(t, func(t *testing.T, db *gorm.DB, target, other string, is error) {
		r := newRunner(t, db, fast(100*time.Millisecond, time.Second)...)
		var runs atomic.Int32
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, shared, err := r.Do(ctx, target, nestedWork(r, other, &runs), gormlease.SaveJSON[string], loadJSON(target))
		require.NoError(t, ctx.Err(), "Do ran until its context ended (%d runs)", runs.Load())
		assert.EqualValues(t, 1, runs.Load(), "runs of the work")
		assert.False(t, shared, "the caller that ran the work got shared true")
		assert.NotErrorIs(t, err, gormlease.ErrSharedJobFailed)
		assertWorkFailedWithRefusal(t, err, is)
	})
}

// A lead function that returns a refusal of its own ends Lead's term and
// Lead: it is called once, not campaigned with again.
func TestElector_LeadRefusedInsideEndsLead(t *testing.T) {
	t.Parallel()
	eachNestedRefusal(t, func(t *testing.T, db *gorm.DB, role, other string, is error) {
		e, err := gormlease.NewElector(db, role, fast(100*time.Millisecond, time.Second)...)
		require.NoError(t, err)
		inner := newRunner(t, db)
		var terms atomic.Int32
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		err = e.Lead(ctx, func(ctx context.Context) error {
			_, err := nestedWork(inner, other, &terms)(ctx)
			return err
		})
		require.NoError(t, ctx.Err(), "Lead campaigned until its context ended (%d terms)", terms.Load())
		assert.EqualValues(t, 1, terms.Load(), "terms")
		assert.ErrorIs(t, err, is, "Lead returns lead's own error")
	})
}

// apiError is an error type of a work's own, which wraps others.
type apiError struct{ err error }

func (e *apiError) Error() string { return "API: " + e.err.Error() }
func (e *apiError) Unwrap() error { return e.err }

// delegatingError names, through its own Is and As methods, what it
// carries, without an Unwrap: as some error types of other libraries do.
type delegatingError struct{ inner error }

func (e delegatingError) Error() string        { return "delegating: " + e.inner.Error() }
func (e delegatingError) Is(target error) bool { return errors.Is(e.inner, target) }
func (e delegatingError) As(target any) bool   { return errors.As(e.inner, target) }

// sliceError is an error type that cannot be compared.
type sliceError []string

func (e sliceError) Error() string { return "slice error" }

// Gormlease's outcomes stay hidden behind a *WorkError even when an error
// type's own Is or As method would name them, and odd error types do not
// make errors.Is panic.
func TestWorkError_HidesOutcomesThatIsOrAsMethodsName(t *testing.T) {
	t.Parallel()
	errQuota := errors.New("quota exceeded")
	held := &gormlease.HeldError{Target: "other", Generation: 3}
	err := error(&gormlease.WorkError{Step: "work", Target: "t", Err: delegatingError{fmt.Errorf("%w; %w", held, errQuota)}})
	assert.NotErrorIs(t, err, gormlease.ErrLeaseHeld)
	var h *gormlease.HeldError
	assert.False(t, errors.As(err, &h), "errors.As found a *HeldError through an As method")
	assert.ErrorIs(t, err, errQuota, "the work's own error, named by an Is method")

	odd := error(&gormlease.WorkError{Step: "work", Target: "t", Err: sliceError{"a"}})
	assert.NotErrorIs(t, odd, gormlease.ErrLeaseHeld)
	assert.NotErrorIs(t, odd, sliceError{"a"}, "an error that cannot be compared matches only by an Is method")
	var se sliceError
	assert.True(t, errors.As(odd, &se))

	assert.Equal(t, `gormlease: save "t": failed`, (&gormlease.WorkError{Step: "save", Target: "t"}).Error())
}

// The work's own errors stay visible through a *WorkError: errors.Is finds
// a sentinel of the caller's, errors.As a type of the caller's, beside a
// refusal that is hidden.
func TestWorkError_SeesTheWorksOwnErrors(t *testing.T) {
	t.Parallel()
	errQuota := errors.New("quota exceeded")
	held := &gormlease.HeldError{Target: "other", Generation: 3}
	for name, workErr := range map[string]error{
		"plain":          errQuota,
		"beside refusal": fmt.Errorf("report: %w (%w)", errQuota, held),
		"wrapping it":    fmt.Errorf("call the API: %w", &apiError{errors.Join(held, errQuota)}),
	} {
		t.Run(name, func(t *testing.T) {
			err := error(&gormlease.WorkError{Step: "work", Target: "t", Generation: 1, Err: workErr})
			assert.ErrorIs(t, err, errQuota)
			assert.NotErrorIs(t, err, gormlease.ErrLeaseHeld)
			var h *gormlease.HeldError
			assert.False(t, errors.As(err, &h))
			var a *apiError
			if errors.As(workErr, &a) {
				var got *apiError
				require.ErrorAs(t, err, &got)
				assert.Same(t, a, got)
				assert.ErrorIs(t, got.Unwrap(), errQuota)
			}
			assert.Equal(t, `gormlease: work "t": `+workErr.Error(), err.Error())
		})
	}
}

// Lead returns lead's error as lead returned it, even one of a type that
// cannot be compared.
func TestElector_LeadReturnsAnUncomparableError(t *testing.T) {
	t.Parallel()
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		e, err := gormlease.NewElector(db, newTarget(t))
		require.NoError(t, err)
		err = e.Lead(context.Background(), func(context.Context) error { return sliceError{"a", "b"} })
		assert.Equal(t, sliceError{"a", "b"}, err)
	})
}
