package history

import (
	"fmt"
	"math"
	"path/filepath"
	"time"

	"github.com/anishathalye/porcupine"
)

// The model check: each target is a lease whose state is its current
// generation. An acquisition of generation g is legal only above the
// current one, and makes g current; a save of generation g is legal only
// while g is current. An acquisition's operation runs from its Run's call
// to its work's start; a save's from its saver's start to its Run's
// return, or for ever when the worker was killed before Run returned. Only
// the saves that the result table shows took effect are operations: the
// table, not the worker, says whether a commit whose answer was lost took
// effect.

// leaseOp is an operation's input: an acquisition or a save of Gen.
type leaseOp struct {
	Target string
	Save   bool
	Gen    int64
}

var leaseModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byTarget := map[string][]porcupine.Operation{}
		var order []string
		for _, op := range history {
			t := op.Input.(leaseOp).Target
			if _, ok := byTarget[t]; !ok {
				order = append(order, t)
			}
			byTarget[t] = append(byTarget[t], op)
		}
		parts := make([][]porcupine.Operation, 0, len(order))
		for _, t := range order {
			parts = append(parts, byTarget[t])
		}
		return parts
	},
	Init: func() any { return int64(0) },
	Step: func(state, input, _ any) (bool, any) {
		cur, op := state.(int64), input.(leaseOp)
		if op.Save {
			return op.Gen == cur, cur
		}
		return op.Gen > cur, op.Gen
	},
	DescribeOperation: func(input, _ any) string {
		op := input.(leaseOp)
		if op.Save {
			return fmt.Sprintf("save %d", op.Gen)
		}
		return fmt.Sprintf("acquire %d", op.Gen)
	},
	DescribeState: func(state any) string { return fmt.Sprintf("generation %d", state.(int64)) },
}

// modelTimeout bounds the model check; the histories here are mostly
// sequential, and it takes milliseconds.
const modelTimeout = time.Minute

// linearizable checks runs and results against leaseModel, and returns
// how many operations it checked and a Violation per target whose history
// is not linearizable (or could not be decided in time).
//
// When dir is not empty, the history of each target that is not
// linearizable is drawn there, as porcupine's HTML visualization.
func linearizable(runs []*run, results []Result, dir string) (int, []Violation) {
	var ops []porcupine.Operation
	byToken := map[string]*run{}
	for i, r := range runs {
		if r.token == "" {
			continue
		}
		byToken[r.token] = r
		ops = append(ops, porcupine.Operation{ClientId: i, Input: leaseOp{Target: r.target, Gen: r.gen},
			Call: r.start, Return: r.work})
	}
	for _, res := range results {
		r := byToken[res.Token]
		if r == nil || r.save == 0 {
			continue // a foreign save: Check reports it
		}
		ret := r.end
		if ret == 0 {
			ret = math.MaxInt64 / 2 // killed before Run returned
		}
		ops = append(ops, porcupine.Operation{Input: leaseOp{Target: res.Target, Save: true, Gen: res.Gen},
			Call: r.save, Return: ret})
	}
	var vs []Violation
	for _, part := range leaseModel.Partition(ops) {
		target := part[0].Input.(leaseOp).Target
		switch res, info := porcupine.CheckOperationsVerbose(leaseModel, part, modelTimeout); res {
		case porcupine.Ok:
		case porcupine.Illegal:
			detail := fmt.Sprintf("%d acquisitions and saves admit no order in which only the current generation saves", len(part))
			if dir != "" {
				path := filepath.Join(dir, "porcupine-"+target+".html")
				if err := porcupine.VisualizePath(leaseModel, info, path); err != nil {
					detail += fmt.Sprintf(" (drawing it failed: %v)", err)
				} else {
					detail += "; drawn in " + path
				}
			}
			vs = append(vs, Violation{Kind: ViolationNotLinearizable, Target: target, Detail: detail})
		default:
			vs = append(vs, Violation{Kind: ViolationNotLinearizable, Target: target,
				Detail: fmt.Sprintf("undecided within %v (%s)", modelTimeout, res)})
		}
	}
	return len(ops), vs
}
