package backend

import (
	"context"
	"reflect"
	"sync"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// The library's own statements reach the application's gorm logger as
// statements at logger.Info, and only there: never as a slow statement
// (waiting for a row lock under contention is how a lease works) nor as an
// error (a refusal or a lost lease is an answer, and a fault is reported to
// the Runner's slog logger and observer). A gorm logger cannot be asked its
// level, so quiet reads it, and its slow threshold, from the fields that
// gorm's own logger (logger.New, logger.Default) has and that most loggers
// made for gorm copy: LogLevel and SlowThreshold. A logger without them gets
// each statement with no error and decides by itself.

// QuietLogger returns l for the library's own statements: Trace reports a
// statement only when l is at logger.Info, never as slow nor as an error;
// the other methods are l's.
func QuietLogger(l logger.Interface) logger.Interface {
	if l == nil {
		return nil
	}
	if q, ok := l.(quietLogger); ok {
		return q
	}
	return quietLogger{l}
}

// Quiet returns db, whose statements are reported as the library's own
// (see QuietLogger): for a statement of the library's that gorm builds.
func Quiet(db *gorm.DB) *gorm.DB {
	if db.Logger == nil {
		return db
	}
	return db.Session(&gorm.Session{Logger: QuietLogger(db.Logger)})
}

type quietLogger struct{ logger.Interface }

func (q quietLogger) LogMode(level logger.LogLevel) logger.Interface {
	return quietLogger{q.Interface.LogMode(level)}
}

func (q quietLogger) Trace(ctx context.Context, begin time.Time, fc func() (string, int64), _ error) {
	l, ok := atInfo(q.Interface)
	if !ok {
		return
	}
	l.Trace(ctx, begin, fc, nil)
}

// loggerFields is where a logger type keeps its level and slow threshold:
// the index paths of its LogLevel and SlowThreshold fields, nil for a field
// it does not have (and for a threshold that a copy of the logger would
// share with it, behind an embedded pointer).
type loggerFields struct {
	level, slow []int
}

var (
	fieldsOf     sync.Map // reflect.Type of a logger's struct → loggerFields
	levelType    = reflect.TypeFor[logger.LogLevel]()
	durationType = reflect.TypeFor[time.Duration]()
)

// fields returns where t, a struct type, keeps its level and slow
// threshold.
func fields(t reflect.Type) loggerFields {
	if f, ok := fieldsOf.Load(t); ok {
		return f.(loggerFields)
	}
	var f loggerFields
	if sf, ok := t.FieldByName("LogLevel"); ok && sf.Type == levelType {
		f.level = sf.Index
	}
	if sf, ok := t.FieldByName("SlowThreshold"); ok && sf.Type == durationType && sf.IsExported() &&
		!throughPointer(t, sf.Index) {
		f.slow = sf.Index
	}
	fieldsOf.Store(t, f)
	return f
}

// throughPointer reports whether the field at index in t is reached through
// an embedded pointer.
func throughPointer(t reflect.Type, index []int) bool {
	for _, i := range index[:len(index)-1] {
		t = t.Field(i).Type
		if t.Kind() == reflect.Pointer {
			return true
		}
	}
	return false
}

// atInfo returns l, or a copy of l without a slow threshold, and reports
// whether l writes statements at all: false when it has a level below
// logger.Info.
func atInfo(l logger.Interface) (logger.Interface, bool) {
	v := reflect.ValueOf(l)
	s := v
	if s.Kind() == reflect.Pointer && !s.IsNil() {
		s = s.Elem()
	}
	if s.Kind() != reflect.Struct {
		return l, true
	}
	f := fields(s.Type())
	if f.level != nil {
		level, err := s.FieldByIndexErr(f.level)
		if err == nil && logger.LogLevel(level.Int()) < logger.Info {
			return l, false
		}
	}
	if f.slow == nil || s.FieldByIndex(f.slow).Int() == 0 {
		return l, true
	}
	c := reflect.New(s.Type())
	c.Elem().Set(s)
	slow := c.Elem().FieldByIndex(f.slow)
	if !slow.CanSet() {
		return l, true
	}
	slow.SetInt(0)
	if v.Kind() != reflect.Pointer {
		c = c.Elem()
	}
	if q, ok := c.Interface().(logger.Interface); ok {
		return q, true
	}
	return l, true
}
