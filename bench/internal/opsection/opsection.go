// Package opsection keeps the marked sections of the benchmark's Markdown
// files: the operations section of docs/performance.md, the block that the
// opsbench command writes between two markers, and that the bench command
// carries over when it rewrites the rest of the file, so that running either
// command never loses the other's figures; and the capacity section of
// docs/scaling.md, which the capacity command writes (see Section).
package opsection

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Begin and End mark the operations section. Each stands on a line of its
// own; the section is the text between them.
const (
	Begin = "<!-- operations:begin -->"
	End   = "<!-- operations:end -->"
)

// Section is a block of a Markdown file between two markers, each on a
// line of its own.
type Section struct{ Begin, End string }

// Operations is the operations section of docs/performance.md, Roles its
// roles section (the rolebench command's), Holding its holding section
// (the bench command's -sections holding, with -holding-out), Notes its
// sections written by hand from go test's benchmarks and short
// measurements, which no command writes, and Capacity the capacity
// section of docs/scaling.md.
var (
	Operations = Section{Begin, End}
	Roles      = Section{"<!-- roles:begin -->", "<!-- roles:end -->"}
	Holding    = Section{"<!-- holding:begin -->", "<!-- holding:end -->"}
	Notes      = Section{"<!-- notes:begin -->", "<!-- notes:end -->"}
	Capacity   = Section{"<!-- capacity:begin -->", "<!-- capacity:end -->"}
)

// carried are the sections of docs/performance.md that other commands, or
// people, write, which Carry keeps.
var carried = []Section{Operations, Roles, Holding, Notes}

// Wrap returns section between the markers, as a block that Find finds.
func Wrap(section string) string { return Operations.Wrap(section) }

// Find returns the operations block of doc: see Section.Find.
func Find(doc string) (block string, ok bool, err error) { return Operations.Find(doc) }

// Put returns doc with its operations block replaced: see Section.Put.
func Put(doc, block string) (string, error) { return Operations.Put(doc, block) }

// Wrap returns section between s's markers, as a block that Find finds.
func (s Section) Wrap(section string) string {
	return s.Begin + "\n" + strings.TrimSpace(section) + "\n" + s.End + "\n"
}

// Find returns the block of doc that s marks, markers included, and whether doc
// has one. It returns an error when the markers are out of order or not
// one of each, rather than guess where the section ends.
func (s Section) Find(doc string) (block string, ok bool, err error) {
	begin, end, ok, err := s.bounds(doc)
	if !ok || err != nil {
		return "", ok, err
	}
	return doc[begin:end] + "\n", true, nil
}

// Put returns doc with the block that s marks replaced by block, or with block
// appended after a blank line when doc has none.
func (s Section) Put(doc, block string) (string, error) {
	begin, end, ok, err := s.bounds(doc)
	switch {
	case err != nil:
		return "", err
	case ok:
		rest := strings.TrimPrefix(doc[end:], "\n")
		return doc[:begin] + block + rest, nil
	case strings.TrimSpace(doc) == "":
		return block, nil
	default:
		return strings.TrimRight(doc, "\n") + "\n\n" + block, nil
	}
}

// PutIn returns the file at path, read, with section as the block that s
// marks (see Put): with "" as section, it checks the file's markers.
func (s Section) PutIn(path, section string) (string, error) {
	old, err := Read(path)
	if err != nil {
		return "", err
	}
	doc, err := s.Put(old, s.Wrap(section))
	if err != nil {
		return "", fmt.Errorf("-out %s: %w", path, err)
	}
	return doc, nil
}

// Carry returns fresh with the marked blocks of old (the operations
// section, the roles section, the holding section, then the notes) at its end, or fresh alone when old has
// none: what a command that rewrites the rest of the file writes in place
// of old.
func Carry(old, fresh string) (string, error) {
	for _, s := range carried {
		block, ok, err := s.Find(old)
		if err != nil {
			return fresh, err
		}
		if !ok {
			continue
		}
		if fresh, err = s.Put(fresh, block); err != nil {
			return fresh, err
		}
	}
	return fresh, nil
}

// bounds returns where the block of doc that s marks begins and where its
// End marker ends.
func (s Section) bounds(doc string) (begin, end int, ok bool, err error) {
	nb, ne := strings.Count(doc, s.Begin), strings.Count(doc, s.End)
	if nb == 0 && ne == 0 {
		return 0, 0, false, nil
	}
	begin, end = strings.Index(doc, s.Begin), strings.Index(doc, s.End)
	if nb != 1 || ne != 1 || end < begin {
		return 0, 0, false, fmt.Errorf("marked section: want one %s followed by one %s, found %d and %d", s.Begin, s.End, nb, ne)
	}
	return begin, end + len(s.End), true, nil
}

// Read returns the contents of the file at path, or "" when there is none.
func Read(path string) (string, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	return string(data), err
}

// Write replaces the file at path with doc: it writes a temporary file
// beside it and renames it over path, so that a failed write leaves the
// old file whole.
func Write(path, doc string) error {
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // fails once renamed
	if _, err := f.WriteString(doc); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
