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
	// DefaultHeartbeatInterval is how often a Runner renews its leases,
	// unless WithHeartbeatInterval or WithLeaseTimeout says otherwise. An
	// operator's stop (admin.Operator.RequestStop) reaches the work at the
	// next heartbeat: within this interval. One Runner's leases share one
	// statement per interval per 1,000 leases (two on MySQL and MariaDB):
	// 2 statements a second for 10,000 leases (docs/guide.md, "Choosing
	// the timings").
	DefaultHeartbeatInterval = 5 * time.Second

	// DefaultLeaseTimeout is how long a lease lives without a heartbeat,
	// unless WithLeaseTimeout or WithHeartbeatInterval says otherwise: the
	// target of a holder that crashed is free again 15 to 20 s after the
	// crash. Its holder, cut off from the database, keeps its work running
	// for up to the timeout less the safety margin (18 s) after its last
	// heartbeat: a failover or a pause of up to about 13 s costs no lease
	// (less when the heartbeat's statement hangs: it is sent again when
	// the operation timeout ends it).
	DefaultLeaseTimeout = 20 * time.Second

	// DefaultOperationTimeout bounds each database call of a Runner, unless
	// WithOperationTimeout says otherwise or the lease timeout is shorter.
	DefaultOperationTimeout = 10 * time.Second

	// MaxSlots is the largest count that WithSlots and Repository.AcquireSlot
	// accept.
	MaxSlots = backend.MaxSlots

	// defaultSafetyMarginDivisor sets the default safety margin to the lease
	// timeout divided by this number (2 s for the default 20 s timeout).
	defaultSafetyMarginDivisor = 10

	// defaultTimeoutPerInterval is the ratio of the default lease timeout
	// to the default heartbeat interval: when only one of the two is
	// given, the other is derived from it at this ratio.
	defaultTimeoutPerInterval = DefaultLeaseTimeout / DefaultHeartbeatInterval
)

// An Option configures a Runner: NewRunner takes every option of this
// package, validates them together, and names the option at fault. Passing
// an option to a function that cannot use it does not compile.
type Option interface {
	apply(*config)
}

// A RepositoryOption is an Option that NewRepository takes too: WithHolder,
// WithTableNames and WithStatementAttempts.
type RepositoryOption interface {
	Option
	isRepositoryOption()
}

// A TableOption is a RepositoryOption that AutoMigrate and LoadJSON take
// too: WithTableNames.
type TableOption interface {
	RepositoryOption
	MigrateOption
	isTableOption()
}

// A MigrateOption configures AutoMigrate: every TableOption, and
// WithHistory, which only AutoMigrate takes.
type MigrateOption interface {
	applyMigrate(*migrateConfig)
}

// migrateConfig is what AutoMigrate's options set.
type migrateConfig struct {
	tables  []Option // the TableOptions, for newConfig
	history bool
}

// historyOption is WithHistory.
type historyOption struct{}

func (historyOption) applyMigrate(m *migrateConfig) { m.history = true }

// WithHistory makes AutoMigrate keep a history of each target: it creates
// the event table (the lease table's name with "_event" appended) and the
// triggers on the lease table that write an event, in the transaction of
// the change, for each acquisition, each end of a generation, each fenced
// save and each operator action (on PostgreSQL an acquisition may stay
// pending in the lease row until the row's next event: docs/design.md,
// section History). Whether
// a table keeps history is the schema's, so every process that uses the
// table records events whatever its own options. AutoMigrate without it
// leaves an existing history as it is: docs/operating.md says how to turn
// history off.
func WithHistory() MigrateOption { return historyOption{} }

// option is an Option that only a Runner uses.
type option func(*config)

func (o option) apply(c *config) { o(c) }

// repositoryOption is an option that a Repository uses too.
type repositoryOption func(*config)

func (o repositoryOption) apply(c *config)   { o(c) }
func (repositoryOption) isRepositoryOption() {}

// tableOption is an option that names the tables.
type tableOption func(*config)

func (o tableOption) apply(c *config)               { o(c) }
func (o tableOption) applyMigrate(m *migrateConfig) { m.tables = append(m.tables, o) }
func (tableOption) isRepositoryOption()             {}
func (tableOption) isTableOption()                  {}

// options returns opts as Options, for newConfig.
func options[O Option](opts []O) []Option {
	all := make([]Option, len(opts))
	for i, o := range opts {
		all[i] = o
	}
	return all
}

// WithHeartbeatInterval sets how often the Runner renews its leases. It must
// be greater than zero, and at most half the lease timeout. Given without
// WithLeaseTimeout, it sets the lease timeout to four times d. The default
// is DefaultHeartbeatInterval, or a quarter of a lease timeout given alone.
func WithHeartbeatInterval(d time.Duration) Option {
	return option(func(c *config) { c.heartbeatInterval = d; c.heartbeatIntervalSet = true })
}

// WithLeaseTimeout sets how long the Runner's leases live without a
// heartbeat. Each lease records it in its row, and every acquire judges the
// lease by it: the holder's timeout decides, not the acquirer's. It must be
// at least twice the heartbeat interval; given alone, it sets the interval
// to a quarter of d. The defaults of the safety margin, the operation
// timeout and the reconnect window follow it. The default is
// DefaultLeaseTimeout.
func WithLeaseTimeout(d time.Duration) Option {
	return option(func(c *config) { c.leaseTimeout = d; c.leaseTimeoutSet = true })
}

// WithSafetyMargin sets how long before the lease timeout the Runner stops
// trusting a lease that it could not confirm: it cancels the work with
// ErrLeaseLost once no heartbeat has succeeded for lease timeout minus this
// margin, counted from when the last successful one was sent. It must be
// greater than zero, and interval + margin less than the lease timeout. The
// default is a tenth of the lease timeout.
func WithSafetyMargin(d time.Duration) Option {
	return option(func(c *config) { c.safetyMargin = d; c.safetyMarginSet = true })
}

// WithClockSkew declares the largest difference between the clocks of the
// database servers that judge the leases (the nodes of a Galera cluster):
// the Runner stops trusting a lease that it could not confirm d earlier. It
// must be >= 0, and interval + margin + d less than the lease timeout. The
// default is 0: one server, one clock (docs/design.md, section Clocks).
func WithClockSkew(d time.Duration) Option {
	return option(func(c *config) { c.clockSkew = d })
}

// WithOperationTimeout bounds each database call of the Runner: each attempt
// of the acquire, each heartbeat, each fenced commit with the saver inside
// it (a saver that runs past it is rolled back, and committed again as after
// a failover), and each attempt of the release. It must be greater than
// zero. The default is DefaultOperationTimeout, or a shorter lease timeout.
func WithOperationTimeout(d time.Duration) Option {
	return option(func(c *config) { c.operationTimeout = d; c.operationTimeoutSet = true })
}

// WithReconnectWindow bounds how long a Run keeps trying while the database
// cannot be reached (a failover, a restart): its acquire, until d after the
// Run began, and its fenced commit, until d after the commit failed. Set it
// to the longest failover that Runs should ride through; the lease timeout
// should outlast it too. It must be > 0 and at most the lease timeout; the
// default is the operation timeout.
func WithReconnectWindow(d time.Duration) Option {
	return option(func(c *config) { c.reconnectWindow = d; c.reconnectWindowSet = true })
}

// WithHolder sets the name that the Runner's, or the Repository's, lease
// rows show as their holder: 1 to 255 bytes of UTF-8, without NUL. The
// default is "hostname/pid".
func WithHolder(name string) RepositoryOption {
	return repositoryOption(func(c *config) { c.holder = name })
}

// WithHeartbeatDB sends the Runner's heartbeats through db, a second, small
// pool on the same database (from gorm.Open, not inside a transaction), so
// that a heartbeat never waits for a connection behind the application's own
// queries. Acquire, commit and release still use the Runner's database.
func WithHeartbeatDB(db *gorm.DB) Option {
	return option(func(c *config) { c.heartbeatDB = db; c.heartbeatDBSet = true })
}

// WithReuseFor makes Runner.Do return, through load and as shared, the
// target's last result when it was saved less than d ago on the database's
// clock, without running the work: a repeated request (a second click, a
// retry) gets the first one's answer. It must be >= 0; 0, the default, turns
// it off. Run and RunWait ignore it.
func WithReuseFor(d time.Duration) Option {
	return option(func(c *config) { c.reuseFor = d })
}

// WithLogger makes the Runner log its lifecycle to logger, at levels that
// say what the reader must do: Debug for normal outcomes, Info for an
// operator's request carried out, Warn where gormlease protected the caller,
// Error where a person must look (docs/design.md, section Logging). The
// default, like a nil logger, logs nothing.
func WithLogger(logger *slog.Logger) Option {
	return option(func(c *config) { c.logger = logger })
}

// WithObserver makes the Runner report its steps and outcomes to o, for
// metrics and traces (package observe; module gormlease/otel implements it
// with OpenTelemetry). The default, like a nil o, costs nothing.
func WithObserver(o observe.Observer) Option {
	return option(func(c *config) { c.observer = o })
}

// WithMaxHold bounds how long a Run's work may hold the lease: work still
// running d after the lease was acquired is cancelled, with
// ErrMaxHoldExceeded, and its result is not saved, even if it returns one.
// It must be greater than zero. By default the work runs for as long as it
// keeps its lease.
func WithMaxHold(d time.Duration) Option {
	return option(func(c *config) { c.maxHold = d; c.maxHoldSet = true })
}

// WithMinHold keeps a target held, unrenewed, until d after its acquire was
// sent, even when the work ended sooner, failed or not, so that a pod whose
// timer fires a moment later is refused rather than running the job again
// (ShedLock's lockAtLeastFor; see Repository.Hold). Run does not sleep for
// it. Do refuses a Runner with it. It must be greater than zero.
func WithMinHold(d time.Duration) Option {
	return option(func(c *config) { c.minHold = d; c.minHoldSet = true })
}

// WithSlots makes each target of the Runner a semaphore of n slots: up to n
// Runs, of any process, hold it at once, each under a lease of its own
// (Lease.Slot). Run is refused only when all n are held, with the *HeldError
// of the slot that frees first; RunWait waits for a free one; Do and
// NewElector refuse n above 1. n is from 1 to MaxSlots; 1, the default, is
// an ordinary lease. The slot rows record n, and while slots are held under
// one n, a Runner with another is refused (ErrSlotCountConflict): give every
// Runner of a target the same n (docs/design.md, section "Slots: n at a
// time").
func WithSlots(n int) Option {
	return option(func(c *config) { c.slots = n; c.slotsSet = true })
}

// defaultStatementAttempts is how often a statement that meets a
// serialization failure or a deadlock is tried in all, unless
// WithStatementAttempts says otherwise.
const defaultStatementAttempts = backend.StatementAttempts

// maxStatementAttempts bounds WithStatementAttempts.
const maxStatementAttempts = 100

// WithStatementAttempts sets how often a single statement of the lease (an
// acquire, a heartbeat, a release, the making of slot rows) is tried in all
// when it fails with a serialization failure or a deadlock. After the last,
// an acquire is refused with ErrLeaseHeld, and a heartbeat or release whose
// row still holds the lease returns an error that wraps the failure. n is
// from 1 to 100; the default is 5.
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
		attempts:          defaultStatementAttempts,
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
	case c.attempts < 1 || c.attempts > maxStatementAttempts:
		return invalidf("WithStatementAttempts: n must be between 1 and %d, got %d", maxStatementAttempts, c.attempts)
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
