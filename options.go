package gormlease

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"gorm.io/gorm"

	"github.com/gormlease/gormlease/internal/backend"
	"github.com/gormlease/gormlease/observe"
)

const (
	// DefaultHeartbeatInterval is how often a Runner renews its lease while
	// the work runs, when neither WithHeartbeatInterval nor WithLeaseTimeout
	// is given. With WithLeaseTimeout alone, the interval is a quarter of
	// that timeout instead.
	DefaultHeartbeatInterval = 30 * time.Second

	// DefaultLeaseTimeout is how long a lease stays live without a heartbeat,
	// when neither WithLeaseTimeout nor WithHeartbeatInterval is given;
	// after that another Run may take the target over. With
	// WithHeartbeatInterval alone, the timeout is four times that interval
	// instead.
	DefaultLeaseTimeout = 2 * time.Minute

	// DefaultOperationTimeout bounds each database call that a Runner makes
	// for the lease: the acquire, each heartbeat, the fenced commit with the
	// saver inside it, and the release. WithOperationTimeout overrides it;
	// without it, a lease timeout shorter than this is the bound instead.
	DefaultOperationTimeout = 10 * time.Second

	// MaxSlots is the largest count that WithSlots and
	// Repository.AcquireSlot accept.
	MaxSlots = backend.MaxSlots

	// defaultSafetyMarginDivisor sets the default safety margin to the lease
	// timeout divided by this number (12 s for the default 2 min timeout).
	defaultSafetyMarginDivisor = 10

	// defaultTimeoutPerInterval is the ratio of the default lease timeout
	// to the default heartbeat interval: when only one of the two is
	// given, the other is derived from it at this ratio.
	defaultTimeoutPerInterval = DefaultLeaseTimeout / DefaultHeartbeatInterval
)

// An Option configures a Runner: NewRunner takes every option of this
// package. Options are validated together by NewRunner, which names the
// option at fault.
//
// Some options are also of a narrower type, for the functions that can use
// them: WithHolder, WithTableNames and WithStatementAttempts are
// RepositoryOptions, which
// NewRepository takes, and WithTableNames is a TableOption, which
// AutoMigrate and LoadJSON take. Passing an option to a function that
// cannot use it does not compile.
type Option interface {
	apply(*config)
}

// A RepositoryOption configures a Repository: NewRepository takes
// WithHolder, WithTableNames and WithStatementAttempts. Every RepositoryOption is an Option too,
// so NewRunner takes the same values.
type RepositoryOption interface {
	Option
	isRepositoryOption()
}

// A TableOption names the tables: WithTableNames is the one. AutoMigrate
// and LoadJSON take it; it is a RepositoryOption and an Option too, so
// the same value can be passed to NewRepository and NewRunner.
type TableOption interface {
	RepositoryOption
	isTableOption()
}

// option is an Option that only a Runner uses.
type option func(*config)

func (o option) apply(c *config) { o(c) }

// repositoryOption is an option that a Repository uses too.
type repositoryOption func(*config)

func (o repositoryOption) apply(c *config)   { o(c) }
func (repositoryOption) isRepositoryOption() {}

// tableOption is an option that names the tables.
type tableOption func(*config)

func (o tableOption) apply(c *config)   { o(c) }
func (tableOption) isRepositoryOption() {}
func (tableOption) isTableOption()      {}

// options returns opts as Options, for newConfig.
func options[O Option](opts []O) []Option {
	all := make([]Option, len(opts))
	for i, o := range opts {
		all[i] = o
	}
	return all
}

// WithHeartbeatInterval sets how often the Runner renews the lease while the
// work runs. It must be greater than zero, and the lease timeout must be at
// least twice as long. Given without WithLeaseTimeout, it sets the lease
// timeout too, to four times d (the ratio of the defaults), so that one
// option is enough. The default is DefaultHeartbeatInterval, or a quarter
// of the lease timeout when only WithLeaseTimeout is given.
func WithHeartbeatInterval(d time.Duration) Option {
	return option(func(c *config) { c.heartbeatInterval = d; c.heartbeatIntervalSet = true })
}

// WithLeaseTimeout sets how long the Runner's leases stay live without a
// heartbeat. Each lease records it in its row when acquired, and an acquire
// of any holder takes the target over once the last heartbeat is older than
// the timeout that the row records, on the database's clock: the holder's
// timeout decides, not the acquirer's. It must be at least twice the heartbeat
// interval. Given without WithHeartbeatInterval, it sets the interval too,
// to a quarter of d (the ratio of the defaults): WithLeaseTimeout(10 *
// time.Second) alone renews every 2.5 s. The default is DefaultLeaseTimeout,
// or four times the heartbeat interval when only WithHeartbeatInterval is
// given. The defaults of the safety margin, the operation timeout and the
// reconnect window follow the lease timeout (see those options).
func WithLeaseTimeout(d time.Duration) Option {
	return option(func(c *config) { c.leaseTimeout = d; c.leaseTimeoutSet = true })
}

// WithSafetyMargin sets how long before the lease timeout the Runner stops
// trusting a lease that it could not confirm. The Runner cancels the work
// with ErrLeaseLost once no heartbeat has succeeded for lease timeout minus
// this margin, counted from when the last successful heartbeat was sent.
// The margin covers the time the work takes to notice cancellation and
// any drift between the clocks' rates. It must be greater than zero and
// leave room for at least one heartbeat: interval + margin < timeout.
// The default is a tenth of the lease timeout: 12 s of the default 2 min.
func WithSafetyMargin(d time.Duration) Option {
	return option(func(c *config) { c.safetyMargin = d; c.safetyMarginSet = true })
}

// WithClockSkew declares the largest difference between the clocks of the
// database servers that stamp and judge the leases, such as the nodes of a
// MariaDB Galera cluster: each node stamps heartbeats with its own clock
// and judges expiry with it, so a node whose clock runs ahead by d sees a
// lease expire d early, and may take it over while the holder still
// trusts it. The Runner stops trusting a lease that it could not confirm
// d earlier than the safety margin alone would have it: at lease timeout
// minus margin minus d after the last successful heartbeat was sent. It
// must be >= 0, and interval + margin + d must be less than the lease
// timeout. The default is 0: one database server, one clock.
func WithClockSkew(d time.Duration) Option {
	return option(func(c *config) { c.clockSkew = d })
}

// WithOperationTimeout bounds each database call of the Runner: each
// attempt of the acquire, each heartbeat statement, each fenced commit with
// the saver inside it, and each attempt of the release. Self-fencing does
// not wait for a heartbeat: at the end of the trust window (see
// WithSafetyMargin) the work is cancelled even while a heartbeat statement
// is still in flight, bounded by this timeout alone. While the database cannot be reached, Run tries the acquire
// and the fenced commit again within WithReconnectWindow, which defaults to
// it. A saver that runs past it finds its context done and its transaction
// rolled back, and Run commits again as after a failover (see Runner.Run).
// It must be greater than zero. The default is DefaultOperationTimeout, or
// the lease timeout when that is shorter: a Runner with a 1 s lease bounds
// each call by 1 s.
func WithOperationTimeout(d time.Duration) Option {
	return option(func(c *config) { c.operationTimeout = d; c.operationTimeoutSet = true })
}

// WithReconnectWindow bounds how long a Run keeps trying while the database
// cannot be reached (a failover, a switchover, a restart): the acquire (of a
// slot too, with WithSlots) is tried again, each attempt within the
// operation timeout, until d has passed since the Run began; a fenced commit
// whose transaction ended before its COMMIT (the server ended it, or the
// saver ran past the operation timeout), or whose COMMIT got no answer, is
// settled and committed again until d has passed since the commit failed,
// however long the saver ran before that. Only errors that say that the
// database cannot be reached are tried again: any other error returns at
// once. Set it to the longest failover that Runs should ride through
// without an error; the lease timeout should outlast it too, so that the
// leases of the Runs at work survive it. It must be > 0 and at most the
// lease timeout. The default is the operation timeout, which itself
// defaults to no more than the lease timeout.
func WithReconnectWindow(d time.Duration) Option {
	return option(func(c *config) { c.reconnectWindow = d; c.reconnectWindowSet = true })
}

// WithHolder sets the name stored in job_lease.holder while the Runner, or
// the Repository, holds a lease, so that an operator can see who holds a
// target. It must be valid UTF-8, 1 to 255 bytes, without NUL bytes. The
// default is "hostname/pid".
func WithHolder(name string) RepositoryOption {
	return repositoryOption(func(c *config) { c.holder = name })
}

// WithHeartbeatDB sends the Runner's heartbeats through db instead of the
// Runner's own database handle: typically a second, small pool (gorm.Open
// with SetMaxOpenConns of 1 or 2) on the same database, so that a heartbeat
// never waits for a connection behind the application's own queries long
// enough to lose its lease. db must be a *gorm.DB from gorm.Open on the same
// kind of database as the Runner's, not inside a transaction. Acquire,
// commit and release still use the Runner's database. By default
// heartbeats share the Runner's database handle.
func WithHeartbeatDB(db *gorm.DB) Option {
	return option(func(c *config) { c.heartbeatDB = db; c.heartbeatDBSet = true })
}

// WithReuseFor makes Runner.Do return the target's last saved result,
// without running the work, when that result was saved less than d ago on
// the database's clock: a window in which a repeated request (a second
// click, a retry) gets the answer of the first. Do calls its load function
// for it and reports it as shared. It must be >= 0; the default, 0, turns
// the window off: Do then runs the work again once the last job has ended.
// Run and RunWait ignore it.
func WithReuseFor(d time.Duration) Option {
	return option(func(c *config) { c.reuseFor = d })
}

// WithLogger makes the Runner log its lifecycle to logger, with the target,
// generation and holder, and durations, as attributes. Levels say what the
// reader must do: Debug for normal outcomes (a lease acquired, refused
// because it is held, released, a result saved); Info where an operator's
// request was carried out (work stopped by RequestStop); Warn where gormlease
// protected the caller (a lease lost to a takeover, self-fencing, work
// cancelled past WithMaxHold, a heartbeat that failed or took more than half
// the heartbeat interval); Error where a person must look (a commit whose
// outcome is unknown, a release that failed). It also gets what gorm's
// logger is not told of the lease's own statements, which gorm's logger
// writes only at logger.Info and never as slow nor as errors: a statement
// that took more than half the heartbeat interval, at Warn, and one that
// failed, at Debug. NewRunner (and so NewElector) also logs at Warn, once
// for each pool it is given (db, and WithHeartbeatDB's), each server
// setting that weakens a guarantee without making a step fail (on a Galera
// node, innodb_flush_log_at_trx_commit other than 1: see docs/scaling.md).
// The default, like a nil logger, logs nothing.
func WithLogger(logger *slog.Logger) Option {
	return option(func(c *config) { c.logger = logger })
}

// WithObserver makes the Runner report its steps and outcomes to o, for
// metrics and traces (see package github.com/gormlease/gormlease/observe;
// the module github.com/gormlease/gormlease/otel implements an Observer
// with OpenTelemetry). The default, like a nil o, reports to
// no one, and costs nothing.
func WithObserver(o observe.Observer) Option {
	return option(func(c *config) { c.observer = o })
}

// WithMaxHold bounds how long a Run's work may hold the lease: work still
// running d after the lease was acquired is cancelled, with a cause that
// matches ErrMaxHoldExceeded; its result is not saved, even if it ignores
// the cancellation and returns one, and the lease is released when it
// returns (with WithMinHold, held to the hold's end). It must be greater than zero; it need not relate to the lease
// timeout, since heartbeats keep the lease live meanwhile. By default the
// work may run for as long as it keeps its lease.
func WithMaxHold(d time.Duration) Option {
	return option(func(c *config) { c.maxHold = d; c.maxHoldSet = true })
}

// WithMinHold keeps a target held at least d after its acquisition, even
// when the work ends sooner: a Run whose work ended earlier returns at once
// (it does not sleep), and leaves the row held, unrenewed, until d after
// the acquire was sent, so that another pod whose timer fires a moment
// later is refused rather than running the job again. It is ShedLock's
// lockAtLeastFor. The hold applies after a failed work too: the target
// stays held for the rest of d either way, and nothing is saved for a work
// that failed. The row records the hold: Repository.List (and the
// gormlease command) shows it as a minimum hold while it lasts
// (LeaseInfo.MinHold), and as released, not expired, once it has passed.
// Run and RunWait honour it; Do refuses a Runner that has it
// (its waiters wait for a released or saved generation, which a held one
// is not). It must be greater than zero. By default the lease is released
// as soon as the work and its save end.
func WithMinHold(d time.Duration) Option {
	return option(func(c *config) { c.minHold = d; c.minHoldSet = true })
}

// WithSlots makes each target of the Runner a semaphore of n slots: up to
// n Runs (of any process) hold the target at once, each under a lease of
// its own, with its own token, generation (Lease.Slot says which slot),
// heartbeat and fenced save. Run returns ErrLeaseHeld only when all n
// slots are held, with a *HeldError that describes the slot that frees
// first; RunWait waits for a free slot; Do refuses a Runner with
// slots (ErrInvalidArgument), since one shared result among n holders
// means nothing. n must be between 1 and MaxSlots; 1, the default, is an
// ordinary lease.
//
// The count is shared state: it is recorded in the target's slot rows,
// and every acquire takes only a slot that records its own n. A Runner
// with another n for a target whose slots are held is refused with an
// error wrapping ErrSlotCountConflict, so that the holders never exceed
// the count they were admitted under; once none of them holds a slot, the
// next acquire records its own n. Give every Runner of a target the same
// n; to change it, deploy the new n and let the old holders finish.
func WithSlots(n int) Option {
	return option(func(c *config) { c.slots = n; c.slotsSet = true })
}

// DefaultStatementAttempts is how often a statement of the lease that fails
// with a serialization failure or a deadlock is tried in all, unless
// WithStatementAttempts says otherwise.
const DefaultStatementAttempts = backend.StatementAttempts

// MaxStatementAttempts bounds WithStatementAttempts.
const MaxStatementAttempts = 100

// WithStatementAttempts sets how often a statement of the lease (an
// acquire, a heartbeat, a release, the making of slot rows) is tried in
// all when it fails with a serialization failure or a deadlock: a session
// default of REPEATABLE READ or SERIALIZABLE on PostgreSQL, InnoDB's
// deadlock detection, a Galera certification conflict. Each failure rolls
// the statement back, having changed nothing; after the last, the step
// reports what the row says (an acquire is refused with ErrLeaseHeld; a
// heartbeat whose row still holds the lease returns an error that wraps
// the failure: not renewed, nor lost). n must be between 1 and
// MaxStatementAttempts; the default is DefaultStatementAttempts. It is a
// RepositoryOption.
func WithStatementAttempts(n int) RepositoryOption {
	return repositoryOption(func(c *config) { c.attempts = n })
}

// config holds a Runner's settings after validation.
type config struct {
	heartbeatInterval    time.Duration
	heartbeatIntervalSet bool
	leaseTimeout         time.Duration
	leaseTimeoutSet      bool
	safetyMargin         time.Duration
	safetyMarginSet      bool
	clockSkew            time.Duration
	operationTimeout     time.Duration
	operationTimeoutSet  bool
	reconnectWindow      time.Duration
	reconnectWindowSet   bool
	holder               string
	heartbeatDB          *gorm.DB
	heartbeatDBSet       bool
	tables               tableNames
	reuseFor             time.Duration
	logger               *slog.Logger
	observer             observe.Observer
	maxHold              time.Duration
	maxHoldSet           bool
	minHold              time.Duration
	minHoldSet           bool
	slots                int
	slotsSet             bool
	attempts             int
}

// newConfig applies opts over the defaults and validates the result.
func newConfig(opts []Option) (config, error) {
	c := config{
		heartbeatInterval: DefaultHeartbeatInterval,
		leaseTimeout:      DefaultLeaseTimeout,
		operationTimeout:  DefaultOperationTimeout,
		holder:            defaultHolder(),
		tables:            defaultTables,
		attempts:          DefaultStatementAttempts,
	}
	for i, o := range opts {
		if o == nil {
			return config{}, invalidf("option %d is nil", i)
		}
		o.apply(&c)
	}
	c.deriveDefaults()
	return c, c.validate()
}

// deriveDefaults fills in the timings not given from those given, so that
// one timing option is always enough: the heartbeat interval and the lease
// timeout from each other, at the ratio of their defaults; the safety
// margin from the lease timeout; and the operation timeout, and with it
// the reconnect window, never longer than the lease timeout. A value given
// is never changed, so that validate judges the settings as given; a value
// that cannot be derived from (one not > 0) is left to validate, which
// names the option given.
func (c *config) deriveDefaults() {
	switch {
	case c.leaseTimeoutSet && !c.heartbeatIntervalSet && c.leaseTimeout > 0:
		c.heartbeatInterval = c.leaseTimeout / defaultTimeoutPerInterval
	case c.heartbeatIntervalSet && !c.leaseTimeoutSet && c.heartbeatInterval > 0:
		c.leaseTimeout = c.heartbeatInterval * defaultTimeoutPerInterval
	}
	if !c.safetyMarginSet {
		c.safetyMargin = c.leaseTimeout / defaultSafetyMarginDivisor
	}
	if !c.operationTimeoutSet && c.leaseTimeout > 0 {
		c.operationTimeout = min(c.operationTimeout, c.leaseTimeout)
	}
}

func (c config) validate() error {
	switch {
	case c.leaseTimeout <= 0:
		return invalidf("WithLeaseTimeout: timeout must be > 0, got %v", c.leaseTimeout)
	case c.heartbeatInterval <= 0 && !c.heartbeatIntervalSet:
		return invalidf("WithLeaseTimeout: timeout %v is too short to derive a heartbeat interval from; give WithHeartbeatInterval too",
			c.leaseTimeout)
	case c.heartbeatInterval <= 0:
		return invalidf("WithHeartbeatInterval: interval must be > 0, got %v", c.heartbeatInterval)
	case c.leaseTimeout < 2*c.heartbeatInterval:
		return invalidf("WithLeaseTimeout: timeout %v must be at least twice the heartbeat interval %v",
			c.leaseTimeout, c.heartbeatInterval)
	case c.safetyMargin <= 0:
		return invalidf("WithSafetyMargin: margin must be > 0, got %v", c.safetyMargin)
	case c.heartbeatInterval+c.safetyMargin >= c.leaseTimeout:
		return invalidf("WithSafetyMargin: heartbeat interval %v + margin %v must be less than the lease timeout %v",
			c.heartbeatInterval, c.safetyMargin, c.leaseTimeout)
	case c.clockSkew < 0:
		return invalidf("WithClockSkew: skew must be >= 0, got %v", c.clockSkew)
	case c.heartbeatInterval+c.safetyMargin+c.clockSkew >= c.leaseTimeout:
		return invalidf("WithClockSkew: heartbeat interval %v + margin %v + clock skew %v must be less than the lease timeout %v",
			c.heartbeatInterval, c.safetyMargin, c.clockSkew, c.leaseTimeout)
	case c.operationTimeout <= 0:
		return invalidf("WithOperationTimeout: timeout must be > 0, got %v", c.operationTimeout)
	case c.reconnectWindowSet && c.reconnectWindow <= 0:
		return invalidf("WithReconnectWindow: window must be > 0, got %v", c.reconnectWindow)
	case c.reconnectWindowSet && c.reconnectWindow > c.leaseTimeout:
		return invalidf("WithReconnectWindow: window %v must be at most the lease timeout %v",
			c.reconnectWindow, c.leaseTimeout)
	case c.reuseFor < 0:
		return invalidf("WithReuseFor: window must be >= 0, got %v", c.reuseFor)
	case c.maxHoldSet && c.maxHold <= 0:
		return invalidf("WithMaxHold: max hold must be > 0, got %v", c.maxHold)
	case c.minHoldSet && c.minHold <= 0:
		return invalidf("WithMinHold: min hold must be > 0, got %v", c.minHold)
	case c.slotsSet && (c.slots < 1 || c.slots > MaxSlots):
		return invalidf("WithSlots: n must be between 1 and %d, got %d", MaxSlots, c.slots)
	case c.attempts < 1 || c.attempts > MaxStatementAttempts:
		return invalidf("WithStatementAttempts: n must be between 1 and %d, got %d", MaxStatementAttempts, c.attempts)
	}
	if c.heartbeatDBSet && c.heartbeatDB == nil {
		return invalidf("WithHeartbeatDB: db is nil")
	}
	if problem := checkText(c.holder, maxHolderLength); problem != "" {
		return invalidf("WithHolder: holder %s", problem)
	}
	return c.tables.check()
}

// reconnect is how long a Run keeps trying while the database cannot be
// reached (see WithReconnectWindow).
func (c config) reconnect() time.Duration {
	if c.reconnectWindowSet {
		return c.reconnectWindow
	}
	return c.operationTimeout
}

// trustWindow is how long after sending its last successful heartbeat the
// Runner keeps trusting the lease: the lease timeout, less the safety
// margin and the clock skew between database servers.
func (c config) trustWindow() time.Duration {
	return c.leaseTimeout - c.safetyMargin - c.clockSkew
}

// defaultHolder names this process: "hostname/pid", cut to maxHolderLength.
func defaultHolder() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	h := fmt.Sprintf("%s/%d", host, os.Getpid())
	return truncateUTF8(h, maxHolderLength)
}
