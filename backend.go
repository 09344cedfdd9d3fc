package gormlease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"

	"gorm.io/gorm"

	"github.com/gormlease/gormlease/internal/backend"
	"github.com/gormlease/gormlease/internal/backend/choose"
	"github.com/gormlease/gormlease/internal/wait"
)

// backendFor picks the backend for db's gorm dialector, with its statements
// written for the tables t.
func backendFor(db *gorm.DB, t tableNames) (backend.Backend, error) {
	if db.Dialector == nil {
		return nil, invalidf("db has no dialector: open it with gorm.Open")
	}
	name := db.Dialector.Name()
	b, ok := choose.For(name, backend.Tables{Lease: t.lease, Result: t.result})
	if !ok {
		return nil, fmt.Errorf(prefix+"unsupported database %q: supported are postgres, mysql and sqlite", name)
	}
	return b, nil
}

// checkSettings runs b's settings check on db; a setting to change is an
// invalid argument.
func checkSettings(ctx context.Context, b backend.Backend, db *gorm.DB) error {
	err := b.CheckSettings(ctx, db)
	var bad *backend.SettingsError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &bad):
		return invalidf("%s", bad.Problem)
	}
	return wrapf(err, "check the connection's settings")
}

// warnSettings logs at Warn, to logger, each of the server's settings that
// b finds weakening a guarantee (see backend.Backend.SettingsWarnings),
// with the setting and its value as attributes. Without a logger it does
// not ask the server.
func warnSettings(ctx context.Context, b backend.Backend, db *gorm.DB, logger *slog.Logger) {
	if logger == nil || !logger.Enabled(ctx, slog.LevelWarn) {
		return
	}
	for _, w := range b.SettingsWarnings(ctx, db) {
		logger.LogAttrs(ctx, slog.LevelWarn, w.Message, slog.String("setting", w.Setting), slog.String("value", w.Value))
	}
}

// newWaitKey returns the key of r's watches: waiters share a watch when
// they read the same table on the same pool and report to the same gorm
// logger. A pool or logger that cannot be a map key is replaced by r, whose
// waiters then share watches only among themselves.
func (r *Repository) newWaitKey() wait.Key {
	k := wait.Key{Pool: r.db.ConnPool, Logger: r.db.Logger, Table: r.tables.lease}
	if t := reflect.TypeOf(k.Pool); t == nil || !t.Comparable() {
		k.Pool = r
	}
	if t := reflect.TypeOf(k.Logger); t != nil && !t.Comparable() {
		k.Logger = r
	}
	return k
}

// waitSource is what r's watches read rows through.
func (r *Repository) waitSource() wait.Source { return wait.Source{Backend: r.backend, DB: r.db} }
