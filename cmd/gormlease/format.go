package main

import (
	"fmt"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/gormlease/gormlease/admin"
)

// short writes d rounded for a table: to the millisecond under a second,
// to the hundredth of a second under ten seconds (1.5s, not 2s).
func short(d time.Duration) string {
	switch {
	case d < 0:
		return "-" + short(-d)
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < 10*time.Second:
		return d.Round(10 * time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	}
	return d.Round(time.Minute).String()
}

// state is li's state for a table: a minimum hold says so.
func state(li admin.LeaseInfo) string {
	s := string(li.State)
	if li.MinHold {
		s += " (min hold)"
	}
	if li.StopRequested {
		s += ", stop requested" + by(li.StopBy)
	}
	if li.Paused {
		s += ", paused" + by(li.PausedBy)
	}
	return s
}

// holdEnd is when the minimum hold of li, a row that it kept, ended or
// ends: its last stamp plus the timeout the hold recorded.
func holdEnd(li admin.LeaseInfo) time.Time { return li.Row.UpdatedAt.Add(li.Timeout) }

func expiresIn(li admin.LeaseInfo) string {
	switch {
	case li.State == admin.StateReleased:
		return "-"
	case li.Row.TimeoutMS == nil:
		return "unknown"
	case li.ExpiresIn < 0:
		return "expired " + short(-li.ExpiresIn) + " ago"
	}
	return short(li.ExpiresIn)
}

func timeout(li admin.LeaseInfo) string {
	if li.Row.TimeoutMS == nil {
		return "unknown"
	}
	return short(li.Timeout)
}

func optInt(v *int64) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprint(*v)
}

// by is " by NAME" for the operator name, or "".
func by(name string) string {
	if name == "" {
		return ""
	}
	return " by " + name
}

// heldFor returns how long li's lease has been held, since its
// acquisition, on the database's clock (LeaseInfo.HeldFor), and false for
// a lease released or a row that does not record its acquisition.
func heldFor(li admin.LeaseInfo) (time.Duration, bool) {
	if li.State == admin.StateReleased || li.Row.AcquiredAt == nil {
		return 0, false
	}
	return li.HeldFor, true
}

// heldForText is heldFor for a table: "-" when unknown or released.
func heldForText(li admin.LeaseInfo) string {
	if d, ok := heldFor(li); ok {
		return short(d)
	}
	return "-"
}

// capitalize returns s with its first letter in upper case, to begin a
// sentence.
func capitalize(s string) string {
	r, size := utf8.DecodeRuneInString(s)
	return string(unicode.ToUpper(r)) + s[size:]
}

// deref is *s, or "" for nil.
func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
