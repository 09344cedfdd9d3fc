package gormlease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/admin"
	"github.com/gormlease/gormlease/internal/backend"
	"github.com/gormlease/gormlease/internal/testdb"
	"github.com/gormlease/gormlease/leasetest"
	"github.com/gormlease/gormlease/observe"
)

// observedElector returns an Elector for role on db with a recording
// observer.
func observedElector(t *testing.T, db *gorm.DB, role string, opts ...gormlease.Option) (*gormlease.Elector, *recordingObserver) {
	t.Helper()
	o := &recordingObserver{}
	return newElector(t, db, role, append([]gormlease.Option{gormlease.WithObserver(o)}, opts...)...), o
}

// oneTerm returns the one term that o saw begin and end, failing t unless
// o saw exactly one campaign of role and one term, begun and ended, of the
// same generation.
func oneTerm(t *testing.T, o *recordingObserver, role string) (begun, ended observe.Event) {
	t.Helper()
	campaigns := o.eventsOf(observe.EventCampaign)
	require.Len(t, campaigns, 1, "campaigns")
	assert.Equal(t, role, campaigns[0].TargetID)
	begins, ends := o.eventsOf(observe.EventTermBegun), o.eventsOf(observe.EventTermEnded)
	require.Len(t, begins, 1, "terms begun")
	require.Len(t, ends, 1, "terms ended")
	begun, ended = begins[0], ends[0]
	assert.Equal(t, role, begun.TargetID)
	assert.Equal(t, role, ended.TargetID)
	assert.Positive(t, begun.Generation)
	assert.Equal(t, begun.Generation, ended.Generation, "the term that ended is the one that began")
	assert.Positive(t, ended.Duration, "how long the term lasted")
	return begun, ended
}

// Each way a term ends is reported with its cause, as EventTermEnded, after
// the EventTermBegun of the same term, with the error that Lead returns.
func TestElector_ReportsTermEnds(t *testing.T) {
	errLead := errors.New("lead failed")
	untilCancelled := func(ctx context.Context) error { <-ctx.Done(); return nil }
	cases := []struct {
		name string
		opts []gormlease.Option
		// lead is the term; act, when not nil, is done to the term once
		// it has begun, with cancel, which cancels the context of Lead.
		lead    func(t *testing.T, db *gorm.DB, role string) func(ctx context.Context) error
		act     func(t *testing.T, db *gorm.DB, e *gormlease.Elector, role string, cancel context.CancelFunc)
		want    observe.TermEnd
		wantErr func(t *testing.T, err error)
	}{
		{name: "Resigned", want: observe.TermResigned,
			lead: func(*testing.T, *gorm.DB, string) func(context.Context) error {
				return func(context.Context) error { return nil }
			},
			wantErr: func(t *testing.T, err error) { assert.NoError(t, err) }},
		{name: "Failed", want: observe.TermFailed,
			lead: func(*testing.T, *gorm.DB, string) func(context.Context) error {
				return func(context.Context) error { return errLead }
			},
			wantErr: func(t *testing.T, err error) { assert.Equal(t, errLead, err) }},
		{name: "Panicked", want: observe.TermFailed,
			lead: func(*testing.T, *gorm.DB, string) func(context.Context) error {
				return func(context.Context) error { panic("lead panicked") }
			},
			wantErr: func(t *testing.T, err error) {
				var p *gormlease.PanicError
				assert.ErrorAs(t, err, &p)
			}},
		{name: "Cancelled", want: observe.TermCancelled,
			lead: func(*testing.T, *gorm.DB, string) func(context.Context) error { return untilCancelled },
			act: func(_ *testing.T, _ *gorm.DB, _ *gormlease.Elector, _ string, cancel context.CancelFunc) {
				cancel()
			},
			wantErr: func(t *testing.T, err error) { assert.ErrorIs(t, err, context.Canceled) }},
		{name: "StopRequested", want: observe.TermStopRequested,
			lead: func(*testing.T, *gorm.DB, string) func(context.Context) error { return untilCancelled },
			act: func(t *testing.T, _ *gorm.DB, e *gormlease.Elector, role string, _ context.CancelFunc) {
				require.NoError(t, admin.New(e.Repository()).RequestStop(context.Background(), role, "maintenance"))
			},
			wantErr: func(t *testing.T, err error) { assert.ErrorIs(t, err, gormlease.ErrStopRequested) }},
		{name: "TakenOver", want: observe.TermTakenOver,
			lead: func(*testing.T, *gorm.DB, string) func(context.Context) error { return untilCancelled },
			act: func(t *testing.T, db *gorm.DB, _ *gormlease.Elector, role string, _ context.CancelFunc) {
				leasetest.TakeOver(t, db, role)
			},
			wantErr: func(t *testing.T, err error) { assert.ErrorIs(t, err, gormlease.ErrLeaseLost) }},
		{name: "ForceReleased", want: observe.TermTakenOver,
			lead: func(*testing.T, *gorm.DB, string) func(context.Context) error { return untilCancelled },
			act: func(t *testing.T, _ *gorm.DB, e *gormlease.Elector, role string, _ context.CancelFunc) {
				_, err := admin.New(e.Repository()).ForceRelease(context.Background(), role)
				require.NoError(t, err)
			},
			wantErr: func(t *testing.T, err error) { assert.ErrorIs(t, err, gormlease.ErrLeaseLost) }},
		{name: "MaxHold", want: observe.TermMaxHold, opts: []gormlease.Option{gormlease.WithMaxHold(300 * time.Millisecond)},
			lead:    func(*testing.T, *gorm.DB, string) func(context.Context) error { return untilCancelled },
			wantErr: func(t *testing.T, err error) { assert.ErrorIs(t, err, gormlease.ErrMaxHoldExceeded) }},
		{name: "SelfFenced", want: observe.TermSelfFenced,
			opts: []gormlease.Option{gormlease.WithLeaseTimeout(time.Second), gormlease.WithSafetyMargin(200 * time.Millisecond)},
			lead: func(t *testing.T, db *gorm.DB, role string) func(context.Context) error {
				return func(ctx context.Context) error {
					// Heartbeats wait on the row lock past the trust window.
					unlock := lockRow(t, db, role)
					defer unlock()
					select {
					case <-ctx.Done():
					case <-time.After(10 * time.Second):
						t.Error("the term was not cancelled by self-fencing")
					}
					return nil
				}
			},
			wantErr: func(t *testing.T, err error) { assert.ErrorIs(t, err, gormlease.ErrLeaseLost) }},
	}
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				role := newTarget(t)
				e, obs := observedElector(t, db, role, c.opts...)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				began := make(chan struct{})
				lead := c.lead(t, db, role)
				done := goLead(t, ctx, e, func(ctx context.Context) error {
					close(began)
					return lead(ctx)
				})
				recv(t, began, 20*time.Second, "the term to begin")
				if c.act != nil {
					c.act(t, db, e, role, cancel)
				}
				err := recv(t, done, 20*time.Second, "Lead to return")
				c.wantErr(t, err)

				_, ended := oneTerm(t, obs, role)
				assert.Equal(t, c.want, ended.TermEnd, "cause %v", ended.TermEnd)
				assert.Equal(t, err, ended.Err, "the event's error is Lead's")
			})
		}
	})
}

// The term that an Elector begins says how long the role had been without
// a leader: unknown (negative) for the role's first term; from the
// previous leader's release, for a standby that waited for it; from the
// lease's expiry, for one that waited for a holder that died; and so for a
// Lead that begins without waiting, which reads the row first. The time
// it reports is never the time that the standby waited while another led.
func TestElector_ReportsLeaderlessTime(t *testing.T) {
	eachDB(t, func(t *testing.T, s *testdb.Server, db *gorm.DB) {
		role := newTarget(t)
		a, aObs := observedElector(t, db, role, gormlease.WithHolder("elector-a"))
		b, bObs := observedElector(t, db, role, gormlease.WithHolder("elector-b"))

		// The first term: the role has no row.
		aLeads, resign := make(chan struct{}), make(chan struct{})
		aDone := goLead(t, context.Background(), a, func(context.Context) error {
			close(aLeads)
			<-resign
			return nil
		})
		recv(t, aLeads, 20*time.Second, "a to lead")
		first := aObs.eventsOf(observe.EventTermBegun)
		require.Len(t, first, 1)
		assert.Negative(t, first[0].Duration, "the role's first term cannot tell")

		// A standby that waits while a leads, then leads at a's release.
		bLeads := make(chan time.Time, 1)
		bDone := goLead(t, context.Background(), b, func(context.Context) error {
			bLeads <- time.Now()
			return nil
		})
		waitFor(t, 20*time.Second, "b to wait", func() bool { return waiters(t, role).Waits >= 1 })
		resigned := time.Now()
		close(resign)
		require.NoError(t, recv(t, aDone, 20*time.Second, "a's Lead"))
		bLed := recv(t, bLeads, 20*time.Second, "b to lead")
		require.NoError(t, recv(t, bDone, 20*time.Second, "b's Lead"))
		begun, _ := oneTerm(t, bObs, role)
		t.Logf("b led %v after a resigned; it reports %v without a leader", bLed.Sub(resigned), begun.Duration)
		assert.Positive(t, begun.Duration, "from a's release")
		// The release came after resigned; the read that found it, before
		// b led (5ms for the rounding of the database's clock readings).
		assert.LessOrEqual(t, begun.Duration, bLed.Sub(resigned)+5*time.Millisecond)

		// A Lead that begins without waiting reads the row before its
		// acquire: from b's release, just now.
		c, cObs := observedElector(t, db, role, gormlease.WithHolder("elector-c"))
		cLeads := make(chan time.Time, 1)
		require.NoError(t, c.Lead(context.Background(), func(context.Context) error {
			cLeads <- time.Now()
			return nil
		}))
		cLed := recv(t, cLeads, time.Second, "c to lead")
		begun, _ = oneTerm(t, cObs, role)
		assert.Positive(t, begun.Duration)
		assert.LessOrEqual(t, begun.Duration, cLed.Sub(bLed)+5*time.Millisecond, "b's release came after b led")

		// A holder that dies: Expire moves its last heartbeat (its
		// acquire) back by its timeout and 1 s, and the standby that
		// waited on it leads.
		occupied := time.Now()
		leasetest.Occupy(t, db, role)
		d, dObs := observedElector(t, db, role, gormlease.WithHolder("elector-d"))
		dLeads := make(chan time.Time, 1)
		dDone := goLead(t, context.Background(), d, func(context.Context) error {
			dLeads <- time.Now()
			return nil
		})
		waitFor(t, 20*time.Second, "d to wait", func() bool { return waiters(t, role).Waits >= 1 })
		expiring := time.Now()
		leasetest.Expire(t, db, role)
		dLed := recv(t, dLeads, 20*time.Second, "d to lead")
		require.NoError(t, recv(t, dDone, 20*time.Second, "d's Lead"))
		begun, _ = oneTerm(t, dObs, role)
		t.Logf("d led %v after Expire; it reports %v without a leader", dLed.Sub(expiring), begun.Duration)
		// The lease expired 1 s before the acquire of Occupy, which came
		// after occupied, and so more than 1 s before d led; the read that
		// found it expired is late by its answer's trip back, far less than
		// 500ms however loaded the machine.
		assert.LessOrEqual(t, begun.Duration, dLed.Sub(occupied)+time.Second+5*time.Millisecond)
		assert.GreaterOrEqual(t, begun.Duration, 500*time.Millisecond)
	})
}

// The time without a leader, from what a read of the role's row showed: the
// release or the expiry, whichever came first; unknown for a read that
// cannot tell.
func TestVacancy(t *testing.T) {
	read := time.Now()
	began := read.Add(100 * time.Millisecond)
	released := backend.State{Found: true, Generation: 4, Released: true, Age: 3 * time.Second, ReleasedAge: time.Second,
		Timeout: 20 * time.Second, Read: read}
	expired := backend.State{Found: true, Generation: 4, Age: 25 * time.Second, ReleasedAge: -1, Timeout: 20 * time.Second, Read: read}
	expiredThenReleased := released
	expiredThenReleased.Age = 30 * time.Second
	noTimeout := expired
	noTimeout.Timeout = 0
	live := expired
	live.Age = time.Second
	for _, c := range []struct {
		name string
		st   backend.State
		gen  int64
		want time.Duration
	}{
		{"Released", released, 5, 1100 * time.Millisecond},
		{"Expired", expired, 5, 5100 * time.Millisecond},
		{"ExpiredBeforeItsRelease", expiredThenReleased, 5, 10100 * time.Millisecond},
		{"ExpiredByTheFallbackTimeout", noTimeout, 5, 15100 * time.Millisecond},
		{"NoRead", backend.State{}, 1, -1},
		{"NoRow", backend.State{Read: read}, 1, -1},
		{"Live", live, 5, -1},
		{"AnotherTermBetween", released, 6, -1},
	} {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, gormlease.Vacancy(c.st, c.gen, began, 10*time.Second))
		})
	}
}

// The cause of a term's end, from how lead returned, the cause of its
// context and Run's error.
func TestTermEnd(t *testing.T) {
	lost := gormlease.NewLossCause(observe.EventLeaseLost)
	fenced := gormlease.NewLossCause(observe.EventSelfFenced)
	maxHold := gormlease.NewLossCause(observe.EventMaxHoldExceeded)
	stop := gormlease.NewStopRequested("t", "maintenance")
	leadErr := errors.New("lead failed")
	for _, c := range []struct {
		name                   string
		done                   bool
		leadErr, cause, runErr error
		want                   observe.TermEnd
	}{
		{"Resigned", true, nil, nil, nil, observe.TermResigned},
		{"ResignedReleaseFailed", true, nil, nil, errors.New("release failed"), observe.TermResigned},
		{"Failed", true, leadErr, nil, leadErr, observe.TermFailed},
		{"Panicked", false, nil, nil, errors.New("panic"), observe.TermFailed},
		{"PanickedAfterTheLoss", false, nil, lost, lost, observe.TermFailed},
		{"Cancelled", true, nil, context.Canceled, context.Canceled, observe.TermCancelled},
		{"CancelledLeadFailed", true, leadErr, context.Canceled, context.Canceled, observe.TermCancelled},
		{"TakenOver", true, nil, lost, lost, observe.TermTakenOver},
		{"TakenOverLeadFailed", true, leadErr, lost, lost, observe.TermTakenOver},
		{"LostAfterLeadReturned", true, nil, nil, lost, observe.TermTakenOver},
		{"LostAtTheCommit", true, nil, nil, gormlease.ErrLeaseLost, observe.TermTakenOver},
		{"SelfFenced", true, nil, fenced, fenced, observe.TermSelfFenced},
		{"MaxHold", true, nil, maxHold, maxHold, observe.TermMaxHold},
		{"StopRequested", true, nil, stop, stop, observe.TermStopRequested},
	} {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, gormlease.TermEndOf(c.done, c.leadErr, c.cause, c.runErr))
		})
	}
}

// TermEnd names each cause as a metric's label does.
func TestTermEnd_String(t *testing.T) {
	names := map[observe.TermEnd]string{}
	for c := observe.TermEnd(0); c <= observe.TermStopRequested+1; c++ {
		names[c] = c.String()
	}
	assert.Equal(t, map[observe.TermEnd]string{
		0: "unknown", observe.TermResigned: "resigned", observe.TermFailed: "failed", observe.TermCancelled: "cancelled",
		observe.TermTakenOver: "taken_over", observe.TermSelfFenced: "self_fenced", observe.TermMaxHold: "max_hold",
		observe.TermStopRequested: "stop_requested", observe.TermStopRequested + 1: "unknown",
	}, names)
}
