package history

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"regexp"
	"strings"

	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
)

// The mutation: a worker opened with WorkerConfig.BreakFence sends the
// fenced commit's statements with their token check taken out, so that a
// worker whose lease was taken over saves over the new holder's row. The
// checker must then report the stale saves. The library is not changed:
// the statements are rewritten on their way to the driver, by a
// database/sql connector that wraps the driver's own.

// fencedToken matches the token check of the statements that record a
// save (the fenced commit's), with the token as a placeholder or, in
// PostgreSQL's one-query BEGIN, a literal (an escape string, E'…').
var fencedToken = regexp.MustCompile(`lease_token = (\$\d+|\?|E?'[0-9a-f-]{36}') AND released_at IS NULL`)

// breakFence returns query with its token check made always true when it is
// a statement that records a save; any other query as it is.
func breakFence(query string) string {
	if !strings.Contains(query, "saved_generation = generation") {
		return query
	}
	return fencedToken.ReplaceAllString(query, "(lease_token = $1 OR 1 = 1) AND released_at IS NULL")
}

// openBroken opens dsn, PostgreSQL or MySQL, through a connector that
// breaks the fence (see breakFence).
func openBroken(dsn string, cfg *gorm.Config) (*gorm.DB, error) {
	switch {
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "host="):
		c, err := stdlib.GetDefaultDriver().(driver.DriverContext).OpenConnector(dsn)
		if err != nil {
			return nil, err
		}
		return gorm.Open(postgres.New(postgres.Config{Conn: sql.OpenDB(&brokenConnector{c})}), cfg)
	case strings.HasPrefix(dsn, "mysql://"):
		mc, err := mysqldriver.ParseDSN(strings.TrimPrefix(dsn, "mysql://"))
		if err != nil {
			return nil, err
		}
		c, err := mysqldriver.NewConnector(mc)
		if err != nil {
			return nil, err
		}
		return gorm.Open(mysql.New(mysql.Config{Conn: sql.OpenDB(&brokenConnector{c})}), cfg)
	}
	return nil, fmt.Errorf("history: the fence can be broken on PostgreSQL and MySQL only, not on %q", dsn)
}

// brokenConnector is a driver.Connector whose connections break the fence.
type brokenConnector struct{ driver.Connector }

func (c *brokenConnector) Connect(ctx context.Context) (driver.Conn, error) {
	dc, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	// The connection does not give pgx's own (it has no Conn method),
	// so that the backend sends every statement through it: on pgx's
	// connection, the fenced commit's BEGIN and save go as one batch
	// that no rewriting here would see. The backend then falls back to
	// what it does on other drivers (the BEGIN and the save as one
	// simple query, polling instead of notifications).
	return &brokenConn{inner: dc}, nil
}

// brokenConn is a driver connection that rewrites each query with
// breakFence and passes everything else on.
type brokenConn struct{ inner driver.Conn }

func (c *brokenConn) Prepare(query string) (driver.Stmt, error) {
	return c.inner.Prepare(breakFence(query))
}

func (c *brokenConn) Close() error { return c.inner.Close() }

func (c *brokenConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}

func (c *brokenConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if b, ok := c.inner.(driver.ConnBeginTx); ok {
		return b.BeginTx(ctx, opts)
	}
	return nil, errors.New("history: the driver has no BeginTx")
}

func (c *brokenConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	if p, ok := c.inner.(driver.ConnPrepareContext); ok {
		return p.PrepareContext(ctx, breakFence(query))
	}
	return c.inner.Prepare(breakFence(query))
}

func (c *brokenConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if e, ok := c.inner.(driver.ExecerContext); ok {
		return e.ExecContext(ctx, breakFence(query), args)
	}
	return nil, driver.ErrSkip
}

func (c *brokenConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if q, ok := c.inner.(driver.QueryerContext); ok {
		return q.QueryContext(ctx, breakFence(query), args)
	}
	return nil, driver.ErrSkip
}

func (c *brokenConn) Ping(ctx context.Context) error {
	if p, ok := c.inner.(driver.Pinger); ok {
		return p.Ping(ctx)
	}
	return nil
}

func (c *brokenConn) ResetSession(ctx context.Context) error {
	if r, ok := c.inner.(driver.SessionResetter); ok {
		return r.ResetSession(ctx)
	}
	return nil
}

func (c *brokenConn) IsValid() bool {
	if v, ok := c.inner.(driver.Validator); ok {
		return v.IsValid()
	}
	return true
}

func (c *brokenConn) CheckNamedValue(nv *driver.NamedValue) error {
	if ch, ok := c.inner.(driver.NamedValueChecker); ok {
		return ch.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}
