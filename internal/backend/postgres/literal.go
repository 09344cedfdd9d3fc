package postgres

import (
	"errors"
	"strings"
	"unicode/utf8"
)

// A query sent through the simple protocol takes no parameters, so the
// values of the statements that go that way (the fenced commit's one-trip
// BEGIN, the heartbeat, the settling read; see simpleQuery) are written
// into its text, by literal and literalText alone: nothing else in
// gormlease escapes a value into SQL.
//
// The literal is an escape string constant, E'...', in which a backslash
// is escaped by a backslash and a single quote is doubled (never \', which
// the server refuses when backslash_quote is off). It reads the same
// whatever standard_conforming_strings and backslash_quote say, and in UTF-8, the client encoding of
// pgx and lib/pq, neither byte occurs inside a multi-byte character; every
// other byte, control characters (0x1f, the slot keys' separator) and
// non-ASCII characters included, stands for itself. A NUL byte cannot be
// in a PostgreSQL string at all, and text that is not valid UTF-8 is
// refused by the server: literal refuses both, naming the problem.

// errNUL and errNotUTF8 are literal's refusals.
var (
	errNUL     = errors.New("a NUL byte cannot be written into an SQL literal")
	errNotUTF8 = errors.New("text that is not valid UTF-8 cannot be written into an SQL literal")
)

// checkLiteral returns the error of literal for s, or nil.
func checkLiteral(s string) error {
	switch {
	case strings.IndexByte(s, 0) >= 0:
		return errNUL
	case !utf8.ValidString(s):
		return errNotUTF8
	}
	return nil
}

// literal returns s as an escape string literal, E'...', for the text of a
// query without parameters. It returns an error, and no text, when s holds
// a NUL byte or is not valid UTF-8.
func literal(s string) (string, error) {
	if err := checkLiteral(s); err != nil {
		return "", err
	}
	var b strings.Builder
	b.Grow(len(s) + len("E''") + 2)
	b.WriteString("E'")
	literalText{&b}.WriteString(s)
	b.WriteByte('\'')
	return b.String(), nil
}

// literalText writes to b the text inside an escape string literal: each
// byte written to it as itself, a backslash escaped by a backslash, a
// single quote doubled. What it is given must have passed checkLiteral.
type literalText struct{ b *strings.Builder }

// WriteByte writes c, escaped.
func (t literalText) WriteByte(c byte) error {
	if c == '\\' || c == '\'' {
		t.b.WriteByte(c)
	}
	return t.b.WriteByte(c)
}

// WriteString writes s, escaped.
func (t literalText) WriteString(s string) {
	plain := 0 // s[plain:i] needs no escape
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' || s[i] == '\'' {
			t.b.WriteString(s[plain:i])
			t.b.WriteByte(s[i])
			plain = i
		}
	}
	t.b.WriteString(s[plain:])
}

// writeElement writes s to w as a quoted element of an array literal:
// between double quotes, with each backslash and double quote escaped by a
// backslash. On a literalText, the element is written inside an escape
// string literal, escaped for both.
func writeElement[W interface{ WriteByte(byte) error }](w W, s string) {
	_ = w.WriteByte('"')
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' || s[i] == '"' {
			_ = w.WriteByte('\\')
		}
		_ = w.WriteByte(s[i])
	}
	_ = w.WriteByte('"')
}
