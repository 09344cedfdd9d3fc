package gormlease

import (
	"context"
	"encoding/json"
	"errors"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// ErrNoResult is returned by LoadJSON when no result was saved for the target.
var ErrNoResult = errors.New("gormlease: no result saved")

// SaveJSON is a ready-made saver for Runner.Run: it stores result as JSON in
// the job_result row of the lease's target, with the lease's generation,
// replacing what an earlier generation saved. It takes the lease
// from the context of tx, which Run and CommitIfOwner set; outside them it
// returns an error. Pass it to Run as gormlease.SaveJSON[T].
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
	return tx.Table(v.tables.result).Clauses(clause.OnConflict{
		Columns:   []clause.Column{{Name: "target_id"}},
		DoUpdates: clause.AssignmentColumns([]string{"data", "generation", "updated_at"}),
	}).Create(map[string]any{
		"target_id":  l.TargetID,
		"data":       string(data),
		"generation": l.Generation,
		"updated_at": gorm.Expr(b.Now()),
	}).Error
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

// LoadJSON reads the result that SaveJSON stored for targetID and decodes it
// into a T. It also returns the row, for its generation and time. When
// nothing was saved it returns an error wrapping ErrNoResult. Its one
// option is WithTableNames, for a result table of another name. It reads
// through db as any gorm read, so a read/write splitting plugin may send it
// to a replica that has not seen the latest save yet; with
// gorm.io/plugin/dbresolver, pass db.Clauses(dbresolver.Write) to read the
// primary. (Runner.Do calls its load in a transaction, which such plugins
// send to the primary.)
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
		return value, JobResult{}, wrapf(err, "load result of %q", targetID)
	}
	if len(rows) == 0 {
		return value, JobResult{}, wrapf(ErrNoResult, "load result of %q", targetID)
	}
	if err := json.Unmarshal(rows[0].Data, &value); err != nil {
		return value, rows[0], wrapf(err, "decode result of %q", targetID)
	}
	return value, rows[0], nil
}
