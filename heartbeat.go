package gormlease

import (
	"context"
	"log/slog"
	"reflect"
	"time"

	"github.com/gormlease/gormlease/internal/heartbeat"
	"github.com/gormlease/gormlease/observe"
)

// A Run's heartbeat: its lease joins the heartbeats of the Runner's
// heartbeat Repository (see internal/heartbeat), batched with the other
// leases that the Runner holds, and the lease's loss cancels its work.

// reportKey says to whom a heartbeat group's statements are reported: leases
// share heartbeat statements only with those reported to the same logger
// and observer.
type reportKey struct {
	logger   *slog.Logger
	observer any // see observerKey
}

// observerKey is what identifies m's observer in a reportKey: nil when there
// is none, the observer itself, or, for an observer of a type that cannot
// be a map key, m, whose Runner's leases then share heartbeats only among
// themselves.
func observerKey(m *monitor) any {
	if m.obs == nil {
		return nil
	}
	if t := reflect.TypeOf(m.obs); !t.Comparable() {
		return m
	}
	return m.obs
}

// startHeartbeat starts renewing lease, acquired by a statement sent at
// sent, until the returned member's Stop. The lease's loss cancels the work
// with cancelWork, with a cause that says how it was lost.
func (r *Runner[T]) startHeartbeat(workCtx context.Context, lease Lease, sent time.Time,
	cancelWork context.CancelCauseFunc,
) *heartbeat.Member {
	m := &r.mon
	interval := r.cfg.heartbeatInterval
	s := heartbeat.Settings{Interval: interval, OperationTimeout: r.cfg.operationTimeout,
		Report: r.report}
	if m.obs != nil {
		s.Context = func(ctx context.Context) context.Context { return withStatements(ctx, m) }
	}
	if m.obs != nil || m.log != nil {
		s.Round = func(ctx context.Context, round heartbeat.Round) { m.heartbeatRound(ctx, interval, round) }
	}
	trust := r.cfg.trustWindow()
	return r.beater.beats.Join(s, workCtx, lease.row(), sent, trust, func(why heartbeat.Loss) {
		switch {
		case why.SelfFenced:
			cancelWork(&lossCause{kind: observe.EventSelfFenced,
				err: wrapf(ErrLeaseLost, "heartbeat %q: no heartbeat confirmed the lease for %v", lease.TargetID, trust)})
		case why.Stop:
			cancelWork(&stopRequestedError{target: lease.TargetID, reason: why.Reason})
		default:
			cancelWork(&lossCause{kind: observe.EventLeaseLost, err: wrapf(ErrLeaseLost, "heartbeat %q", lease.TargetID)})
		}
	})
}

// heartbeatRound reports one heartbeat statement: as an event, a heartbeat
// span per lease, and a log line when it failed or was slow (see
// slowHeartbeatFraction).
func (m *monitor) heartbeatRound(ctx context.Context, interval time.Duration, round heartbeat.Round) {
	rtt := time.Since(round.Sent)
	switch {
	case round.Err != nil && ctx.Err() == nil:
		if m.logs(ctx, slog.LevelWarn) {
			m.log.LogAttrs(ctx, slog.LevelWarn, "gormlease: heartbeat failed, retrying",
				slog.Int("leases", len(round.Members)), slog.Duration("duration", rtt),
				slog.Duration("retry_in", interval/4), slog.Any("error", round.Err))
		}
	case rtt > interval/slowHeartbeatFraction:
		if m.logs(ctx, slog.LevelWarn) {
			m.log.LogAttrs(ctx, slog.LevelWarn, "gormlease: slow heartbeat",
				slog.Int("leases", len(round.Members)), slog.Duration("duration", rtt),
				slog.Duration("interval", interval))
		}
	}
	if m.obs == nil {
		return
	}
	m.record(ctx, observe.Event{Kind: observe.EventHeartbeat, Duration: rtt, Leases: len(round.Members), Err: round.Err})
	for _, h := range round.Members {
		_, end := m.start(h.Context, observe.Span{Kind: observe.SpanHeartbeat, TargetID: h.Lease.TargetID,
			Generation: h.Lease.Generation, Start: round.Sent})
		e, found := round.Ended[h.Lease]
		switch {
		case end == nil:
		case round.Err != nil:
			end(round.Err)
		case found && e.Stop:
			end(ErrStopRequested)
		case found:
			end(ErrLeaseLost)
		default:
			end(nil)
		}
	}
}
