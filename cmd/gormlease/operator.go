package main

import (
	"fmt"
	"os"
	"os/user"
	"strings"
	"unicode/utf8"
)

// operatorEnv is the environment variable that names the operator when
// -as does not.
const operatorEnv = "GORMLEASE_OPERATOR"

// maxOperatorLength is the longest operator name, in bytes: the columns
// that record it hold 255.
const maxOperatorLength = 255

// resolveOperator sets c.operator: -as, $GORMLEASE_OPERATOR, or the user
// and host that run the command; a name that cannot be recorded is bad
// usage.
func (c *command) resolveOperator() error {
	from := "-as"
	name := c.as
	if !c.flagSet("as") {
		from = "$" + operatorEnv
		name = c.env.getenv(operatorEnv)
		if name == "" {
			c.operator = defaultOperator()
			return nil
		}
	}
	if problem := checkOperator(name); problem != "" {
		return usagef("%s %q: the operator's name %s: give 1 to %d bytes of UTF-8 without NUL", from, name, problem, maxOperatorLength)
	}
	c.operator = name
	return nil
}

// checkOperator says what is wrong with name as an operator's name, or
// returns "" when it can be recorded.
func checkOperator(name string) string {
	switch {
	case name == "":
		return "is empty"
	case len(name) > maxOperatorLength:
		return fmt.Sprintf("is %d bytes long", len(name))
	case !utf8.ValidString(name):
		return "is not valid UTF-8"
	case strings.ContainsRune(name, 0):
		return "has a NUL byte"
	}
	return ""
}

// defaultOperator is the operator's name without -as or
// $GORMLEASE_OPERATOR: USER@HOST of this process ($USER, or "unknown",
// where the user has no name; the host's name without its domain).
func defaultOperator() string {
	name := os.Getenv("USER")
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	if name == "" {
		name = "unknown"
	}
	if host, err := os.Hostname(); err == nil && host != "" {
		host, _, _ = strings.Cut(host, ".")
		name += "@" + host
	}
	name = strings.ToValidUTF8(strings.ReplaceAll(name, "\x00", ""), "?")
	for len(name) > maxOperatorLength {
		_, size := utf8.DecodeLastRuneInString(name)
		name = name[:len(name)-size]
	}
	return name
}
