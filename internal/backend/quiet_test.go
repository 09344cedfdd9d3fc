package backend

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm/logger"
)

// lines is the writer of a gorm logger made by logger.New.
type lines []string

func (l *lines) Printf(format string, args ...any) { *l = append(*l, fmt.Sprintf(format, args...)) }

// fieldsLogger is a logger of a type of its own, used by value, with the
// fields that gorm's has: it keeps the threshold and error of each Trace.
type fieldsLogger struct {
	logger.Interface
	LogLevel      logger.LogLevel
	SlowThreshold time.Duration
	traced        *[]string
}

func (l fieldsLogger) Trace(_ context.Context, _ time.Time, fc func() (string, int64), err error) {
	sql, _ := fc()
	*l.traced = append(*l.traced, fmt.Sprintf("%s threshold=%v err=%v", sql, l.SlowThreshold, err))
}

// bareLogger is a logger without those fields.
type bareLogger struct {
	logger.Interface
	traced *[]string
}

func (l *bareLogger) Trace(_ context.Context, _ time.Time, fc func() (string, int64), err error) {
	sql, _ := fc()
	*l.traced = append(*l.traced, fmt.Sprintf("%s err=%v", sql, err))
}

// A library statement that ran past the slow threshold and failed is
// written by gorm's logger only at Info, as a plain statement; a logger
// with gorm's fields gets it without a threshold and without the error,
// and one without them gets it without the error.
func TestQuietLogger(t *testing.T) {
	ctx := context.Background()
	begin := time.Now().Add(-time.Second)
	fc := func() (string, int64) { return "UPDATE job_lease", -1 }
	failed := errors.New("boom")
	for _, level := range []logger.LogLevel{logger.Silent, logger.Error, logger.Warn} {
		var out lines
		QuietLogger(logger.New(&out, logger.Config{LogLevel: level, SlowThreshold: time.Millisecond})).
			Trace(ctx, begin, fc, failed)
		if len(out) != 0 {
			t.Errorf("gorm's logger at level %d wrote %q", level, out)
		}
	}
	var out lines
	l := logger.New(&out, logger.Config{LogLevel: logger.Info, SlowThreshold: time.Millisecond})
	QuietLogger(l).Trace(ctx, begin, fc, failed)
	if len(out) != 1 || strings.Contains(out[0], "SLOW SQL") || strings.Contains(out[0], "boom") ||
		!strings.Contains(out[0], "UPDATE job_lease") {
		t.Errorf("gorm's logger at Info wrote %q, want the statement alone", out)
	}
	out = nil
	l.Trace(ctx, begin, fc, nil)
	if len(out) != 1 || !strings.Contains(out[0], "SLOW SQL") {
		t.Errorf("the logger itself wrote %q, want it to keep its threshold", out)
	}

	var traced []string
	QuietLogger(fieldsLogger{LogLevel: logger.Info, SlowThreshold: time.Millisecond, traced: &traced}).
		Trace(ctx, begin, fc, failed)
	QuietLogger(fieldsLogger{LogLevel: logger.Warn, SlowThreshold: time.Millisecond, traced: &traced}).
		Trace(ctx, begin, fc, failed)
	QuietLogger(&bareLogger{traced: &traced}).Trace(ctx, begin, fc, failed)
	want := []string{"UPDATE job_lease threshold=0s err=<nil>", "UPDATE job_lease err=<nil>"}
	if fmt.Sprint(traced) != fmt.Sprint(want) {
		t.Errorf("traced %q, want %q", traced, want)
	}
}
