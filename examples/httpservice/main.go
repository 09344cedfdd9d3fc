// Command httpservice is a small HTTP service that runs slow work under
// gormlease, as a service does in its first hour: each outcome of Run and
// Do answered with its own status, a shutdown on SIGTERM that lets the
// work in progress end or hands its targets back, and the operator's
// console mounted behind the application's own check.
//
//	POST /refresh/{id}  makes id's report again (Run): once at a time per id;
//	                    a request that finds it in progress gets 409 with a
//	                    Retry-After from HeldError.RetryAfter
//	GET  /report/{id}   id's report (Do): the requests that come while it is
//	                    being made wait for that one and share it; one saved
//	                    less than a minute ago is answered at once
//	/ops/leases/        the console (package console), for a request with
//	                    the bearer token OPS_TOKEN, or Basic auth with it as
//	                    the password (a browser asks for it); the row and
//	                    the log record Basic auth's user with each action
//
// It reads its settings from the environment: DATABASE_URL (a postgres://
// or mysql:// DSN, or an SQLite file; PostgreSQL on 127.0.0.1 by default),
// ADDR (":8080"), OPS_TOKEN (no console without it), SHUTDOWN_GRACE
// (20s: how long a SIGTERM lets the work in progress end) and MIGRATE=1 to
// create the tables at startup, where a real service would run
// `gormlease migrate` in its deploy instead; without it, a missing table
// stops the start at once, naming it.
//
//	MIGRATE=1 OPS_TOKEN=secret go run .
//	curl -X POST localhost:8080/refresh/user-42
//
// The slow external call is stood for by a wait of WORK (3s): the status
// of each outcome is in answer, the shutdown in Service.Serve.
package main

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ncruces/go-sqlite3/gormlite"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"

	"github.com/gormlease/gormlease"
	"github.com/gormlease/gormlease/console"
)

// Report is a row of the application's own table: one report made by
// POST /refresh/{id}.
type Report struct {
	ID         uint      `json:"id"`
	Subject    string    `json:"subject" gorm:"index"`
	Body       string    `json:"body"`
	Generation int64     `json:"generation"` // the lease's: the external call's idempotency key
	MadeAt     time.Time `json:"made_at"`
}

// Summary is what GET /report/{id} answers: saved with gormlease.SaveJSON
// in job_result, shared by the requests that wait for it.
type Summary struct {
	Subject    string `json:"subject"`
	Body       string `json:"body"`
	Generation int64  `json:"generation"`
}

// Fetch is the slow external call: it makes subject's report under the
// lease's generation (pass it to the API as its idempotency key), and
// returns when done or when ctx ends.
type Fetch func(ctx context.Context, subject string, generation int64) (string, error)

// Timing of the service.
const (
	// shutdownGrace is how long a shutdown waits for the work in progress
	// to end on its own before it cancels it: Kubernetes kills a pod 30 s
	// after SIGTERM by default, which leaves 10 s to hand the targets back.
	shutdownGrace = 20 * time.Second

	// releaseWait bounds the wait for the cancelled work's Runs to release
	// their leases: each release runs within the operation timeout.
	releaseWait = gormlease.DefaultOperationTimeout

	// defaultReportWait is how long GET /report waits for a job in
	// progress, or for a paused target, before it answers 409 or 503,
	// unless Config.ReportWait says otherwise.
	defaultReportWait = 30 * time.Second
)

func main() {
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if err := run(logger); err != nil {
		logger.Error("httpservice stopped", "err", err)
		os.Exit(1)
	}
}

// run serves until SIGTERM or Ctrl-C, then shuts down.
func run(logger *slog.Logger) error {
	dsn := getenv("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	work, err := time.ParseDuration(getenv("WORK", "3s"))
	if err != nil {
		return fmt.Errorf("WORK: %w", err)
	}
	grace, err := time.ParseDuration(getenv("SHUTDOWN_GRACE", shutdownGrace.String()))
	if err != nil {
		return fmt.Errorf("SHUTDOWN_GRACE: %w", err)
	}
	db, err := open(dsn)
	if err != nil {
		return err
	}
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	defer sqlDB.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if os.Getenv("MIGRATE") == "1" {
		if err := migrate(ctx, db); err != nil {
			return err
		}
	}
	svc, err := NewService(ctx, db, Config{Fetch: slowCall(work), OpsToken: os.Getenv("OPS_TOKEN"), Logger: logger})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", getenv("ADDR", ":8080"))
	if err != nil {
		return err
	}
	logger.Info("serving", "addr", ln.Addr().String())
	return svc.Serve(ctx, ln, grace)
}

func getenv(name, otherwise string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return otherwise
}

// open opens dsn: PostgreSQL for a postgres:// DSN, MySQL or MariaDB for
// mysql:// and the driver's DSN after it (with parseTime=true, which
// gormlease needs), SQLite otherwise (see docs/sqlite.md).
func open(dsn string) (*gorm.DB, error) {
	cfg := &gorm.Config{}
	switch {
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		return gorm.Open(postgres.Open(dsn), cfg)
	case strings.HasPrefix(dsn, "mysql://"):
		return gorm.Open(mysql.Open(strings.TrimPrefix(dsn, "mysql://")), cfg)
	}
	if !strings.HasPrefix(dsn, "file:") {
		dsn = "file:" + dsn + "?_pragma=busy_timeout(10000)&_pragma=journal_mode(wal)&_pragma=synchronous(normal)"
	}
	return gorm.Open(gormlite.Open(dsn), cfg)
}

// migrate creates gormlease's tables (as `gormlease migrate` does) and the
// application's own.
func migrate(ctx context.Context, db *gorm.DB) error {
	if err := gormlease.AutoMigrate(ctx, db); err != nil {
		return err
	}
	return db.WithContext(ctx).AutoMigrate(&Report{})
}

// slowCall is the Fetch of the command: a wait of d that stands for an
// external API, cut short when ctx ends.
func slowCall(d time.Duration) Fetch {
	return func(ctx context.Context, subject string, generation int64) (string, error) {
		select {
		case <-time.After(d):
			return fmt.Sprintf("report on %s (generation %d)", subject, generation), nil
		case <-ctx.Done():
			return "", context.Cause(ctx)
		}
	}
}

// Config is what NewService needs besides the database.
type Config struct {
	// Fetch is the slow external call. Required.
	Fetch Fetch
	// OpsToken lets a request see the console, and act from it: as a
	// bearer token, or as the password of Basic auth. Without it the
	// console is not mounted.
	OpsToken string
	// Logger gets the service's log; nil discards it.
	Logger *slog.Logger
	// ReportWait is how long GET /report waits for a job in progress, or
	// for a paused target; 0 means 30 s.
	ReportWait time.Duration
	// Options are the Runners' options; none gives gormlease's defaults
	// (the tests shorten the timings).
	Options []gormlease.Option
}

// Service is the HTTP service: its handlers, and its shutdown in Serve.
type Service struct {
	refresher *gormlease.Runner[*Report]
	reporter  *gormlease.Runner[Summary]
	fetch     Fetch
	opsToken  string
	wait      time.Duration // GET /report's wait
	log       *slog.Logger
	handler   http.Handler
}

// NewService checks that the tables exist (gormlease's, and the
// application's), and returns the service. A missing table is an error
// that says so at once, rather than at the first request.
func NewService(ctx context.Context, db *gorm.DB, cfg Config) (*Service, error) {
	if cfg.Fetch == nil {
		return nil, errors.New("httpservice: Config.Fetch is nil")
	}
	s := &Service{fetch: cfg.Fetch, opsToken: cfg.OpsToken, wait: cfg.ReportWait, log: cfg.Logger}
	if s.wait <= 0 {
		s.wait = defaultReportWait
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	var err error
	if s.refresher, err = gormlease.NewRunner[*Report](db, cfg.Options...); err != nil {
		return nil, err
	}
	if s.reporter, err = gormlease.NewRunner[Summary](db, slices.Concat(cfg.Options, []gormlease.Option{gormlease.WithReuseFor(time.Minute)})...); err != nil {
		return nil, err
	}
	if err := s.refresher.Repository().CheckTables(ctx); err != nil {
		return nil, err // wraps gormlease.ErrMissingTables, naming the table, or a database error
	}
	if !db.WithContext(ctx).Migrator().HasTable(&Report{}) {
		return nil, errors.New("httpservice: no table reports: start with MIGRATE=1")
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /refresh/{id}", s.refresh)
	mux.HandleFunc("GET /report/{id}", s.report)
	if s.opsToken != "" {
		ops, err := console.New(db,
			console.WithAuthorizer(func(r *http.Request, action, targetID string) error {
				if !s.authorized(r) { // checked before the console too: defence in depth
					return errors.New("not authorized")
				}
				return nil
			}),
			console.WithIdentity(operator),
			console.WithLogger(s.log))
		if err != nil {
			return nil, err
		}
		mux.Handle("/ops/leases/", s.requireToken(http.StripPrefix("/ops/leases", ops)))
	}
	s.handler = mux
	return s, nil
}

// Handler returns the service's routes.
func (s *Service) Handler() http.Handler { return s.handler }

// refresh makes id's report again, under the lease of "refresh:" + id:
// one request at a time runs the slow call, the others get 409.
func (s *Service) refresh(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	report, err := s.refresher.Run(r.Context(), "refresh:"+id,
		func(ctx context.Context) (*Report, error) {
			lease, _ := gormlease.LeaseFromContext(ctx)
			body, err := s.fetch(ctx, id, lease.Generation)
			if err != nil {
				return nil, err
			}
			return &Report{Subject: id, Body: body, Generation: lease.Generation, MadeAt: time.Now()}, nil
		},
		func(tx *gorm.DB, rep *Report) error { return tx.Create(rep).Error }, // rep.ID comes back from Run
	)
	if err != nil {
		s.answer(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, report)
}

// report answers id's report, under the lease of "report:" + id: the
// requests that come while it is being made wait for that one, for up to
// Config.ReportWait, and share it (the header Shared: true says so).
func (s *Service) report(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	target := "report:" + id
	ctx, cancel := context.WithTimeout(r.Context(), s.wait)
	defer cancel()
	summary, shared, err := s.reporter.Do(ctx, target,
		func(ctx context.Context) (Summary, error) {
			lease, _ := gormlease.LeaseFromContext(ctx)
			body, err := s.fetch(ctx, id, lease.Generation)
			return Summary{Subject: id, Body: body, Generation: lease.Generation}, err
		},
		gormlease.SaveJSON[Summary],
		func(tx *gorm.DB) (Summary, error) {
			v, _, err := gormlease.LoadJSON[Summary](tx.Statement.Context, tx, target)
			return v, err
		},
	)
	if err != nil {
		s.answer(w, r, err)
		return
	}
	w.Header().Set("Shared", strconv.FormatBool(shared))
	writeJSON(w, http.StatusOK, summary)
}

// errShuttingDown is the cause with which Serve cancels the work still
// running when its shutdown grace has passed.
var errShuttingDown = errors.New("the service is shutting down")

// answer writes the status of err, an error of Run or Do for request r,
// and logs it at the level it deserves (see outcome).
func (s *Service) answer(w http.ResponseWriter, r *http.Request, err error) {
	o := outcome(r.Context(), err)
	s.log.Log(r.Context(), o.level, o.message, "path", r.URL.Path, "status", o.status, "err", err)
	if o.status == statusClientGone {
		return // no one to answer
	}
	if o.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(o.retryAfter.Seconds())))
	}
	http.Error(w, o.message, o.status)
}

// statusClientGone stands for a request whose client went away (nginx's
// 499): it is logged, and nothing is written.
const statusClientGone = 499

// response is what answer writes for an error.
type response struct {
	status     int
	message    string        // the body, and the log's message
	retryAfter time.Duration // the Retry-After header, in whole seconds; 0: none
	level      slog.Level    // the log's level: Error only where a person must look
}

// outcome maps an error of Run or Do, for a request whose context is
// reqCtx, to its response. Every outcome has its own case: the request's
// end first (its cancellation is the cause of the rest), then the
// refusals, the outcomes that saved nothing, the one that may have saved,
// and failures.
func outcome(reqCtx context.Context, err error) response {
	var (
		held   *gormlease.HeldError
		paused *gormlease.PausedError
		shared *gormlease.SharedJobError
		failed *gormlease.WorkError
	)
	switch {
	case errors.Is(err, gormlease.ErrCommitUnknown):
		// The connection died during COMMIT: the report may have been
		// saved. gormlease logs it at Error; a client must check first.
		// First, before a client gone or a shutdown: the work was not
		// simply cancelled then, and the one to check is the operator.
		return response{http.StatusInternalServerError, "the save's outcome is unknown: it may have saved; check before trying again", 0, slog.LevelError}
	case reqCtx.Err() != nil && errors.Is(context.Cause(reqCtx), errShuttingDown):
		// Serve cancelled the work to shut down, and Run released its lease
		// (Do's job too, once its last caller left): nothing saved, and
		// another instance can take it at once.
		return response{http.StatusServiceUnavailable, "shutting down: nothing saved; try again", time.Second, slog.LevelInfo}
	case reqCtx.Err() != nil:
		// The client went away: its work was cancelled and its lease
		// released (a Do job goes on for the callers still waiting).
		return response{statusClientGone, "client gone", 0, slog.LevelInfo}
	case errors.As(err, &paused):
		// An operator paused the target: nothing ran. 503, not 409: the
		// refusal is the service's, for a time no one can tell (no
		// Retry-After), and it is not about this request's own state;
		// clients and proxies treat 503 as "try again later".
		return response{http.StatusServiceUnavailable, "paused by an operator: " + paused.Reason, 0, slog.LevelInfo}
	case errors.As(err, &held):
		// Another request is on it (or, for Do, still was when this one
		// stopped waiting): nothing ran. RetryAfter is as long again as it
		// has been held, not the lease's timeout.
		return response{http.StatusConflict, fmt.Sprintf("in progress on %s (generation %d, for %v)",
			held.Holder, held.Generation, held.HeldFor.Round(100*time.Millisecond)),
			retryAfter(held), slog.LevelDebug}
	case errors.Is(err, gormlease.ErrLeaseHeld):
		// Refused in a race for the row: who holds it is not known.
		return response{http.StatusConflict, "in progress elsewhere", time.Second, slog.LevelDebug}
	case errors.Is(err, gormlease.ErrStopRequested):
		// An operator stopped the work (the reason is in err): nothing saved.
		return response{http.StatusServiceUnavailable, "stopped by an operator: nothing saved", 0, slog.LevelInfo}
	case errors.Is(err, gormlease.ErrMaxHoldExceeded):
		// The work outlasted WithMaxHold (in Config.Options): cancelled,
		// nothing saved, the lease released. Warn: a job that long may
		// need a look, or a longer bound.
		return response{http.StatusGatewayTimeout, "the report took too long: nothing saved", 0, slog.LevelWarn}
	case errors.Is(err, gormlease.ErrLeaseLost):
		// Taken over meanwhile (this instance stalled, or lost the
		// database): nothing saved; the new holder is at work.
		return response{http.StatusServiceUnavailable, "lease lost: nothing saved; try again", time.Second, slog.LevelWarn}
	case errors.As(err, &shared):
		// Do: the job this request waited for failed, and was not rerun.
		return response{http.StatusBadGateway, "the report failed: " + shared.Message, 0, slog.LevelInfo}
	case errors.As(err, &failed) && failed.Step == "work":
		// The external call failed: nothing saved, the lease released.
		return response{http.StatusBadGateway, "the report failed: " + failed.Err.Error(), 0, slog.LevelWarn}
	case errors.As(err, &failed):
		// The saver failed: the transaction was rolled back.
		return response{http.StatusInternalServerError, "saving the report failed", 0, slog.LevelError}
	case errors.Is(err, gormlease.ErrMissingTables):
		// A table or column is missing: run `gormlease migrate`.
		return response{http.StatusInternalServerError, "the lease tables are missing", 0, slog.LevelError}
	case errors.Is(err, gormlease.ErrInvalidArgument):
		// A bad id (over 255 bytes, a NUL byte, ...): nothing written.
		return response{http.StatusBadRequest, strings.TrimPrefix(err.Error(), "gormlease: "), 0, slog.LevelDebug}
	default:
		// A panic, the database: a person must look.
		return response{http.StatusInternalServerError, "internal error", 0, slog.LevelError}
	}
}

// retryAfter is the wait a client of a held target is told.
func retryAfter(held *gormlease.HeldError) time.Duration {
	return held.RetryAfter()
}

// authorized reports whether r carries the operators' token, as a bearer
// token or as Basic auth's password.
func (s *Service) authorized(r *http.Request) bool {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		_, token, ok = r.BasicAuth()
	}
	return ok && subtle.ConstantTimeCompare([]byte(token), []byte(s.opsToken)) == 1
}

// operator names who acts from the console, recorded with each action in
// the row and the log: Basic auth's user, or "ops-token" for a bearer
// token, which names no one.
func operator(r *http.Request) string {
	if user, _, ok := r.BasicAuth(); ok && user != "" {
		return user
	}
	return "ops-token"
}

// requireToken serves h only to a request that authorized allows.
func (s *Service) requireToken(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.authorized(r) {
			w.Header().Set("WWW-Authenticate", `Basic realm="operators"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// writeJSON answers v as JSON with status. A write that fails means the
// client went away: there is no one to tell.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// Serve serves on ln until ctx ends (SIGTERM, in run), then shuts down:
// it stops accepting requests and lets the work in progress end for up to
// grace; past it, it cancels that work, with errShuttingDown as the
// cause, so that each Run releases its lease (a waiting client gets 503)
// rather than leave its target held until the lease times out; then it
// waits, up to releaseWait, for those Runs to return. It returns nil once
// every request has ended, and an error when one outlasted that wait.
func (s *Service) Serve(ctx context.Context, ln net.Listener, grace time.Duration) error {
	// Requests run on a context of their own, which a SIGTERM does not end:
	// only cancelWork does.
	work, cancelWork := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelWork(nil)
	srv := &http.Server{
		Handler:           s.handler,
		BaseContext:       func(net.Listener) context.Context { return work },
		ReadHeaderTimeout: 10 * time.Second,
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	s.log.Info("shutting down: letting the work in progress end", "grace", grace)
	graceCtx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := srv.Shutdown(graceCtx); err != nil {
		s.log.Warn("shutting down: work still running after the grace: cancelling it, to release its leases", "grace", grace)
		cancelWork(errShuttingDown)
		releaseCtx, cancel := context.WithTimeout(context.Background(), releaseWait)
		defer cancel()
		if err := srv.Shutdown(releaseCtx); err != nil {
			srv.Close()
			<-served
			return fmt.Errorf("shutting down: requests still running %v after cancelling them: %w", releaseWait, err)
		}
	}
	<-served // http.ErrServerClosed
	s.log.Info("shut down")
	return nil
}
