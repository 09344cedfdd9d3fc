package gormlease

import (
	"context"
	"encoding/json"
	"errors"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/gormlease/gormlease/internal/backend"
)

// ErrNoResult is returned by LoadJSON when no result was saved for the target.
var ErrNoResult = errors.New("gormlease: no result saved")

// SaveJSON is a ready-made saver for Runner.Run: it stores result as JSON in
// the job_result row of the lease's target, with the lease's generation,
// replacing what an earlier one saved. It takes the lease from tx's context,
// as Run and CommitIfOwner set it; elsewhere it returns an error.
func SaveJSON[T any](tx *gorm.DB, result T) error {
	if tx == nil {
		return invalidf("tx is nil")
	}
	v, ok := leaseFrom(tx.Statement.Context)
	if !ok {
		return invalidf("SaveJSON: no lease in the transaction's context: call it as the saver of Run or CommitIfOwner")
	}
	l := v.lease
	b, err := backendFor(tx, v.tables)
	if err != nil {
		return err
	}
	data, err := json.Marshal(result)
	if err != nil {
		return wrapf(err, "encode result of %q", l.TargetID)
	}
	if at := jsonNUL(data); at >= 0 {
		return invalidf("SaveJSON: result of %q has a NUL character (\\u0000 at byte %d of its JSON), which PostgreSQL's jsonb cannot store",
			l.TargetID, at)
	}
	err = tx.Table(v.tables.result).Clauses(clause.OnConflict{
		Columns:   []clause.Column{{Name: "target_id"}},
		DoUpdates: clause.AssignmentColumns([]string{"data", "generation", "updated_at"}),
	}).Create(map[string]any{
		"target_id":  l.TargetID,
		"data":       string(data),
		"generation": l.Generation,
		"updated_at": gorm.Expr(b.Now()),
	}).Error
	return backend.MissingTablesIn(err, v.tables.result)
}

// jsonNUL returns the offset of the first \u0000 escape in the JSON text
// data, or -1. An escape starts at a backslash that is not itself escaped:
// one preceded by an even number of backslashes.
func jsonNUL(data []byte) int {
	const esc = `\u0000`
	for i := 0; i+len(esc) <= len(data); i++ {
		if string(data[i:i+len(esc)]) != esc {
			continue
		}
		n := 0
		for j := i - 1; j >= 0 && data[j] == '\\'; j-- {
			n++
		}
		if n%2 == 0 {
			return i
		}
	}
	return -1
}

// LoadJSON reads the result that SaveJSON stored for targetID, and its row;
// when there is none, its error wraps ErrNoResult. It reads through db as
// any gorm read, which a read/write splitting plugin may send to a lagging
// replica (docs/design.md, section Read replicas).
func LoadJSON[T any](ctx context.Context, db *gorm.DB, targetID string, opts ...TableOption) (T, JobResult, error) {
	var value T
	if db == nil {
		return value, JobResult{}, invalidf("db is nil")
	}
	if err := checkTargetID(targetID); err != nil {
		return value, JobResult{}, err
	}
	cfg, err := newConfig(options(opts))
	if err != nil {
		return value, JobResult{}, err
	}
	var rows []JobResult
	if err := db.WithContext(ctx).Table(cfg.tables.result).Where("target_id = ?", targetID).Limit(1).Find(&rows).Error; err != nil {
		return value, JobResult{}, wrapf(backend.MissingTablesIn(err, cfg.tables.result), "load result of %q", targetID)
	}
	if len(rows) == 0 {
		return value, JobResult{}, wrapf(ErrNoResult, "load result of %q", targetID)
	}
	if err := json.Unmarshal(rows[0].Data, &value); err != nil {
		return value, rows[0], wrapf(err, "decode result of %q", targetID)
	}
	return value, rows[0], nil
}
