package tests

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"
	"pgregory.net/rapid"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/internal/testdb"
	"github.com/gormlease/gormlease/internal/testkit"
)

// The model-based test drives random interleavings of the lease steps by
// several actors on one target against the real database, and after every
// step compares the database with this model of it.
//
// The specification, in the model's terms:
//   - The lease is live when it is held (not released) and younger than the
//     timeout. Acquire succeeds exactly when the lease is not live, and then
//     mints a new token and the next generation.
//   - Heartbeat, commit and release succeed exactly for the holder whose
//     token the row carries, while not released (age does not matter: until
//     someone takes over, the row is still theirs). Anyone else gets
//     ErrLeaseLost and changes nothing.
//   - A commit saves the committer's generation; a release makes the target
//     acquirable at once.
//
// Time is the database's: "advance" ages the row with SQL, in steps of 25 s
// against a 60 s timeout, so that the real seconds the test takes never
// decide liveness. "steal" is a takeover by a process outside the model.
// "pause" and "resume" take an actor out of the game and bring it back with
// whatever lease it believed it had.

const (
	modelTimeout = 60 * time.Second
	modelTick    = 25 * time.Second
	modelActors  = 3
)

// leaseModel is the expected state of the target's lease row.
type leaseModel struct {
	exists     bool
	token      uuid.UUID
	generation int64
	age        time.Duration // since the last acquire or heartbeat
	released   bool
	savedGen   int64 // generation of the saved result, 0 for none
}

func (m leaseModel) live() bool { return m.exists && !m.released && m.age < modelTimeout }

// ownedBy reports whether l's steps (heartbeat, commit, release) must succeed.
func (m leaseModel) ownedBy(l *gormlease.Lease) bool {
	return l != nil && m.exists && !m.released && m.token == l.Token
}

// actor is one process taking part: its view of the lease it holds.
type actor struct {
	repo   *gormlease.Repository
	lease  *gormlease.Lease
	paused bool
}

func TestModel_LeaseProtocol(t *testing.T) {
	t.Parallel()
	s := testdb.Postgres(t)
	db := s.DB(t)
	repo := testkit.NewRepository(t, db)
	ctx := context.Background()

	rapid.Check(t, func(rt *rapid.T) {
		target := "model-" + uuid.NewString()
		var m leaseModel
		actors := make([]*actor, modelActors)
		for i := range actors {
			actors[i] = &actor{repo: repo}
		}
		maxGen := int64(0)

		// pick draws an actor that is not paused, or skips the step.
		pick := func(rt *rapid.T) (int, *actor) {
			i := rapid.IntRange(0, modelActors-1).Draw(rt, "actor")
			if actors[i].paused {
				rt.Skip("paused")
			}
			return i, actors[i]
		}
		// expect checks that err is nil when ok, and wraps want otherwise.
		expect := func(rt *rapid.T, step string, err error, ok bool, want error) {
			if ok && err != nil {
				rt.Fatalf("%s: want success, got %v (model %+v)", step, err, m)
			}
			if !ok && !errors.Is(err, want) {
				rt.Fatalf("%s: want %v, got %v (model %+v)", step, want, err, m)
			}
		}
		// unchanged runs a step that must not change the row.
		unchanged := func(rt *rapid.T, step string, fn func()) {
			before, _ := rowOf(rt, db, target)
			fn()
			after, _ := rowOf(rt, db, target)
			if !reflect.DeepEqual(before, after) {
				rt.Fatalf("%s changed another holder's lease:\n before %+v\n after  %+v", step, before, after)
			}
		}

		// holderStep has an actor that holds a lease (current or not) run
		// one step with it. When the model says the lease is the actor's,
		// the step must succeed, and effect updates the model; otherwise it
		// must fail with ErrLeaseLost and change nothing.
		holderStep := func(rt *rapid.T, name string, step func(i int, a *actor) error, effect func(a *actor)) {
			i, a := pick(rt)
			if a.lease == nil {
				rt.Skip("holds nothing")
			}
			ok := m.ownedBy(a.lease)
			var err error
			if ok {
				err = step(i, a)
				effect(a)
			} else {
				unchanged(rt, "stale "+name, func() { err = step(i, a) })
			}
			expect(rt, fmt.Sprintf("actor %d %s", i, name), err, ok, gormlease.ErrLeaseLost)
		}

		rt.Repeat(map[string]func(*rapid.T){
			"acquire": func(rt *rapid.T) {
				i, a := pick(rt)
				ok := !m.live()
				var l gormlease.Lease
				var err error
				if ok {
					l, err = a.repo.Acquire(ctx, target, modelTimeout)
				} else {
					unchanged(rt, "refused acquire", func() { l, err = a.repo.Acquire(ctx, target, modelTimeout) })
				}
				expect(rt, fmt.Sprintf("actor %d acquire", i), err, ok, gormlease.ErrLeaseHeld)
				if !ok {
					return
				}
				if l.Generation != m.generation+1 {
					rt.Fatalf("acquire: generation %d, want %d", l.Generation, m.generation+1)
				}
				a.lease = &l
				m = leaseModel{exists: true, token: l.Token, generation: l.Generation, savedGen: m.savedGen}
			},
			"heartbeat": func(rt *rapid.T) {
				holderStep(rt, "heartbeat", func(i int, a *actor) error {
					return a.repo.Heartbeat(ctx, *a.lease)
				}, func(*actor) { m.age = 0 })
			},
			"commit": func(rt *rapid.T) {
				holderStep(rt, "commit", func(i int, a *actor) error {
					return a.repo.CommitIfOwner(ctx, *a.lease, func(tx *gorm.DB) error {
						return gormlease.SaveJSON(tx, i)
					})
				}, func(a *actor) { m.savedGen = a.lease.Generation })
			},
			"release": func(rt *rapid.T) {
				holderStep(rt, "release", func(i int, a *actor) error {
					return a.repo.Release(ctx, *a.lease)
				}, func(*actor) { m.released = true })
			},
			"steal": func(rt *rapid.T) {
				if !m.exists {
					rt.Skip("no row")
				}
				token := uuid.New()
				if err := db.Exec(`UPDATE job_lease SET lease_token = ?, generation = generation + 1,
					updated_at = clock_timestamp(), released_at = NULL WHERE target_id = ?`, token, target).Error; err != nil {
					rt.Fatalf("steal: %v", err)
				}
				m = leaseModel{exists: true, token: token, generation: m.generation + 1, savedGen: m.savedGen}
			},
			"advance": func(rt *rapid.T) {
				if !m.exists {
					rt.Skip("no row")
				}
				ticks := rapid.IntRange(1, 3).Draw(rt, "ticks")
				d := time.Duration(ticks) * modelTick
				if err := db.Exec("UPDATE job_lease SET updated_at = updated_at - CAST(? AS bigint) * interval '1 microsecond' WHERE target_id = ?",
					d.Microseconds(), target).Error; err != nil {
					rt.Fatalf("advance: %v", err)
				}
				m.age += d
			},
			"pause": func(rt *rapid.T) {
				_, a := pick(rt)
				a.paused = true
			},
			"resume": func(rt *rapid.T) {
				a := actors[rapid.IntRange(0, modelActors-1).Draw(rt, "actor")]
				if !a.paused {
					rt.Skip("not paused")
				}
				a.paused = false
			},
			"": func(rt *rapid.T) {
				row, found := rowOf(rt, db, target)
				if found != m.exists {
					rt.Fatalf("row exists: %v, model: %v", found, m.exists)
				}
				if !found {
					return
				}
				// The row is what the model says.
				if row.LeaseToken != m.token || row.Generation != m.generation || (row.ReleasedAt != nil) != m.released {
					rt.Fatalf("row %+v differs from model %+v", row, m)
				}
				// Generations strictly increase.
				if row.Generation < maxGen {
					rt.Fatalf("generation went back from %d to %d", maxGen, row.Generation)
				}
				maxGen = row.Generation
				// At most one actor holds a lease that the database honours.
				holders := 0
				for _, a := range actors {
					if m.ownedBy(a.lease) {
						holders++
					}
				}
				if holders > 1 {
					rt.Fatalf("%d live holders", holders)
				}
				// The saved result is the one of the last commit by the
				// then-current holder, and nothing else.
				var res []gormlease.JobResult
				if err := db.Where("target_id = ?", target).Find(&res).Error; err != nil {
					rt.Fatalf("read result: %v", err)
				}
				gotGen := int64(0)
				if len(res) == 1 {
					gotGen = res[0].Generation
				}
				if gotGen != m.savedGen {
					rt.Fatalf("saved generation %d, model %d", gotGen, m.savedGen)
				}
			},
		})
	})
}

// rowOf reads target's lease row.
func rowOf(rt *rapid.T, db *gorm.DB, target string) (gormlease.JobLease, bool) {
	var rows []gormlease.JobLease
	if err := db.Where("target_id = ?", target).Find(&rows).Error; err != nil {
		rt.Fatalf("read lease row: %v", err)
	}
	if len(rows) == 0 {
		return gormlease.JobLease{}, false
	}
	return rows[0], true
}
