package history

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
)

// The refusal of connections: a worker opened with WorkerConfig.RefuseFile
// dials through refusingDialer, which, while the file exists, connects to
// an address where the kernel refuses the connection. The driver of the
// tests turns the refusal on and off by creating and removing the file,
// and cuts the worker's open connections as it turns it on, so that the
// worker's next statements need new connections, which are refused, as
// they are when the server or a pooler in front of it is down or full.
// Nothing else changes: the drivers are the usual ones, pgx's connection
// included.

// dialFunc dials addr on network, as net.Dialer.DialContext does.
type dialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// refusingDialer returns a dialer that connects to refuseAddr instead of
// the address asked for while the file refuseFile exists.
func refusingDialer(refuseFile, refuseAddr string) dialFunc {
	d := &net.Dialer{KeepAlive: 5 * time.Minute}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if _, err := os.Stat(refuseFile); err == nil {
			addr = refuseAddr
		}
		return d.DialContext(ctx, network, addr)
	}
}

// openRefusing opens dsn, PostgreSQL or MySQL, with dial as the drivers'
// dialer.
func openRefusing(dsn string, dial dialFunc) (*gorm.DB, error) {
	switch {
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "host="):
		cc, err := pgx.ParseConfig(dsn)
		if err != nil {
			return nil, err
		}
		cc.DialFunc = pgconn.DialFunc(dial) // every host's, in a multi-host DSN
		return gorm.Open(postgres.New(postgres.Config{Conn: stdlib.OpenDB(*cc)}), gormConfig())
	case strings.HasPrefix(dsn, "mysql://"):
		mc, err := mysqldriver.ParseDSN(strings.TrimPrefix(dsn, "mysql://"))
		if err != nil {
			return nil, err
		}
		mc.DialFunc = dial
		c, err := mysqldriver.NewConnector(mc)
		if err != nil {
			return nil, err
		}
		return gorm.Open(mysql.New(mysql.Config{Conn: sql.OpenDB(c)}), gormConfig())
	}
	return nil, fmt.Errorf("history: connections can be refused on PostgreSQL and MySQL only, not on %q", dsn)
}
