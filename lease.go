package gormlease

import (
	"context"

	"github.com/google/uuid"

	"github.com/gormlease/gormlease/internal/backend"
)

// Lease is a lease that the caller holds: what Repository.Acquire returns
// and every later step takes. Its Token proves ownership; keep the Lease to
// the goroutine that acquired it.
type Lease struct {
	// TargetID names the leased target.
	TargetID string
	// Token was minted for this acquisition; no other acquisition has it.
	Token uuid.UUID
	// Generation is the fencing number: greater than that of every earlier
	// acquisition of the target (or slot). Use it as an idempotency key.
	Generation int64
	// Slot is the slot held, from 1, on a semaphore (WithSlots); else 0.
	Slot int
}

// row is l as the backend knows it: its TargetID is the key of l's row,
// which for a slot is the slot row's.
func (l Lease) row() backend.Lease {
	id := l.TargetID
	if l.Slot > 0 {
		id = backend.SlotKey(l.TargetID, l.Slot)
	}
	return backend.Lease{TargetID: id, Token: l.Token, Generation: l.Generation}
}

// check returns an error wrapping ErrInvalidArgument when l cannot be a
// lease that Acquire returned.
func (l Lease) check() error {
	if err := checkTargetID(l.TargetID); err != nil {
		return err
	}
	if l.Token == uuid.Nil {
		return invalidf("lease on %q has the nil token: use the Lease that Acquire returned", l.TargetID)
	}
	if l.Slot < 0 || l.Slot > MaxSlots {
		return invalidf("lease on %q has slot %d, not between 0 and %d", l.TargetID, l.Slot, MaxSlots)
	}
	return nil
}

type leaseKey struct{}

// leaseValue is what a context carries for LeaseFromContext, and for
// SaveJSON the tables of the lease's Repository.
type leaseValue struct {
	lease  Lease
	tables tableNames
}

// withLease returns ctx carrying l, held in tables, for LeaseFromContext.
func withLease(ctx context.Context, l Lease, tables tableNames) context.Context {
	return context.WithValue(ctx, leaseKey{}, leaseValue{l, tables})
}

// leaseFrom returns the lease that ctx carries, with its tables.
func leaseFrom(ctx context.Context) (leaseValue, bool) {
	if ctx == nil {
		return leaseValue{}, false
	}
	v, ok := ctx.Value(leaseKey{}).(leaseValue)
	return v, ok
}

// LeaseFromContext returns the lease that the work runs under, from the
// context that Runner.Run passes to work, or from the context of the
// transaction that a saver gets (of Run or CommitIfOwner).
func LeaseFromContext(ctx context.Context) (Lease, bool) {
	v, ok := leaseFrom(ctx)
	return v.lease, ok
}
