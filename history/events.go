package history

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"
)

// The kinds of Event a worker logs, in the order one call logs them.
const (
	// KindRun: Run is called (Target).
	KindRun = "run"
	// KindDo: Do is called (Target).
	KindDo = "do"
	// KindRunWait: RunWait is called (Target).
	KindRunWait = "runwait"
	// KindWork: the work starts: the acquire succeeded (Gen, Token, and
	// Holder, the Runner's WithHolder); Try counts the works of the call,
	// from 1.
	KindWork = "work"
	// KindWorkEnd: the work returns: a value (no Outcome), or an error
	// (Outcome WorkFailed or WorkInterrupted, and Err its text).
	KindWorkEnd = "workend"
	// KindSave: the saver starts, inside the fenced commit (Gen, Token).
	KindSave = "save"
	// KindEnd: the call returned (Outcome, Err; for Do, Shared, Loaded
	// and Failed).
	KindEnd = "end"
)

// The outcomes of a Run, by the error it returned.
const (
	OutcomeOK      = "ok"      // nil: saved
	OutcomeHeld    = "held"    // ErrLeaseHeld: nothing ran
	OutcomePaused  = "paused"  // ErrPaused: the target is paused, nothing ran
	OutcomeStopped = "stopped" // ErrStopRequested: an operator stopped the work, nothing saved
	OutcomeLost    = "lost"    // ErrLeaseLost: nothing saved
	OutcomeUnknown = "unknown" // ErrCommitUnknown: saved or not
	OutcomeError   = "error"   // any other error: nothing saved
	// Do's own: it returned another job's result (shared, nil), or a
	// SharedJobError (ErrSharedJobFailed).
	OutcomeShared       = "shared"
	OutcomeSharedFailed = "shared job failed"
)

// The outcomes of a work, in its KindWorkEnd, when it returned an error.
const (
	// WorkFailed: the work failed of its own accord (Err).
	WorkFailed = "failed"
	// WorkInterrupted: the work returned because its context ended (Err
	// is the context's cause: the lease lost, a stop request, the
	// caller's context).
	WorkInterrupted = "interrupted"
)

// Event is one line of a worker's log.
type Event struct {
	// Worker names the worker process (its name and incarnation); Run
	// numbers its Runs, from 1.
	Worker string `json:"w"`
	Run    int64  `json:"r"`
	Kind   string `json:"k"`
	Target string `json:"t,omitempty"`
	Gen    int64  `json:"g,omitempty"`
	Token  string `json:"tok,omitempty"`
	// Holder is a KindWork's: the holder name of the Runner that made the
	// call.
	Holder string `json:"h,omitempty"`
	// Try is a KindWork's: which work of its call it is, from 1.
	Try int `json:"try,omitempty"`
	// Outcome and Err are a KindEnd's, and a KindWorkEnd's.
	Outcome string `json:"o,omitempty"`
	Err     string `json:"e,omitempty"`
	// Shared, Loaded and Failed are the KindEnd of a Do: the shared flag
	// it returned, the generation whose result its load read (0: no
	// load), and the generation of the SharedJobError it returned (0:
	// none).
	Shared bool  `json:"sh,omitempty"`
	Loaded int64 `json:"lg,omitempty"`
	Failed int64 `json:"fg,omitempty"`
	// At is the wall time, in Unix microseconds, when the event happened
	// (for KindRun and KindSave, just before the call or statement).
	At int64 `json:"at"`
}

// Micros returns t in Unix microseconds, the unit of every time here.
func Micros(t time.Time) int64 { return t.UnixMicro() }

// Log writes Events to a file, one JSON line with one write each, so that
// what was written survives the process being killed.
type Log struct {
	mu sync.Mutex
	f  *os.File
}

// CreateLog creates the log file path.
func CreateLog(path string) (*Log, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	return &Log{f: f}, nil
}

// Write logs e.
func (l *Log) Write(e Event) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, err = l.f.Write(append(b, '\n'))
	return err
}

// Close closes the file.
func (l *Log) Close() error { return l.f.Close() }

// ReadLogs reads every *.jsonl file in dir, in time order. A last line cut
// short by a kill is left out.
func ReadLogs(dir string) ([]Event, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	if err != nil {
		return nil, err
	}
	var all []Event
	for _, p := range paths {
		evs, err := readLog(p)
		if err != nil {
			return nil, err
		}
		all = append(all, evs...)
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].At < all[j].At })
	return all, nil
}

func readLog(path string) ([]Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var evs []Event
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var e Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			// Only a torn last line can fail: one write per line.
			if !sc.Scan() {
				break
			}
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		evs = append(evs, e)
	}
	return evs, sc.Err()
}
